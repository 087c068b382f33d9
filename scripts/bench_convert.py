"""Conversion benchmark: the converter against a pure pool doing the same work (issues 2, 11).

Every part runs, round by round (interleaved), the converter and a *peer*: a plain
``multiprocessing.Pool`` of the same number of processes (fork) doing the work the
converter cannot avoid, in the most direct way, on the same files; the ratio converter /
peer of each round is reported (median of the rounds), with both rates and the load
average (``os.getloadavg``) before and after the part. Both sides start their pool inside
the timed region; the converter also scans the folder, shuffles, writes the pack file
(into the page cache, after ``sync``) and its metadata, and checksums every sample. The
peers write each result into one shared anonymous mapping (one ``memcpy``; the parent
does nothing), so the pixels go "somewhere" without a pipe.

Parts (``--parts``; all but ``variants`` and ``memory`` by default, ~4-5 min, 2 cores):

- ``raw``: ``ConvertOptions(size=(256, 256), mode="raw")``, uncompressed, against the peer
  ``Image.open(path).convert("RGB").resize((256, 256), BILINEAR)`` (the resize h5pack
  uses), pixels copied into the mapping;
- ``encoded``: ``mode="encoded"`` (the files' bytes, each file validated by a full decode,
  which encoded packs promise), against the peer "read the file, decode it with Pillow
  (``Image.open(BytesIO(data)).load()``), copy its bytes into the mapping"; the ratio to a
  read-only peer (no decode) is printed too;
- ``codecs``: the raw 256x256 pack with each codec at its default level (``--codecs``,
  ``codec[:level][/shuffle]``), against the peer "decode, convert and resize one chunk's
  images (the pack's chunk rows) into a block, compress the block with the same HDF5
  filter, chunks and level" (an in-memory HDF5 file, ``driver="core"``, one per process:
  the codec's own cost, nothing more);
- ``levels``: one process compresses and decompresses the same pixels (``--level-images``
  images: resized to 256x256 in the pack's chunks, then at their own sizes in 8 MiB chunks
  of a blob) with each codec and level of ``--levels``: MB/s of pixels per core (CPU time)
  both ways and the compression ratio, and from them and the measured decode(+resize) time
  per image the images/s a 2-process conversion can reach at most with each (the basis of
  the default levels, ``core.layout.LEVELS``);
- ``variants`` / ``memory``: the issue-2 table (full-size pixels, 1 and 2 workers, against
  ``decode_image``) and the parent's and workers' peak memory as the folder grows.

Usage::

    python scripts/bench_convert.py bench-data/imagenet2000            # raw encoded codecs levels
    python scripts/bench_convert.py bench-data/imagenet2000 --parts raw --rounds 5
    python scripts/bench_convert.py bench-data/imagenet2000 --parts codecs --codecs zstd:1 zstd

Data: ``--make`` ImageNet-like JPEGs (``h5pack.synthetic.make_image_folder``, cut from
``../shared/data/photos`` when present, 10 classes, around 500x375 with +-30% jitter on
each side, quality 90) when the folder is absent. Prints markdown tables (for
BENCHMARKS.md) and writes ``--json`` if given.
"""

from __future__ import annotations

import argparse
import io
import json
import mmap
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from PIL import Image

from h5pack.core.decode import decode_image, load_file, resize_image
from h5pack.core.layout import DEFAULT_CHUNK_BYTES, Compression
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.builder import write_order
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions
from h5pack.write.plan import plan_storage
from h5pack.write.scan import scan

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None

SIZE = (256, 256)
PARTS = ("raw", "encoded", "codecs", "levels", "variants", "memory")
DEFAULT_PARTS = ("raw", "encoded", "codecs", "levels")
DEFAULT_CODECS = ("gzip", "lzf", "lz4", "zstd", "blosc-lz4", "blosc-zstd")
DEFAULT_LEVELS = (
    "zstd:1",
    "zstd:2",
    "zstd:3",
    "zstd:5",
    "zstd/bit",
    "gzip:1",
    "gzip:2",
    "gzip:4",
    "blosc-zstd:1",
    "blosc-zstd:3",
    "blosc-zstd:5",
    "blosc-lz4:5",
    "blosc-lz4:9",
    "lz4",
    "lzf",
)


