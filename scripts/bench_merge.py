"""Merge benchmark (issue 11): merging 8 compressed shards against converting the images again.

    python scripts/bench_merge.py                               # ~2-3 minutes on 2 cores
    python scripts/bench_merge.py --images 1000 --rounds 3 --json merge.json
    python scripts/bench_merge.py --data bench-data/merge1600   # keep the images between runs

Data: ``--images`` ImageNet-like JPEGs (``h5pack.synthetic.make_image_folder``, cut from
../shared/data/photos when present, 10 classes, around 500x375 with +-30% jitter on each
side, quality 90). Each configuration converts them once into a pack set of ``--shards``
shards (``convert --shards``, ``write.shards.convert_set``), then, round by round
(interleaved, so that load from elsewhere hits both alike):

- ``merge``: ``h5pack.merge_packs(set, out)``: one pack from the shards' stored chunks;
- ``convert``: ``h5pack.convert(folder, out)`` with the same options and ``--workers``
  workers: the fresh conversion a merge saves.

Configurations (``--configs``):

- ``encoded``: the files' bytes (what ``convert`` chooses for JPEGs of several sizes),
  zstd (default level), 1 MiB chunks: a blob, so every chunk is copied as stored;
- ``raw``: ``--size 256 256`` pixels, zstd: fixed-size arrays whose chunk rows do not
  divide the shards' sample counts: each shard's whole chunks are copied and the rows of
  its last, partial chunk re-compressed at the end of the pack (NOTE [ Merging by
  chunks ] in write/merge.py);
- ``raw-keep-order``: the same with ``keep_order=True``: every chunk after the first shard
  is re-compressed (the exact concatenation order);
- ``raw-aligned``: ``--chunk-samples`` dividing every shard: chunk for chunk.

Reported: medians over rounds of each side's wall time and the median of per-round ratios
(conversion / merge; the target is >= 5x), the chunks copied and re-chunked, and a check
that the merged pack serves, sample for sample (matched by path), the same stored bytes
(encoded) or pixels (raw) as the fresh conversion. Prints markdown; ``--json`` writes the
figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import h5pack
from h5pack.core.layout import Compression
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.options import ConvertOptions

SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None
CONFIGS = ("encoded", "raw", "raw-keep-order", "raw-aligned")
# A real shard holds hundreds of 8 MiB chunks; the few MB of each of these shards would be
# one chunk cut to its length (then laid out again by the merge), so encoded packs here
# use 1 MiB chunks.
ENCODED_CHUNK_BYTES = 2**20


def load_text() -> str:
    """Return the load average as ``uptime`` prints it."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def options_for(config: str, workers: int, shards: int, images: int) -> ConvertOptions:
    """Return the conversion options of a configuration."""
    zstd = Compression(codec="zstd")
    if config == "encoded":  # 1 MiB chunks: each shard holds several, as real shards do
        return ConvertOptions(
            mode="encoded", compression=zstd, workers=workers, chunk_bytes=ENCODED_CHUNK_BYTES
        )
    if config in ("raw", "raw-keep-order"):
        return ConvertOptions(mode="raw", size=(256, 256), compression=zstd, workers=workers)
    per_shard = images // shards
    rows = max(r for r in range(1, 65) if per_shard % r == 0 and images % r == 0)
    return ConvertOptions(
        mode="raw", size=(256, 256), compression=zstd, workers=workers, chunk_samples=rows
    )


def make_set(folder: Path, out: Path, options: ConvertOptions, shards: int) -> float:
    """Convert ``folder`` into a pack set of ``shards`` shards; return the wall time."""
    from h5pack.write.shards import convert_set

    started = time.perf_counter()
    report = convert_set(folder, out, options, shards=shards, overwrite=True)
    if report.manifest is None:
        raise SystemExit(f"the pack set in {out} is incomplete: {report.missing}")
    return time.perf_counter() - started


def same_samples(merged: Path, fresh: Path) -> int:
    """Return how many samples the two packs serve identically (matched by path).

    Raises:
        SystemExit: a sample differs, or the packs do not hold the same paths.
    """
    with h5pack.PackReader(merged) as a, h5pack.PackReader(fresh) as b:
        if sorted(a.paths) != sorted(b.paths):
            raise SystemExit(f"{merged} and {fresh} do not hold the same files")
        where = {p: i for i, p in enumerate(b.paths)}
        raw = a.meta.mode == "raw"
        for lo in range(0, len(a), 256):
            idx = np.arange(lo, min(len(a), lo + 256))
            other = np.array([where[a.paths[i]] for i in idx])
            mine = a.read_images(idx) if raw else a.read_stored(idx)
            theirs = b.read_images(other) if raw else b.read_stored(other)
            for i, x, y in zip(idx, mine, theirs, strict=True):
                if not np.array_equal(x, y):
                    raise SystemExit(f"sample {i} ({a.paths[i]}) differs between the packs")
        return len(a)


