"""Conversion benchmark (issue 2): converter images/s vs the pure decode rate, sizes, memory.

Measures, on one generated folder of natural-looking JPEGs, side by side in one run:

- the pure decode(+resize) rate of the same images with the same number of processes
  (the ceiling a converter can reach: it must decode every image);
- ``h5pack convert`` images/s per mode and codec with 1 and 2 workers, as a ratio of that
  ceiling;
- file size and compression ratio per codec;
- peak memory (parent and largest worker) of a default conversion as the folder grows 4x.

Usage::

    python scripts/bench_convert.py bench-data/jpeg2000 --make 2000 --repeats 3

Prints markdown tables (for BENCHMARKS.md) and writes ``--json`` if given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from h5pack.core.decode import decode_image, load_file, resize_image
from h5pack.core.layout import Compression
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions
from h5pack.write.scan import scan

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None

VARIANTS: dict[str, dict[str, Any]] = {
    "default (auto)": {},
    "raw gzip-4": {"mode": "raw", "compression": Compression(codec="gzip")},
    "raw lzf": {"mode": "raw", "compression": Compression(codec="lzf")},
    "raw lz4": {"mode": "raw", "compression": Compression(codec="lz4")},
    "raw zstd-3": {"mode": "raw", "compression": Compression(codec="zstd")},
    "raw blosc-lz4 bit": {
        "mode": "raw",
        "compression": Compression(codec="blosc-lz4", shuffle="bit"),
    },
    "raw blosc-zstd bit": {
        "mode": "raw",
        "compression": Compression(codec="blosc-zstd", shuffle="bit"),
    },
    "raw contiguous": {"mode": "raw", "layout": "contiguous"},
    "raw 256x256": {"mode": "raw", "size": (256, 256)},
    "raw 256x256 gzip-4": {
        "mode": "raw",
        "size": (256, 256),
        "compression": Compression(codec="gzip"),
    },
    "encoded": {"mode": "encoded"},
}


def _decode_batch(paths: list[str], size: tuple[int, int] | None, sink: str | None) -> int:
    out = open(f"{sink}.{os.getpid()}", "ab") if sink else None  # noqa: SIM115
    for path in paths:
        image = decode_image(load_file(Path(path)), name=path)
        if size is not None:
            image = resize_image(image, size)
        if out is not None:
            out.write(image.data)
    if out is not None:
        out.close()
    return len(paths)


def decode_rate(
    paths: list[str], workers: int, size: tuple[int, int] | None, sink: Path | None = None
) -> float:
    """Return images/s of decoding (and resizing) ``paths`` with ``workers`` processes.

    With ``sink``, every decoded image's pixels are also appended to a plain file per
    process: the floor of any converter that stores raw pixels on this storage.
    """
    batches = [paths[i : i + 32] for i in range(0, len(paths), 32)]
    where = str(sink) if sink else None
    os.sync()
    start = time.perf_counter()
    if workers == 1:
        done = sum(_decode_batch(batch, size, where) for batch in batches)
    else:
        with ProcessPoolExecutor(workers) as pool:
            done = sum(pool.map(_decode_batch, batches, [size] * len(batches),
                                [where] * len(batches)))
    rate = done / (time.perf_counter() - start)
    if sink is not None:
        for leftover in sink.parent.glob(sink.name + ".*"):
            leftover.unlink()
    return rate


def convert_once(source: Path, options: ConvertOptions, workdir: Path) -> dict[str, Any]:
    """Convert ``source`` once; return images/s and sizes."""
    target = workdir / "bench.h5"
    target.unlink(missing_ok=True)  # replacing a file makes ext4 flush the new one first
    os.sync()  # the previous run's dirty pages are not this run's cost
    start = time.perf_counter()
    report = convert(source, target, options, overwrite=True)
    elapsed = time.perf_counter() - start
    from h5pack.check import pack_info

    info = pack_info(target)
    return {
        "images_per_s": report.num_samples / elapsed,
        "file_bytes": target.stat().st_size,
        "ratio": info.compression_ratio,
        "mode": info.mode,
        "storage": info.storage,
    }


MEMORY_PROBE = """
import resource, sys, json
from h5pack.write.options import ConvertOptions
from h5pack.write.convert import convert