def parse_codec(text: str) -> Compression:
    """Return the ``Compression`` of ``codec[:level][/shuffle]``, e.g. ``zstd:1/bit``."""
    text, _, shuffle = text.partition("/")
    codec, _, level = text.partition(":")
    return Compression(codec=codec, level=int(level) if level else None, shuffle=shuffle or "none")


def codec_name(compression: Compression) -> str:
    """Return e.g. ``zstd-3`` or ``blosc-lz4-5 bit`` (the level shown is the one used)."""
    level = compression.effective_level
    name = compression.codec + (f"-{level}" if level is not None else "")
    return name + (f" {compression.shuffle}" if compression.shuffle != "none" else "")


def load_text() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


# -- the peers: a plain Pool, results into one shared mapping ----------------------------------

_PEER: dict[str, Any] = {}


def _peer_init(state: dict[str, Any]) -> None:
    _PEER.clear()
    _PEER.update(state)


def _peer_pool(workers: int, state: dict[str, Any]) -> Any:
    return get_context("fork").Pool(workers, initializer=_peer_init, initargs=(state,))


def _resized(path: str) -> np.ndarray:
    with Image.open(path) as image:
        resized = image.convert("RGB").resize((SIZE[1], SIZE[0]), Image.Resampling.BILINEAR)
    return np.asarray(resized)


def _peer_resize(batch: list[int]) -> int:
    pixels = _PEER["pixels"]
    for i in batch:
        pixels[i] = _resized(_PEER["paths"][i])
    return len(batch)