def run_config(
    config: str,
    merges: list[str],
    folder: Path,
    work: Path,
    args: argparse.Namespace,
    num_images: int,
) -> list[dict[str, Any]]:
    """Measure the merges of one conversion's pack set against that conversion."""
    options = options_for(config, args.workers, args.shards, num_images)
    set_dir = work / f"{config}-set"
    build_s = make_set(folder, set_dir, options, args.shards)
    fresh = work / f"{config}-fresh.h5"
    merge_s: dict[str, list[float]] = {name: [] for name in merges}
    reports: dict[str, Any] = {}
    convert_s: list[float] = []
    load_before = load_text()
    for _ in range(args.rounds):
        for name in merges:
            os.sync()
            started = time.perf_counter()
            reports[name] = h5pack.merge_packs(
                set_dir,
                work / f"{name}-merged.h5",
                overwrite=True,
                keep_order=name.endswith("keep-order"),
            )
            merge_s[name].append(time.perf_counter() - started)
        os.sync()
        started = time.perf_counter()
        h5pack.convert(folder, fresh, options, overwrite=True)
        convert_s.append(time.perf_counter() - started)
    figures = []
    for name in merges:
        merged, report = work / f"{name}-merged.h5", reports[name]
        checked = same_samples(merged, fresh)
        ratios = [c / m for c, m in zip(convert_s, merge_s[name], strict=True)]
        with h5py.File(merged) as handle:
            chunks = handle["images"].chunks
        figures.append(
            {
                "config": name,
                "shards": args.shards,
                "images": num_images,
                "build_set_s": build_s,
                "merge_s": statistics.median(merge_s[name]),
                "convert_s": statistics.median(convert_s),
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "chunks_copied": report.chunks_copied,
                "chunks_rechunked": report.chunks_rechunked,
                "moved_to_end": report.moved_to_end,
                "chunk_shape": list(chunks) if chunks else None,
                "pack_mib": report.file_bytes / 2**20,
                "samples_checked": checked,
                "load_before": load_before,
                "load_after": load_text(),
            }
        )
        merged.unlink()
    shutil.rmtree(set_dir)
    fresh.unlink()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1200)
    parser.add_argument("--data", type=Path, default=None, help="keep the images here")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="h5pack-merge-") as tmp:
        work = Path(tmp)
        folder = args.data or work / "images"
        if not folder.exists():
            spec = SampleSpec(
                num_images=args.images, num_classes=10, size=(375, 500), size_jitter=0.3
            )
            make_image_folder(folder, spec, photos=PHOTOS, workers=args.workers)
        num_images = sum(1 for p in folder.rglob("*.jpg"))
        mean_kib = sum(p.stat().st_size for p in folder.rglob("*.jpg")) / num_images / 1024
        print(f"# data: {num_images} JPEGs in {folder}, mean {mean_kib:.0f} KiB")
        print(
            f"# machine: {platform.platform()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, h5py {h5py.version.version} / HDF5 "
            f"{h5py.version.hdf5_version}; conversion with {args.workers} workers; "
            f"medians of {args.rounds} interleaved rounds; load average at start {load_text()}"
        )
        print(
            "\n| pack | shards | merge s | conversion s | conversion / merge (rounds) | "
            "chunks copied / re-chunked | pack MiB | same samples | load before -> after |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        results = []
        for config in ("encoded", "raw", "raw-aligned"):
            merges = [c for c in args.configs if c == config or c == f"{config}-keep-order"]
            if not merges:
                continue
            for fig in run_config(config, merges, folder, work, args, num_images):
                results.append(fig)
                print_row(fig)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def print_row(fig: dict[str, Any]) -> None:
    """Print one row of the table."""
    rounds = ", ".join(f"{r:.1f}" for r in fig["ratios"])
    moved = f", {fig['moved_to_end']} moved to the end" if fig["moved_to_end"] else ""
    print(
        f"| {fig['config']} (chunk {fig['chunk_shape']}) | {fig['shards']} | "
        f"{fig['merge_s']:.2f} | {fig['convert_s']:.2f} | **{fig['ratio']:.1f}x** "
        f"({rounds}) | {fig['chunks_copied']} / {fig['chunks_rechunked']}{moved} | "
        f"{fig['pack_mib']:.0f} | {fig['samples_checked']} of {fig['images']} | "
        f"{fig['load_before']} -> {fig['load_after']} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
