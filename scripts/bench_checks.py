"""The cost of checking every sample served (issue 9.3), per codec, on the loader's read path.

Builds (once, cached in --workdir) a folder of natural-looking JPEGs with
``h5pack.synthetic`` and one pack per codec (raw 256x256 arrays in chunks of 64 samples:
none, lz4, zstd, gzip, lzf; and the JPEGs as an encoded pack), then times whole epochs of
``make_loader`` (default workers and threads, shuffled) with:

- ``off``: ``verify_checksums=False``;
- ``xxh3``: the default, every sample's XXH3-64 (format 1.1, ``sample_xxh3``);
- ``crc32``: every sample's CRC32 (what format 1.0 packs, or a process without xxhash, get);

and estimates two per-chunk alternatives over the stored (compressed) bytes, which the
direct path has in hand before decompressing: the time to hash every chunk's stored bytes
once (``read_direct_chunk``, timed over the hash only), as a share of the ``off`` epoch.
Variants are interleaved; each figure is the mean epoch over ``--min-s`` seconds of
epochs, and the best of ``--repeats`` such figures (the least disturbed by other load). It
also times each hash alone on one stored sample and one stored chunk of each pack, the
cost that does not depend on the load. Prints Markdown tables.

    python scripts/bench_checks.py --images 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import time
import zlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5pack.core import integrity
from h5pack.core.layout import Compression
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.loader import make_loader
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions

CODECS = ("none", "lz4", "zstd", "gzip", "lzf")


def build(workdir: Path, images: int) -> dict[str, Path]:
    """Return the packs to measure, building what is not in ``workdir`` yet."""
    folder = workdir / f"jpegs_{images}"
    if not folder.exists():
        spec = SampleSpec(num_images=images, num_classes=10, size=(256, 256))
        make_image_folder(folder, spec, photos=False)
    packs = {}
    for codec in CODECS:
        path = workdir / f"raw_{codec}_{images}.h5"
        if not path.exists():
            options = ConvertOptions(
                mode="raw", chunk_samples=64, compression=Compression(codec=codec)
            )
            convert(folder, path, options)
        packs[codec] = path
    path = workdir / f"encoded_{images}.h5"
    if not path.exists():
        convert(folder, path, ConvertOptions(mode="encoded"))
    packs["jpeg (encoded)"] = path
    return packs


def epoch_s(path: Path, check: str, min_s: float) -> float:
    """Return the mean seconds of an epoch, over epochs that last ``min_s`` in all.

    The first epoch (workers starting, page cache) is not counted.
    """
    real = integrity.has_sample_digest
    if check == "crc32":
        integrity.has_sample_digest = lambda: False  # type: ignore[assignment]
    try:
        loader = make_loader(path, 64, verify_checksums=check != "off", seed=0)
        for _ in loader:
            pass
        epochs, started = 0, time.perf_counter()
        while time.perf_counter() - started < min_s:
            epochs += 1
            loader.set_epoch(epochs)
            for _ in loader:
                pass
        elapsed = time.perf_counter() - started
        del loader
        return elapsed / epochs
    finally:
        integrity.has_sample_digest = real  # type: ignore[assignment]


def per_chunk_s(path: Path, digest: Any) -> float:
    """Return the seconds to hash every chunk's stored bytes once (the hash alone)."""
    total = 0.0
    with h5py.File(path, "r") as handle:
        images = handle["images"]
        if images.chunks is None:
            return float("nan")
        step = images.chunks[0]
        for start in range(0, images.shape[0], step):
            coords = (start,) + (0,) * (images.ndim - 1)
            _, stored = images.id.read_direct_chunk(coords)
            began = time.perf_counter()
            digest(stored)
            total += time.perf_counter() - began
    return total


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-s", type=float, default=2.0, help="Seconds of epochs per figure.")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/h5pack_bench_checks"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    packs = build(args.workdir, args.images)
    variants = ("off", "xxh3", "crc32")
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.repeats):
        for name, path in packs.items():
            for check in variants:
                seconds = epoch_s(path, check, args.min_s)
                key = (name, check)
                best[key] = min(best.get(key, float("inf")), seconds)
    print(
        f"{args.images} images of 256x256, best of {args.repeats} runs of >= {args.min_s} s of "
        "epochs, make_loader defaults"
    )
    print()
    print(
        "| pack | off (images/s) | xxh3 per sample | crc32 per sample | "
        "crc32 per chunk (est.) | xxh3 per chunk (est.) |"
    )
    print("|---|---|---|---|---|---|")
    for name, path in packs.items():
        off = best[(name, "off")]

        def cost(seconds: float, base: float = off) -> str:
            return f"{args.images / seconds:,.0f} ({(seconds - base) / base:+.1%})"

        crc_chunk = per_chunk_s(path, zlib.crc32)
        xxh_chunk = per_chunk_s(path, integrity.sample_digest)
        print(
            f"| {name} | {args.images / off:,.0f} | {cost(best[(name, 'xxh3')])} | "
            f"{cost(best[(name, 'crc32')])} | {crc_chunk / off:+.1%} | {xxh_chunk / off:+.1%} |"
        )
    hash_costs(packs)


def hash_costs(packs: dict[str, Path]) -> None:
    """Print the time of each hash alone, per stored sample and per stored chunk."""
    print()
    print(
        "| pack | sample bytes | xxh3 / sample | crc32 / sample | chunk stored bytes | "
        "crc32 / chunk | xxh3 / chunk |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, path in packs.items():
        with h5py.File(path, "r") as handle:
            images = handle["images"]
            if images.ndim == 4:
                sample = np.ascontiguousarray(images[0])
            else:
                offsets, sizes = handle["offsets"], handle["sizes"]
                start = int(offsets[0])
                sample = np.ascontiguousarray(images[start : start + int(sizes[0])])
            stored = None
            if images.chunks is not None:
                coords = (0,) * images.ndim
                stored = images.id.read_direct_chunk(coords)[1]
        row = [name, f"{sample.nbytes:,}"]
        for digest in (integrity.sample_digest, integrity.crc32):
            row.append(f"{_timed(digest, sample) * 1e6:.1f} us")
        if stored is None:
            row += ["-", "-", "-"]
        else:
            row.append(f"{len(stored):,}")
            for digest in (zlib.crc32, integrity.sample_digest):
                row.append(f"{_timed(digest, stored) * 1e6:.0f} us")
        print("| " + " | ".join(row) + " |")


def _timed(function: Any, data: Any) -> float:
    """Return the best seconds of one call over a few hundred milliseconds."""
    best = float("inf")
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:
        began = time.perf_counter()
        function(data)
        best = min(best, time.perf_counter() - began)
    return best


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