def _peer_read(batch: list[int]) -> int:
    out, offsets, decode = _PEER["bytes"], _PEER["offsets"], _PEER["decode"]
    for i in batch:
        with open(_PEER["paths"][i], "rb") as f:
            data = f.read()
        if decode:
            with Image.open(io.BytesIO(data)) as image:
                image.load()
        out[offsets[i] : offsets[i] + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return len(batch)


def _peer_compress(batch: list[int]) -> int:
    block = _PEER["block"]
    for row, i in enumerate(batch):
        block[row] = _resized(_PEER["paths"][i])
    handle = _PEER.get("file")
    if handle is None:
        handle = h5py.File(f"peer-{os.getpid()}", "w", driver="core", backing_store=False)
        _PEER["file"] = handle
        _PEER["dataset"] = handle.create_dataset(
            "d", shape=block.shape, chunks=block.shape, dtype=np.uint8, **_PEER["filter"]
        )
    if len(batch) < len(block):  # the last, partial chunk: HDF5 compresses it padded too
        block[len(batch) :] = 0
    _PEER["dataset"][...] = block
    handle.flush()  # HDF5 2 keeps the chunk in its cache: flushing compresses it
    return len(batch)


Measured = tuple[float, float]  # images/s, CPU seconds of the process tree


def _timed_pool(
    workers: int, fn: Callable[[list[int]], int], batches: list[list[int]], state: dict[str, Any]
) -> Measured:
    """Return images/s and CPU seconds of ``fn`` over ``batches`` in a fresh pool.

    The pool's start and end are included, as the converter's are.
    """
    cpu = cpu_seconds()
    start = time.perf_counter()
    with _peer_pool(workers, state) as pool:
        done = int(sum(pool.imap_unordered(fn, batches)))
        pool.close()
        pool.join()  # reaped: their CPU time is counted
    return done / (time.perf_counter() - start), cpu_seconds() - cpu


def peer_resize(paths: list[str], workers: int) -> Measured:
    """Images/s of decode + RGB + resize to 256x256, pixels copied into shared memory."""
    buffer = mmap.mmap(-1, len(paths) * SIZE[0] * SIZE[1] * 3)
    pixels = np.frombuffer(buffer, dtype=np.uint8).reshape(len(paths), *SIZE, 3)
    batches = [list(range(i, min(len(paths), i + 32))) for i in range(0, len(paths), 32)]
    return _timed_pool(workers, _peer_resize, batches, {"paths": paths, "pixels": pixels})


def peer_read(paths: list[str], workers: int, *, decode: bool) -> Measured:
    """Images/s of reading each file (and decoding it), its bytes copied into shared memory."""
    sizes = [os.path.getsize(p) for p in paths]
    offsets = np.concatenate(([0], np.cumsum(sizes))).tolist()
    buffer = mmap.mmap(-1, max(1, int(offsets[-1])))
    out = np.frombuffer(buffer, dtype=np.uint8)
    batches = [list(range(i, min(len(paths), i + 16))) for i in range(0, len(paths), 16)]
    state = {"paths": paths, "bytes": out, "offsets": offsets, "decode": decode}
    return _timed_pool(workers, _peer_read, batches, state)


def peer_compress(paths: list[str], workers: int, compression: Compression, rows: int) -> Measured:
    """Images/s of decode + resize of a chunk's images, then compressing the chunk."""
    block = np.zeros((rows, *SIZE, 3), dtype=np.uint8)
    batches = [list(range(i, min(len(paths), i + rows))) for i in range(0, len(paths), rows)]
    state = {"paths": paths, "block": block, "filter": compression.h5py_kwargs()}
    return _timed_pool(workers, _peer_compress, batches, state)


# -- the converter ---------------------------------------------------------------------------


def convert_once(source: Path, options: ConvertOptions, workdir: Path) -> dict[str, Any]:
    """Convert ``source`` once; return images/s and sizes."""
    target = workdir / "bench.h5"
    target.unlink(missing_ok=True)  # replacing a file makes ext4 flush the new one first
    os.sync()  # the previous run's dirty pages are not this run's cost
    cpu = cpu_seconds()
    start = time.perf_counter()
    report = convert(source, target, options, overwrite=True)
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds() - cpu
    from h5pack.check import pack_info

    info = pack_info(target)
    return {
        "images_per_s": report.num_samples / elapsed,
        "cpu_s": cpu,
        "file_bytes": target.stat().st_size,
        "ratio": info.compression_ratio,
        "mode": info.mode,
        "storage": info.storage,
    }


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its reaped children so far."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def side_by_side(
    label: str,
    rounds: int,
    run: Callable[[], dict[str, Any]],
    peers: dict[str, Callable[[], Measured]],
) -> dict[str, Any]:
    """Run the converter and each peer once per round, interleaved; return medians and ratios.

    Besides images/s, each side's CPU seconds (the whole process tree) give a ratio of
    CPU cost per image that moves less with other programs' load: peer CPU / converter CPU.
    """
    before = load_text()
    runs: list[dict[str, Any]] = []
    cpus: list[float] = []
    rates: dict[str, list[float]] = {name: [] for name in peers}
    peer_cpus: dict[str, list[float]] = {name: [] for name in peers}

    def convert_side() -> None:
        result = run()
        runs.append(result)
        cpus.append(result["cpu_s"])

    for i in range(rounds):
        # Alternate which side goes first: a drift in the machine's speed then evens out.
        if i % 2:
            convert_side()
        for name, peer in peers.items():
            rate, cpu = peer()
            rates[name].append(rate)
            peer_cpus[name].append(cpu)
        if not i % 2:
            convert_side()
    converter = [r["images_per_s"] for r in runs]
    row: dict[str, Any] = {
        **runs[0],
        "label": label,
        "images_per_s": statistics.median(converter),
        "rounds": converter,
        "cpu_s": cpus,
        "load_before": before,
        "load_after": load_text(),
        "peers": {},
    }
    for name, values in rates.items():
        ratios = [c / p for c, p in zip(converter, values, strict=True)]
        cpu_ratios = [p / c for c, p in zip(cpus, peer_cpus[name], strict=True)]
        row["peers"][name] = {
            "images_per_s": statistics.median(values),
            "rounds": values,
            "cpu_s": peer_cpus[name],
            "ratio": statistics.median(ratios),
            "ratios": ratios,
            "cpu_ratio": statistics.median(cpu_ratios),
        }
    return row