convert(sys.argv[1], sys.argv[2], ConvertOptions(workers=int(sys.argv[3])), overwrite=True)
print(json.dumps({
    "parent_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "largest_worker_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}))
"""


def peak_memory(source: Path, target: Path, workers: int) -> dict[str, int]:
    """Return the peak RSS (KiB) of a default conversion's parent and largest worker."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(source), str(target), str(workers)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="image folder (made with --make if absent)")
    parser.add_argument("--make", type=int, default=2000, help="images to generate if absent")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--memory-scale", type=int, default=4, help="growth factor, 0 skips")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    if not args.folder.exists():
        make_image_folder(
            args.folder, SampleSpec(num_images=args.make, num_classes=10), photos=PHOTOS
        )
    paths = [str(f.path) for f in scan(args.folder).files]
    mean_kib = sum(os.path.getsize(p) for p in paths) / len(paths) / 1024
    print(f"# data: {len(paths)} JPEGs in {args.folder}, mean {mean_kib:.0f} KiB")
    print(f"# machine: {platform.platform()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; medians of {args.repeats} rounds; each ratio is the "
          "median of per-round ratios (a decode run right before each conversion)\n")

    results: dict[str, Any] = {"images": len(paths), "variants": {}, }
    sink = args.folder.parent / "decode-sink.bin"
    print("| variant | workers | images/s | pure decode images/s | % of pure decode | "
          "% of decode+write | file MiB | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.folder.parent) as tmp:
        for name in args.variants:
            resized = VARIANTS[name].get("size")
            for workers in args.workers:
                options = ConvertOptions(workers=workers, **VARIANTS[name])
                # Side by side, round by round: this machine's speed drifts between runs,
                # so each conversion is compared with a decode run made just before it.
                runs, decodes, floors = [], [], []
                for _ in range(args.repeats):
                    decodes.append(decode_rate(paths, workers, resized))
                    if not resized:
                        floors.append(decode_rate(paths, workers, None, sink))
                    runs.append(convert_once(args.folder, options, Path(tmp)))
                rates = [r["images_per_s"] for r in runs]
                of_decode = statistics.median(r / d for r, d in zip(rates, decodes, strict=True))
                of_floor = (
                    statistics.median(r / f for r, f in zip(rates, floors, strict=True))
                    if floors
                    else None
                )
                row = {
                    **runs[0],
                    "images_per_s": statistics.median(rates),
                    "decode_per_s": statistics.median(decodes),
                    "decode_write_per_s": statistics.median(floors) if floors else None,
                    "of_decode": of_decode,
                    "of_decode_write": of_floor,
                }
                results["variants"][f"{name} w{workers}"] = row
                of_write = "" if of_floor is None else f"{100 * of_floor:.0f}%"
                print(
                    f"| {name} ({row['mode']}/{row['storage']}) | {workers} | "
                    f"{row['images_per_s']:.0f} | {row['decode_per_s']:.0f} | "
                    f"{100 * of_decode:.0f}% | {of_write} | "
                    f"{row['file_bytes'] / 2**20:.1f} | {row['ratio']:.2f} |",
                    flush=True,
                )
        if args.memory_scale:
            small = Path(tmp) / "small"
            small.mkdir()
            quarter = paths[: len(paths) // args.memory_scale]
            for p in quarter:
                rel = Path(p).relative_to(args.folder)
                (small / rel.parent).mkdir(parents=True, exist_ok=True)
                os.symlink(p, small / rel)
            print("\n| folder | images | parent peak MiB | largest worker peak MiB |")
            print("|---|---|---|---|")
            for label, folder, count in (("1x", small, len(quarter)), (
                f"{args.memory_scale}x", args.folder, len(paths))):
                mem = peak_memory(folder, Path(tmp) / "mem.h5", max(args.workers))
                results[f"memory {label}"] = mem
                print(f"| {label} | {count} | {mem['parent_kib'] / 1024:.0f} | "
                      f"{mem['largest_worker_kib'] / 1024:.0f} |")
    results["self_peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
