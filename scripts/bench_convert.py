"""Conversion: the converter against a plain pool doing the same work; shards, Dask, merge.

    python scripts/bench_convert.py bench-data/imagenet2000 --make 2000 --rounds 3
    python scripts/bench_convert.py bench-data/imagenet2000 --parts codecs --codecs zstd lz4
    python scripts/bench_convert.py bench-data/imagenet2000 --parts shards merge --rounds 5

Data: ``--make`` ImageNet-like JPEGs (``h5pack.synthetic.make_image_folder``, cut from
../shared/data/photos when present, 10 classes, around 500x375 with +-30% jitter, quality 90)
when the folder is absent. Parts (``--parts``), each run round by round, interleaved, so
that load from elsewhere hits every side alike:

- ``raw``: ``ConvertOptions(size=(256, 256), mode="raw")`` against a *peer*, a plain fork
  ``multiprocessing.Pool`` of as many processes doing the unavoidable work most directly
  (``Image.open().convert("RGB").resize((256, 256), BILINEAR)``, pixels copied into one
  shared mapping); the converter also scans, shuffles, writes the pack and checksums;
- ``encoded``: ``mode="encoded"`` (each file validated by a full decode) against "read the
  file, decode it with Pillow, copy its bytes", and against a read-only peer;
- ``codecs``: the raw 256x256 pack with each of ``--codecs`` (``codec[:level][/shuffle]``)
  against "decode and resize one chunk's images, compress the block with the same HDF5
  filter" (an in-memory HDF5 file per process);
- ``shards``: ``convert`` into one pack against ``convert_set(..., shards=N)`` for each of
  ``--shards``, and ``convert_on_dask`` on a 2-process ``LocalCluster`` (when distributed
  imports; started outside the timed region, as a user's cluster);
- ``merge``: ``merge_packs`` of a set of ``--merge-shards`` zstd shards against converting
  the images again, encoded and raw 256x256; every merged sample is checked equal.

Each row: the median images/s (or seconds) over the rounds, the median of per-round ratios,
and CPU per image of the whole process tree (pools and Dask workers included,
``h5pack.bench.tree_cpu_s``), with the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from PIL import Image

import h5pack
from h5pack.bench.system import machine_info, tree_cpu_s
from h5pack.core.layout import Compression
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions
from h5pack.write.plan import plan_storage
from h5pack.write.scan import scan

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None
SIZE = (256, 256)
PARTS = ("raw", "encoded", "codecs", "shards", "merge")
DEFAULT_CODECS = ("gzip", "lzf", "lz4", "zstd", "blosc-lz4", "blosc-zstd")


def parse_codec(text: str) -> Compression:
    """Return the ``Compression`` of ``codec[:level][/shuffle]``, e.g. ``zstd:1/bit``."""
    text, _, shuffle = text.partition("/")
    codec, _, level = text.partition(":")
    return Compression(codec=codec, level=int(level) if level else None, shuffle=shuffle or "none")


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


Measured = tuple[float, float]  # images/s, CPU seconds of the process tree per image


def _timed_pool(
    workers: int, fn: Callable[[list[int]], int], batches: list[list[int]], state: dict[str, Any]
) -> Measured:
    """Return images/s and CPU seconds of ``fn`` over ``batches`` in a fresh pool.

    The pool's start and end are included, as the converter's are.
    """
    cpu = tree_cpu_s()
    start = time.perf_counter()
    with _peer_pool(workers, state) as pool:
        done = int(sum(pool.imap_unordered(fn, batches)))
        pool.close()
        pool.join()  # reaped: their CPU time is counted
    return done / (time.perf_counter() - start), (tree_cpu_s() - cpu) / max(1, done)


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


# -- timing, interleaved --------------------------------------------------------------------
Measured = tuple[float, float]  # images/s, CPU seconds of the process tree per image


def timed(run: Callable[[], Any], images: int) -> Measured:
    """Run once after ``sync``: images/s and CPU seconds of the process tree per image."""
    os.sync()  # the previous run's dirty pages are not this run's cost
    cpu, start = tree_cpu_s(), time.perf_counter()
    run()
    return images / (time.perf_counter() - start), (tree_cpu_s() - cpu) / images


def interleaved(label: str, rounds: int, arms: dict[str, Callable[[], Measured]]) -> dict:
    """Run every arm once per round, rotated; print each against the first arm."""
    before = load_text()
    runs: dict[str, list[Measured]] = {name: [] for name in arms}
    names = list(arms)
    for number in range(rounds):
        for name in names[number % len(names) :] + names[: number % len(names)]:
            runs[name].append(arms[name]())
    base = runs[names[0]]
    rows = {}
    for name, found in runs.items():
        images = statistics.median(r[0] for r in found)
        ratios = [r[0] / b[0] for r, b in zip(found, base, strict=True)]
        cpu = 1e3 * statistics.median(r[1] for r in found)
        rows[name] = {"images_per_s": images, "ratios": ratios, "cpu_ms_per_image": cpu}
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        print(
            f"| {label} | {name} | {images:,.0f} | **{statistics.median(ratios):.2f}** "
            f"({shown}) | {cpu:.2f} | {before} -> {load_text()} |",
            flush=True,
        )
    return rows


HEADER = (
    "\n| part | arm | images/s | x first arm (rounds) | CPU ms/image | "
    "load before -> after |\n|---|---|---|---|---|---|"
)


def part_convert(args: argparse.Namespace, paths: list[str], tmp: Path) -> dict[str, Any]:
    """The raw, encoded and codecs parts: the converter against its peers."""
    workers, images, target = args.workers, len(paths), tmp / "bench.h5"
    resized = ConvertOptions(workers=workers, mode="raw", size=SIZE)
    rows = plan_storage(resized, None, num_samples=images).group_samples

    def converter(options: ConvertOptions) -> Callable[[], Measured]:
        def run() -> None:
            target.unlink(missing_ok=True)  # replacing a file makes ext4 flush it first
            convert(args.folder, target, options, overwrite=True)

        return lambda: timed(run, images)

    found: dict[str, Any] = {}
    if "raw" in args.parts:
        found["raw"] = interleaved(
            "raw 256x256",
            args.rounds,
            {"h5pack": converter(resized), "decode+resize": lambda: peer_resize(paths, workers)},
        )
    if "encoded" in args.parts:
        found["encoded"] = interleaved(
            "encoded",
            args.rounds,
            {
                "h5pack": converter(ConvertOptions(workers=workers, mode="encoded")),
                "read+decode": lambda: peer_read(paths, workers, decode=True),
                "read only": lambda: peer_read(paths, workers, decode=False),
            },
        )
    for text in args.codecs if "codecs" in args.parts else ():
        codec = parse_codec(text)
        options = ConvertOptions(workers=workers, mode="raw", size=SIZE, compression=codec)
        found[text] = interleaved(
            f"raw 256x256, {text}",
            args.rounds,
            {
                "h5pack": converter(options),
                "decode+resize+compress": partial(peer_compress, paths, workers, codec, rows),
            },
        )
    return found


def part_shards(args: argparse.Namespace, images: int, tmp: Path) -> dict[str, Any]:
    """One pack against pack sets of N shards, and against Dask."""
    options = ConvertOptions(size=SIZE, workers=args.workers)

    def fresh(run: Callable[[Path], Any]) -> Callable[[], Measured]:
        def once() -> None:
            out = Path(tempfile.mkdtemp(dir=tmp))
            try:
                run(out)
            finally:
                shutil.rmtree(out)

        return lambda: timed(once, images)

    arms = {"convert": fresh(lambda out: convert(args.folder, out / "all.h5", options))}
    for n in args.shards:
        arms[f"shards-{n}"] = fresh(
            lambda out, n=n: h5pack.convert_set(args.folder, out / "set", options, shards=n)
        )
    cluster = client = None
    try:
        import dask
        import distributed
    except ImportError:
        print("# Dask left out: distributed does not import")
    else:
        # as `h5pack convert --dask local` starts it (NOTE [ Dask's profiler ] in write/dask.py)
        with dask.config.set({"distributed.worker.profile.enabled": False}):
            cluster = distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            )
        client = distributed.Client(cluster)
        arms["dask-2"] = fresh(
            lambda out: h5pack.convert_on_dask(client, args.folder, out / "set", options, shards=4)
        )
    try:
        for arm in arms.values():  # warm the page cache, imports, the Dask workers
            arm()
        return interleaved("shards", args.rounds, arms)
    finally:
        if client is not None and cluster is not None:
            client.close()
            cluster.close()


def same_samples(merged: Path, fresh: Path) -> None:
    """Refuse a merged pack whose samples differ from a fresh conversion's (matched by path)."""
    with h5pack.PackReader(merged) as a, h5pack.PackReader(fresh) as b:
        where = {p: i for i, p in enumerate(b.paths)}
        if sorted(a.paths) != sorted(b.paths):
            raise SystemExit(f"{merged} and {fresh} do not hold the same files")
        read = "read_images" if a.meta.mode == "raw" else "read_stored"
        for lo in range(0, len(a), 256):
            idx = np.arange(lo, min(len(a), lo + 256))
            theirs = getattr(b, read)(np.array([where[a.paths[i]] for i in idx]))
            for i, x, y in zip(idx, getattr(a, read)(idx), theirs, strict=True):
                if not np.array_equal(x, y):
                    raise SystemExit(f"sample {i} ({a.paths[i]}) differs between the packs")