def print_row(row: dict[str, Any]) -> None:
    for name, peer in row["peers"].items():
        ratios = ", ".join(f"{r:.2f}" for r in peer["ratios"])
        print(
            f"| {row['label']} | {row['images_per_s']:.0f} | {name} | {peer['images_per_s']:.0f} "
            f"| **{peer['ratio']:.2f}** ({ratios}) | {peer['cpu_ratio']:.2f} | "
            f"{row['file_bytes'] / 2**20:.0f} | {row['ratio']:.2f} | "
            f"{row['load_before']} -> {row['load_after']} |",
            flush=True,
        )


# -- level sweep -----------------------------------------------------------------------------


def _full_size(path: str) -> np.ndarray:
    return decode_image(load_file(path), name=path).reshape(-1)


def level_sweep(
    paths: list[str], levels: list[Compression], rows: int, rounds: int, *, full: bool = False
) -> list[dict[str, Any]]:
    """Compress and decompress the same pixels with each codec in this process.

    The pixels are ``paths`` decoded and resized to 256x256 in chunks of ``rows`` images, or
    with ``full`` decoded at their own sizes, back to back in chunks of 8 MiB (a raw blob).
    Times are this process's CPU time (``time.process_time``), which other programs' load
    moves less than wall time, medians of ``rounds`` (the decode+resize time as well).
    """
    decode = _full_size if full else _resized
    decodes = []
    for _ in range(rounds):
        start = time.process_time()
        images = [decode(p) for p in paths]
        decodes.append((time.process_time() - start) / len(paths))
    decode_s = statistics.median(decodes)
    if full:
        flat = np.concatenate(images)
        chunk = DEFAULT_CHUNK_BYTES
        pixels = flat[: max(chunk, len(flat) // chunk * chunk)]
        chunks: tuple[int, ...] = (min(chunk, len(pixels)),)
    else:
        stacked = np.stack(images)
        pixels = stacked[: len(stacked) // rows * rows] if len(stacked) >= rows else stacked
        chunks = (min(rows, len(pixels)), *SIZE, 3)
    num_images = len(paths) * pixels.nbytes / sum(i.nbytes for i in images)
    out_block = np.empty(chunks, dtype=np.uint8)
    step = chunks[0]
    times: dict[int, list[float]] = {i: [] for i in range(len(levels))}
    reads: dict[int, list[float]] = {i: [] for i in range(len(levels))}
    stored: dict[int, int] = {}
    core = {"driver": "core", "backing_store": False, "rdcc_nbytes": 0}
    with h5py.File("sweep", "w", **core) as handle:
        for _ in range(rounds):
            for i, compression in enumerate(levels):
                name = f"d{i}"
                if name in handle:
                    del handle[name]
                begin = time.process_time()
                dataset = handle.create_dataset(
                    name, data=pixels, chunks=chunks, **compression.h5py_kwargs()
                )
                handle.flush()
                times[i].append(time.process_time() - begin)
                stored[i] = sum(
                    dataset.id.get_chunk_info(k).size for k in range(dataset.id.get_num_chunks())
                )
                begin = time.process_time()
                for lo in range(0, len(pixels), step):
                    dataset.read_direct(out_block, np.s_[lo : lo + step])
                reads[i].append(time.process_time() - begin)
    out = []
    for i, compression in enumerate(levels):
        seconds = statistics.median(times[i])
        per_image = seconds / num_images
        out.append(
            {
                "codec": codec_name(compression),
                "mb_per_s": pixels.nbytes / seconds / 1e6,
                "decompress_mb_per_s": pixels.nbytes / statistics.median(reads[i]) / 1e6,
                "ratio": pixels.nbytes / stored[i],
                "compress_ms_per_image": 1e3 * per_image,
                "decode_ms_per_image": 1e3 * decode_s,
                "bound_2_workers": 2 / (decode_s + per_image),
            }
        )
    return out


# -- the issue-2 table (full-size pixels) and memory -------------------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    "default (auto)": {},
    "raw gzip-4": {"mode": "raw", "compression": Compression(codec="gzip")},
    "raw lzf": {"mode": "raw", "compression": Compression(codec="lzf")},
    "raw lz4": {"mode": "raw", "compression": Compression(codec="lz4")},
    "raw zstd": {"mode": "raw", "compression": Compression(codec="zstd")},
    "raw contiguous": {"mode": "raw", "layout": "contiguous"},
    "raw 256x256": {"mode": "raw", "size": (256, 256)},
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
    """Return images/s of ``decode_image`` (and resizing) ``paths`` with ``workers`` processes.

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
            done = sum(
                pool.map(_decode_batch, batches, [size] * len(batches), [where] * len(batches))
            )
    rate = done / (time.perf_counter() - start)
    if sink is not None:
        for leftover in sink.parent.glob(sink.name + ".*"):
            leftover.unlink()
    return rate


def variants_table(args: argparse.Namespace, paths: list[str], tmp: Path) -> dict[str, Any]:
    """The issue-2 table: each variant with 1 and 2 workers against ``decode_image``."""
    results: dict[str, Any] = {}
    sink = tmp / "decode-sink.bin"
    print(
        "\n| variant | workers | images/s | pure decode images/s | % of pure decode | "
        "% of decode+write | file MiB | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.variants:
        resized = VARIANTS[name].get("size")
        for workers in (1, 2):
            options = ConvertOptions(workers=workers, **VARIANTS[name])
            runs, decodes, floors = [], [], []
            for _ in range(args.rounds):
                decodes.append(decode_rate(paths, workers, resized))
                if not resized:
                    floors.append(decode_rate(paths, workers, None, sink))
                runs.append(convert_once(args.folder, options, tmp))
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
                "of_decode": of_decode,
                "of_decode_write": of_floor,
            }
            results[f"{name} w{workers}"] = row
            of_write = "" if of_floor is None else f"{100 * of_floor:.0f}%"
            print(
                f"| {name} ({row['mode']}/{row['storage']}) | {workers} | "
                f"{row['images_per_s']:.0f} | {row['decode_per_s']:.0f} | "
                f"{100 * of_decode:.0f}% | {of_write} | "
                f"{row['file_bytes'] / 2**20:.1f} | {row['ratio']:.2f} |",
                flush=True,
            )
    return results


MEMORY_PROBE = """
import resource, sys, json
from h5pack.write.options import ConvertOptions
from h5pack.write.builder import write_order
from h5pack.write.convert import convert

convert(sys.argv[1], sys.argv[2], ConvertOptions(workers=int(sys.argv[3])), overwrite=True)
# VmHWM is this process image's own peak: ru_maxrss also counts the benchmark process
# that forked it before the exec (Linux keeps the old image's high-water mark).
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({
    "parent_kib": int(status["VmHWM"].split()[0]),
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


def memory_table(args: argparse.Namespace, paths: list[str], tmp: Path) -> dict[str, Any]:
    """Peak memory of a default conversion with the folder and with a quarter of it."""
    small = tmp / "small"
    small.mkdir()
    quarter = paths[: len(paths) // 4]
    for p in quarter:
        rel = Path(p).relative_to(args.folder)
        (small / rel.parent).mkdir(parents=True, exist_ok=True)
        os.symlink(p, small / rel)
    print("\n| folder | images | parent peak MiB | largest worker peak MiB |")
    print("|---|---|---|---|")
    results = {}
    for label, folder, count in (("1x", small, len(quarter)), ("4x", args.folder, len(paths))):
        mem = peak_memory(folder, tmp / "mem.h5", args.workers)
        results[f"memory {label}"] = mem
        print(
            f"| {label} | {count} | {mem['parent_kib'] / 1024:.0f} | "
            f"{mem['largest_worker_kib'] / 1024:.0f} |"
        )
    return results


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="image folder (made with --make if absent)")
    parser.add_argument("--make", type=int, default=2000, help="images to generate if absent")
    parser.add_argument("--jitter", type=float, default=0.3, help="size jitter of --make")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", nargs="+", default=list(DEFAULT_PARTS), choices=PARTS)
    parser.add_argument("--codecs", nargs="+", default=list(DEFAULT_CODECS))
    parser.add_argument("--levels", nargs="+", default=list(DEFAULT_LEVELS))
    parser.add_argument("--level-images", type=int, default=246, help="images of the sweep")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    if not args.folder.exists():
        spec = SampleSpec(
            num_images=args.make, num_classes=10, size=(375, 500), size_jitter=args.jitter
        )
        make_image_folder(args.folder, spec, photos=PHOTOS, workers=args.workers)
    # The converter's write order (a seeded shuffle): the peers' chunks mix the same images.
    files = scan(args.folder).files
    paths = [str(files[i].path) for i in write_order(len(files), ConvertOptions())]
    mean_kib = sum(os.path.getsize(p) for p in paths) / len(paths) / 1024
    print(f"# data: {len(paths)} JPEGs in {args.folder}, mean {mean_kib:.0f} KiB")
    print(
        f"# machine: {platform.platform()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, h5py {h5py.version.version} / HDF5 "
        f"{h5py.version.hdf5_version}; {args.workers} workers; medians of {args.rounds} "
        f"interleaved rounds; load average at start {load_text()}"
    )
    results: dict[str, Any] = {"images": len(paths), "workers": args.workers}
    workers = args.workers
    resized = ConvertOptions(workers=workers, mode="raw", size=SIZE)
    rows = plan_storage(resized, None, num_samples=len(paths)).group_samples
    header = (
        "\n| converter | images/s | peer | peer images/s | converter / peer (rounds) "
        "| CPU: peer / converter | file MiB | ratio | load 1/5/15 min before -> after |"
        "\n|---|---|---|---|---|---|---|---|---|"
    )
    with tempfile.TemporaryDirectory(dir=args.folder.parent) as name:
        tmp = Path(name)
        rows_out: list[dict[str, Any]] = []

        def part(
            label: str, options: ConvertOptions, peers: dict[str, Callable[[], Measured]]
        ) -> None:
            row = side_by_side(
                label, args.rounds, lambda: convert_once(args.folder, options, tmp), peers
            )
            rows_out.append(row)
            print_row(row)

        if {"raw", "encoded", "codecs"} & set(args.parts):
            print(header)
        if "raw" in args.parts:
            part(
                "raw 256x256, none",
                resized,
                {"decode+resize": lambda: peer_resize(paths, workers)},
            )
        if "encoded" in args.parts:
            part(
                "encoded",
                ConvertOptions(workers=workers, mode="encoded"),
                {
                    "read+decode": lambda: peer_read(paths, workers, decode=True),
                    "read only": lambda: peer_read(paths, workers, decode=False),
                },
            )
        if "codecs" in args.parts:
            for text in args.codecs:
                compression = parse_codec(text)
                options = ConvertOptions(
                    workers=workers, mode="raw", size=SIZE, compression=compression
                )
                compress = partial(peer_compress, paths, workers, compression, rows)
                part(
                    f"raw 256x256, {codec_name(compression)}",
                    options,
                    {"decode+resize+compress": compress},
                )
        results["side_by_side"] = rows_out
        if "levels" in args.parts:
            results["levels"] = {}
            codecs = [parse_codec(t) for t in args.levels]
            for full in (False, True):
                before = load_text()
                sweep = level_sweep(
                    paths[: args.level_images], codecs, rows, args.rounds, full=full
                )
                count = min(args.level_images, len(paths))
                what = (
                    f"{count} images at their own sizes, back to back in 8 MiB chunks"
                    if full
                    else f"{count // rows * rows} images of 256x256 in chunks of {rows}"
                )
                print(
                    f"\n{what}, one process, CPU time, medians of {args.rounds}; load {before} -> "
                    f"{load_text()}\n\n| codec | compress MB/s per core | ratio | decompress "
                    "MB/s per core | compress ms/image | decode(+resize) ms/image | 2-process "
                    "bound images/s |\n|---|---|---|---|---|---|---|"
                )
                for entry in sweep:
                    print(
                        f"| {entry['codec']} | {entry['mb_per_s']:.0f} | {entry['ratio']:.3f} | "
                        f"{entry['decompress_mb_per_s']:.0f} | "
                        f"{entry['compress_ms_per_image']:.2f} | "
                        f"{entry['decode_ms_per_image']:.2f} | {entry['bound_2_workers']:.0f} |",
                        flush=True,
                    )
                results["levels"]["full" if full else "256x256"] = sweep
        if "variants" in args.parts:
            results["variants"] = variants_table(args, paths, tmp)
        if "memory" in args.parts:
            results.update(memory_table(args, paths, tmp))
    results["self_peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