def part_merge(args: argparse.Namespace, images: int, tmp: Path) -> dict[str, Any]:
    """Merging a set's shards against converting the images again."""
    zstd = Compression(codec="zstd")
    found = {}
    shards, merged, fresh = tmp / "set", tmp / "merged.h5", tmp / "fresh.h5"
    for label, options in (
        # 1 MiB chunks: each small shard holds several, as real shards do
        ("encoded", ConvertOptions(mode="encoded", compression=zstd, chunk_bytes=2**20)),
        ("raw 256x256", ConvertOptions(mode="raw", size=SIZE, compression=zstd)),
    ):
        options = dataclasses.replace(options, workers=args.workers)
        h5pack.convert_set(args.folder, shards, options, shards=args.merge_shards, overwrite=True)
        found[label] = interleaved(
            f"merge {args.merge_shards} shards, {label}",
            args.rounds,
            {
                "convert": lambda o=options: timed(
                    lambda: convert(args.folder, fresh, o, overwrite=True), images
                ),
                "merge": lambda: timed(
                    lambda: h5pack.merge_packs(shards, merged, overwrite=True), images
                ),
            },
        )
        same_samples(merged, fresh)
        shutil.rmtree(shards)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="image folder (made with --make if absent)")
    parser.add_argument("--make", type=int, default=2000, help="images to generate if absent")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", nargs="+", default=["raw", "encoded", "codecs"], choices=PARTS)
    parser.add_argument("--codecs", nargs="+", default=list(DEFAULT_CODECS))
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--merge-shards", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.folder.exists():
        spec = SampleSpec(num_images=args.make, num_classes=10, size=(375, 500), size_jitter=0.3)
        make_image_folder(args.folder, spec, photos=PHOTOS, workers=args.workers)
    # The converter's write order (a seeded shuffle): the peers' chunks mix the same images.
    files = scan(args.folder).files
    paths = [str(files[i].path) for i in np.random.default_rng(0).permutation(len(files))]
    mean_kib = sum(os.path.getsize(p) for p in paths) / len(paths) / 1024
    print(f"# data: {len(paths)} JPEGs in {args.folder}, mean {mean_kib:.0f} KiB")
    print(f"# {machine_info(args.folder).describe()}; {args.workers} workers; medians of "
          f"{args.rounds} interleaved rounds")  # fmt: skip
    print(HEADER)
    results: dict[str, Any] = {"images": len(paths), "workers": args.workers}
    with tempfile.TemporaryDirectory(dir=args.folder.parent) as name:
        tmp = Path(name)
        results.update(part_convert(args, paths, tmp))
        if "shards" in args.parts:
            results["shards"] = part_shards(args, len(paths), tmp)
        if "merge" in args.parts:
            results["merge"] = part_merge(args, len(paths), tmp)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
