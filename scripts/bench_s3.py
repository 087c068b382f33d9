"""Remote packs on a local S3 server: open, first epochs, the disk cache, a peer, uploads.

    python scripts/bench_s3.py --only open first --samples 4096 --side 96 --shards 16 --rounds 5
    python scripts/bench_s3.py --only cache --json sweep.json
    python scripts/bench_s3.py --only peer --images 8000 --size 128 --workers 2
    python scripts/bench_s3.py --only upload --images 600 --size 128 --shards 4
    python scripts/bench_s3.py --only mix --rounds 5 --latency-ms 20

On ``rclone serve s3`` over a temporary folder (``tests.s3local``), through its
counting proxy where requests are counted, straight to rclone where rates are timed. Parts
(``--only``):

- ``open``: requests and seconds to open one pack (``--samples`` images of ``--side``
  squared, smooth noise, lz4, ``--chunk-samples`` per chunk) and a ``--shards``-shard set;
  then one epoch through ``make_loader`` (batch 256, in process): GETs per chunk and bytes
  over the chunks' stored bytes;
- ``first``: first epochs (``disk_cache_bytes=0``) remote against the local copy, side by
  side in each round: the raw pack above (lean ranged GETs, botocore's, and every chunk
  fetched once with nothing decompressed: the transport's ceiling) and ``--jpeg-images``
  photos in an encoded pack read as training reads them (``size=224, flip=True``);
  ``--pin on`` puts the server on the last CPU (a bucket on other machines), ``both`` runs
  each round both ways;
- ``cache``: a zstd pack read for two epochs with a disk cache of 1/4, 1/2 and 1x its
  stored bytes, Belady against LRU: epoch 2's bytes and GETs against the bound
  ``(1 - budget/size) x size``; then epoch 1 and 2 rates remote against local, and first
  epochs with every GET delayed ``--latency-ms`` at each read-ahead depth;
- ``peer``: an encoded set converted into the bucket against WebDataset tar shards of the
  same JPEGs from the same server (``pipe:rclone cat``), local copies of both beside them;
- ``upload``: converting into the bucket against converting locally (one pack, a set, the
  set again): seconds and every request counted;
- ``mix``: a 3:1 mix of two raw 96x96 lz4 packs (3,072 + 1,024 images) in its first epoch,
  local against remote read ahead by the mix's plan and remote without it
  (``loader.dataset.planner = None``), every GET delayed ``--latency-ms`` (0: none).

Every rate comes with the CPU microseconds per image of the loader's process tree (the
server counted apart). No figure is asserted: the tests assert the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from h5pack.bench.system import tree_cpu_s
from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.core.packset import PackSetManifest, ShardEntry, shard_name, write_manifest
from h5pack.core.store import open_store
from h5pack.errors import install_line
from h5pack.read.reader import ReaderOptions
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.epochs import EpochSpec
from h5pack.training.loader import make_loader
from h5pack.write.convert import convert, convert_set, write_arrays
from h5pack.write.options import ConvertOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3local import Bucket, Fault, FaultProxy, S3Server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loaders import PHOTOS, jpeg_samples, stack, wds_tuple, write_shards

PARTS = ("open", "first", "cache", "peer", "upload", "mix")
SERVER_PID = [-1]  # the rclone process, left out of the loader's tree


# -- data ---------------------------------------------------------------------------------------
def build_pack(path: Path, samples: int, side: int, chunk_samples: int, codec: str) -> int:
    """Write a pack of smooth noise; return the stored bytes of its image chunks."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (samples, 1, 1, 3), dtype=np.uint8)
    images = list(base + rng.integers(0, 32, (samples, side, side, 3), dtype=np.uint8))
    options = ConvertOptions(chunk_samples=chunk_samples, compression=Compression(codec=codec))
    write_arrays(path, images, [i % 10 for i in range(samples)], options=options, overwrite=True)
    with fmt.open_h5(path) as handle:
        chunks = handle[fmt.IMAGES].id
        return sum(chunks.get_chunk_info(i).size for i in range(chunks.get_num_chunks()))


def photos(work: Path, images: int, size: tuple[int, int] | None = None) -> Path:
    """ImageNet-like JPEGs (as scripts/bench_loaders.py makes them), or ``size`` exactly."""
    folder = work / f"jpegs-{images}"
    spec = SampleSpec(
        num_images=images,
        num_classes=10,
        size=size or (375, 500),
        size_jitter=0.0 if size else 0.3,
        quality=90,
    )
    make_image_folder(folder, spec, photos=PHOTOS, workers=2, overwrite=True)
    return folder


# -- measuring --------------------------------------------------------------------------------
def epochs(loader: Any, count: int = 1) -> list[tuple[float, float, int]]:
    """Run ``count`` epochs: (seconds, CPU seconds of the loader's tree, images) each."""
    found = []
    for number in range(count):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(number)
        wall, cpu = time.perf_counter(), tree_cpu_s(exclude=SERVER_PID)
        images = sum(len(batch[1]) for batch in loader)
        found.append((time.perf_counter() - wall, tree_cpu_s(exclude=SERVER_PID) - cpu, images))
    return found


def first_epoch(source: Any, storage: dict[str, Any] | None, **settings: Any) -> tuple:
    """A fresh loader's first epoch (no disk cache: every round is a first epoch)."""
    remote = (
        {}
        if storage is None
        else {"storage_options": storage, "reader": ReaderOptions(disk_cache_bytes=0)}
    )
    wall, cpu = time.perf_counter(), tree_cpu_s(exclude=SERVER_PID)
    loader = make_loader(source, settings.pop("batch_size", 256), seed=0, **remote, **settings)
    images = sum(len(batch[1]) for batch in loader)
    return time.perf_counter() - wall, tree_cpu_s(exclude=SERVER_PID) - cpu, images


def pin(pid: int, cpus: set[int]) -> None:
    for thread in psutil.Process(pid).threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile


@contextmanager
def placement(pinned: bool, server_pid: int) -> Iterator[None]:
    """Pinned: the server on the last CPU, this process (and what it forks) on the others."""
    every = set(os.sched_getaffinity(0)) | set(os.sched_getaffinity(server_pid))
    last = max(every)
    pin(server_pid, {last} if pinned and len(every) > 1 else every)
    pin(os.getpid(), every - {last} if pinned and len(every) > 1 else every)
    try:
        yield
    finally:
        pin(server_pid, every)
        pin(os.getpid(), every)


def side_by_side(
    arms: dict[str, Callable[[], tuple]], rounds: int, placements: list[bool], server_pid: int
) -> None:
    """Run every arm under every placement in each round; print medians and ratios."""
    rows: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for _ in range(rounds):
        for pinned in placements:
            with placement(pinned, server_pid):
                for name, arm in arms.items():
                    served = sum(psutil.Process(server_pid).cpu_times()[:2])
                    wall, cpu, count = arm()
                    serving = sum(psutil.Process(server_pid).cpu_times()[:2]) - served
                    rows.setdefault((name, pinned), []).append(
                        (count / wall, 1e6 * cpu / count, 1e6 * serving / count)
                    )
    print(
        f"{'arm':34s} {'placement':9s} {'img/s':>8s} {'x local':>8s} {'CPU us/img':>11s} "
        f"{'server us/img':>14s}"
    )
    for pinned in placements:
        local = rows[(next(iter(arms)), pinned)]
        for name in arms:
            found = rows[(name, pinned)]
            ratio = statistics.median(r[0] / b[0] for r, b in zip(found, local, strict=True))
            print(
                f"{name:34s} {'pinned' if pinned else 'unpinned':9s} "
                f"{statistics.median(r[0] for r in found):8.0f} {ratio:8.2f} "
                f"{statistics.median(r[1] for r in found):11.0f} "
                f"{statistics.median(r[2] for r in found):14.0f}"
            )


# -- parts --------------------------------------------------------------------------------------
def part_open(args: argparse.Namespace, work: Path, bucket: Bucket, proxy: FaultProxy) -> None:
    from h5pack.read.packset import describe
    from h5pack.read.reader import PackReader, ReaderOptions

    pack = work / "pack.h5"
    stored = build_pack(pack, args.samples, args.side, args.chunk_samples, "lz4")
    url = bucket.put(pack, "pack.h5")
    folder = work / "set"
    folder.mkdir()
    for index in range(args.shards):
        build_pack(folder / shard_name(index, args.shards), 32, 8, 16, "none")
    files = sorted(folder.glob("*.h5"))
    entries = tuple(ShardEntry.of(p, fmt.load_meta(p)) for p in files)
    classes = fmt.load_meta(files[0]).classes
    write_manifest(
        PackSetManifest(
            root=folder,
            shards=entries,
            classes=tuple(classes),
            num_samples=32 * args.shards,
            seed=0,
            num_shards=args.shards,
        )
    )
    set_url = bucket.put_tree(folder, "set")
    storage = bucket.storage_options
    opens: list[tuple[int, float, int, float]] = []
    for _ in range(args.rounds):
        proxy.reset_counts()
        started = time.perf_counter()
        with PackReader(url, ReaderOptions(storage_options=storage)) as reader:
            chunks = reader.chunk_map.num_chunks
        one = (proxy.reset_counts().total, time.perf_counter() - started)
        started = time.perf_counter()
        describe(set_url, store=open_store(set_url, storage))
        opens.append((*one, proxy.reset_counts().total, time.perf_counter() - started))
    requests, seconds, set_requests, set_seconds = (
        statistics.median(c) for c in zip(*opens, strict=True)
    )
    print(f"open one pack: {requests:.0f} requests, {1e3 * seconds:.0f} ms (through the proxy)")
    print(
        f"open a {args.shards}-shard set: {set_requests:.0f} requests "
        f"({set_requests / args.shards:.2f} per shard), {set_seconds:.2f} s"
    )
    proxy.reset_counts()
    first_epoch(url, storage)
    counts = proxy.reset_counts()
    gets = counts.gets - requests
    print(
        f"epoch: {chunks} chunks, {gets:.0f} GETs after open = {gets / chunks:.2f} per chunk; "
        f"{counts.body_bytes / stored:.3f} x the chunks' stored bytes"
    )


def part_first(args: argparse.Namespace, work: Path, bucket: Bucket, server: S3Server) -> None:
    from h5pack.core.s3 import S3Source, S3Store
    from h5pack.read.reader import PackReader, ReaderOptions

    pack = work / "first.h5"
    build_pack(pack, args.samples, args.side, args.chunk_samples, "lz4")
    url = bucket.put(pack, "first.h5")
    direct: dict[str, Any] = dict(server.storage_options())  # straight to rclone
    botocore = {**direct, "ranged_gets": "botocore"}
    workers = {"num_workers": args.workers}

    def fetch() -> tuple[float, float, int]:
        with PackReader(url, ReaderOptions(storage_options=direct, disk_cache_bytes=0)) as r:
            index = r.chunk_index
        assert index is not None  # a chunked pack on the direct path
        ranges = [(int(o), int(o) + int(n)) for o, n in zip(*index, strict=True)]
        source = S3Source(url, S3Store.of({**direct, "max_in_flight": 8}).options)
        wall, cpu = time.perf_counter(), tree_cpu_s(exclude=SERVER_PID)
        source.read_ranges(ranges)
        return time.perf_counter() - wall, tree_cpu_s(exclude=SERVER_PID) - cpu, args.samples

    placements = {"off": [False], "on": [True], "both": [False, True]}[args.pin]
    for name, storage in (("lean", direct), ("botocore", botocore)):  # the client's own cost
        with PackReader(url, ReaderOptions(storage_options=direct, disk_cache_bytes=0)) as r:
            offsets, sizes = r.chunk_index or ((), ())
        source = S3Source(url, S3Store.of({**storage, "max_in_flight": 8}).options)
        wall, cpu = time.perf_counter(), time.process_time()
        source.read_ranges([(int(o), int(o) + int(n)) for o, n in zip(offsets, sizes, strict=True)])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(
            f"{name} GETs: {1e3 * cpu / len(sizes):.2f} ms CPU per "
            f"{sum(sizes) / len(sizes) / 2**20:.1f} MiB GET, {sum(sizes) / wall / 2**20:.0f} MiB/s "
            "with 8 in flight"
        )
    side_by_side(
        {
            f"raw{args.side} local copy": lambda: first_epoch(pack, None, **workers),
            f"raw{args.side} remote (lean GETs)": lambda: first_epoch(url, direct, **workers),
            f"raw{args.side} remote (botocore)": lambda: first_epoch(url, botocore, **workers),
            f"raw{args.side} fetch only, 8 in flight": fetch,
        },
        args.rounds,
        placements,
        server.pid,
    )
    if args.jpeg_images:
        jpeg = work / "jpeg.h5"
        convert(photos(work, args.jpeg_images), jpeg)
        jpeg_url = bucket.put(jpeg, "jpeg.h5")
        train = {"batch_size": 64, "size": 224, "flip": True, "num_workers": args.jpeg_workers}
        side_by_side(
            {
                "jpeg local copy": lambda: first_epoch(jpeg, None, **train),
                "jpeg remote (lean GETs)": lambda: first_epoch(jpeg_url, direct, **train),
            },
            args.rounds,
            placements,
            server.pid,
        )


def part_cache(
    args: argparse.Namespace, work: Path, bucket: Bucket, proxy: FaultProxy
) -> dict[str, Any]:
    from h5pack.read.readahead import ReadAheadOptions

    pack = work / "cache.h5"
    stored = build_pack(pack, args.samples, args.side, args.chunk_samples, "zstd")
    url = bucket.put(pack, "cache.h5")
    storage = bucket.storage_options
    batch = EpochSpec(batch_size=args.batch_size, window_chunks=4)

    def loader(source: Any, workers: int, storage_options: Any = None, **reader: Any) -> Any:
        persistent = {"persistent_workers": True} if workers else {}
        return make_loader(
            source,
            batch,
            num_workers=workers,
            seed=0,
            storage_options=storage_options,
            reader=ReaderOptions(**reader),
            **persistent,
        )

    sweep: list[dict[str, Any]] = []
    print("| budget | bound MiB | Belady epoch 2 MiB (GETs) | LRU epoch 2 MiB (GETs) |")
    print("|---|---|---|---|")
    for fraction in (0.25, 0.5, 1.0):
        row: dict[str, Any] = {"fraction": fraction, "bound": (1 - fraction) * stored}
        for policy in ("belady", "lru"):
            reading = loader(
                url,
                args.workers,
                storage_options=storage,
                disk_cache_eviction=policy,
                disk_cache_dir=work / f"c-{fraction}-{policy}",
                disk_cache_bytes=int(fraction * stored),
            )
            epochs(reading, 1)
            proxy.reset_counts()
            reading.set_epoch(1)
            sum(1 for _ in reading)
            counts = proxy.reset_counts()
            reading.close()
            row[policy] = (counts.body_bytes / 2**20, counts.gets)
        sweep.append(row)
        b, lru = row["belady"], row["lru"]
        print(
            f"| {fraction:g} x pack | {row['bound'] / 2**20:.1f} | {b[0]:.1f} ({b[1]}) | "
            f"{lru[0]:.1f} ({lru[1]}) |"
        )
    rates: dict[str, list[tuple]] = {"remote": [], "local": []}
    for index in range(args.rounds):
        remote = loader(
            url,
            0,
            storage_options=storage,
            disk_cache_dir=work / f"rate-{index}",
            disk_cache_bytes=2 * stored,
        )
        rates["remote"].append(tuple(epochs(remote, 2)))
        rates["local"].append(tuple(epochs(loader(pack, 0), 2)))
    for number in (0, 1):
        shown = {
            kind: (
                statistics.median(r[number][2] / r[number][0] for r in runs),
                statistics.median(1e6 * r[number][1] / r[number][2] for r in runs),
            )
            for kind, runs in rates.items()
        }
        print(
            f"epoch {number + 1}: remote {shown['remote'][0]:.0f} images/s "
            f"({shown['remote'][1]:.0f} us CPU/image), local {shown['local'][0]:.0f} "
            f"({shown['local'][1]:.0f} us)"
        )
    for depth in (1, 2, 4, 8, None) if args.latency_ms > 0 else ():
        proxy.clear()
        proxy.inject(Fault("delay", delay_s=args.latency_ms / 1000), times=10**6)
        ahead = None if depth is None else ReadAheadOptions(requests_in_flight=depth)
        reading = loader(url, 0, storage_options=storage, disk_cache_bytes=0, read_ahead=ahead)
        ((wall, _, images),) = epochs(reading, 1)
        stats = reading.dataset.reader.source.ahead().stats
        reading.close()
        print(
            f"latency {args.latency_ms:g} ms, {depth or 'auto'} in flight: "
            f"{images / wall:.0f} images/s, waited for {stats.waited} of {stats.served} "
            f"chunks, {stats.requests} requests"
        )
    proxy.clear()
    return {"stored_bytes": stored, "sweep": sweep}


def part_peer(args: argparse.Namespace, work: Path, bucket: Bucket, proxy: FaultProxy) -> None:
    try:
        import webdataset as wds
    except ImportError as err:
        print(f"# the peer part needs webdataset ({install_line('peers')}): {err}")
        return
    folder = photos(work, args.images, (args.size, args.size))
    samples = jpeg_samples(folder)
    stored = sum(len(data) for data, _ in samples)
    tars = write_shards(samples, work / "wds", per_shard=-(-len(samples) // args.shards))
    keys = [f"wds/{Path(t).name}" for t in tars]
    for tar, key in zip(tars, keys, strict=True):
        bucket.put(tar, key)
    encoded = ConvertOptions(mode="encoded", workers=args.workers or None)
    convert_set(folder, work / "h5", encoded, shards=args.shards)
    store = {**bucket.storage_options, "read_timeout_s": 30.0}
    convert_set(folder, bucket.url("h5/"), encoded, shards=args.shards, storage_options=store)
    server = bucket.server
    rclone = Path(sys.executable).parent / "rclone"
    flags = (
        f"--config /dev/null --s3-provider Other --s3-endpoint {proxy.endpoint} "
        f"--s3-access-key-id {server.access_key} --s3-secret-access-key {server.secret_key}"
    )
    keep = {"persistent_workers": True} if args.workers else {}

    def webdataset(urls: list[str]) -> Any:
        pipeline = (
            wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
            .shuffle(1000)
            .map(wds_tuple)
            .batched(args.batch_size, collation_fn=stack, partial=True)
        )
        return wds.WebLoader(pipeline, batch_size=None, num_workers=args.workers, **keep)

    def h5(source: Any, **options: Any) -> Any:
        shutil.rmtree(work / "cache", ignore_errors=True)  # every run starts cold
        return make_loader(source, args.batch_size, num_workers=args.workers, seed=0, **options)

    peers: dict[str, Callable[[], Any]] = {
        "h5pack, s3:// set": lambda: h5(
            bucket.url("h5/"),
            storage_options=bucket.storage_options,
            reader=ReaderOptions(disk_cache_dir=work / "cache"),
        ),
        "WebDataset, pipe:rclone cat": lambda: webdataset(
            [f"pipe:{rclone} cat {flags} :s3:{bucket.name}/{k}" for k in keys]
        ),
        "h5pack, local set": lambda: h5(work / "h5"),
        "WebDataset, local tars": lambda: webdataset(tars),
    }
    print(
        f"{'loader':30s} {'epoch':>5s} {'images/s':>9s} {'CPU us/img':>10s} {'GETs':>6s} "
        f"{'bytes/JPEG bytes':>16s}"
    )
    for _ in range(args.rounds):
        for name, make in peers.items():
            proxy.reset_counts()
            loader = make()
            for number, (wall, cpu, images) in enumerate(epochs(loader, args.epochs)):
                counts = proxy.reset_counts()
                print(
                    f"{name:30s} {number + 1:5d} {images / wall:9,.0f} "
                    f"{1e6 * cpu / images:10,.0f} {counts.gets:6d} "
                    f"{counts.body_bytes / stored:16.2f}"
                )
            del loader


def part_upload(args: argparse.Namespace, work: Path, bucket: Bucket, proxy: FaultProxy) -> None:
    images = photos(work, args.images, (args.size, args.size))
    options = ConvertOptions(workers=args.workers or None, mode="raw")
    store = {**bucket.storage_options, "read_timeout_s": 30.0}
    n = args.shards

    def to_bucket(key: str) -> Any:
        return convert_set(images, bucket.url(key), options, shards=n, storage_options=store)

    runs: list[tuple[str, Callable[[], Any]]] = [
        ("one pack, local", lambda: convert(images, work / "local.h5", options)),
        (
            "one pack, bucket",
            lambda: convert(images, bucket.url("up.h5"), options, storage_options=store),
        ),
        (f"{n} shards, local", lambda: convert_set(images, work / "up", options, shards=n)),
        (f"{n} shards, bucket", lambda: to_bucket("up/")),
        (f"{n} shards, bucket, rerun", lambda: to_bucket("up/")),
    ]
    print(f"{'conversion':24s} {'s':>6s}  requests (bytes sent back)")
    for name, run in runs:
        proxy.reset_counts()
        started = time.perf_counter()
        run()
        elapsed = time.perf_counter() - started
        counts = proxy.reset_counts()
        said = ", ".join(f"{k} {v}" for k, v in sorted(counts.requests.items())) or "none"
        print(f"{name:24s} {elapsed:6.2f}  {said} ({counts.body_bytes} B)")


def part_mix(args: argparse.Namespace, work: Path, bucket: Bucket, proxy: FaultProxy) -> None:
    a, b = work / "mix-a.h5", work / "mix-b.h5"
    build_pack(a, 3072, 96, 64, "lz4")
    build_pack(b, 1024, 96, 64, "lz4")
    urls = [bucket.put(a, "mix-a.h5"), bucket.put(b, "mix-b.h5")]
    storage = dict(bucket.storage_options)  # through the proxy, which delays every GET

    def mix(sources: list[Any], plan: bool) -> Callable[[], tuple]:
        def run() -> tuple:
            proxy.clear()
            if args.latency_ms > 0:
                proxy.inject(Fault("delay", delay_s=args.latency_ms / 1e3), times=100_000)
            remote = (
                {}
                if sources[0] == a
                else {"storage_options": storage, "reader": ReaderOptions(disk_cache_bytes=0)}
            )
            loader = make_loader(
                sources, 256, weights=[3, 1], num_workers=args.workers, seed=0, **remote
            )
            if not plan:
                loader.dataset.planner = None
            ((wall, cpu, images),) = epochs(loader, 1)
            return wall, cpu, images

        return run

    side_by_side(
        {
            "local packs": mix([a, b], True),
            "remote, read ahead by the plan": mix(urls, True),
            "remote, no plan": mix(urls, False),
        },
        args.rounds,
        [False],
        bucket.server.pid,
    )
    proxy.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=PARTS, default=["open", "first", "cache"])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--side", type=int, default=96)
    parser.add_argument("--chunk-samples", type=int, default=64)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    parser.add_argument("--batch-size", type=int, default=128, help="cache and peer parts")
    parser.add_argument("--pin", choices=["off", "on", "both"], default="both")
    parser.add_argument("--jpeg-images", type=int, default=1200, help="0: no jpeg arm")
    parser.add_argument("--jpeg-workers", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="0: no latency sweep")
    parser.add_argument("--images", type=int, default=2000, help="peer and upload parts")
    parser.add_argument("--size", type=int, default=128, help="peer and upload parts")
    parser.add_argument("--epochs", type=int, default=3, help="peer part")
    parser.add_argument("--json", type=Path, default=None, help="the cache part's figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="h5pack-bench-s3-") as tmp:
        work = Path(tmp)
        with S3Server(work / "s3") as server, FaultProxy(server.endpoint) as proxy:
            SERVER_PID[0] = server.pid
            bucket = Bucket(server, proxy, "bench")
            for part in args.only:
                print(f"\n## {part}\n")
                if part == "first":
                    part_first(args, work, bucket, server)
                elif part == "cache":
                    found = part_cache(args, work, bucket, proxy)
                    if args.json is not None:
                        args.json.write_text(json.dumps(found, indent=1))
                else:
                    parts = {"open": part_open, "peer": part_peer, "upload": part_upload}
                    {**parts, "mix": part_mix}[part](args, work, bucket, proxy)


if __name__ == "__main__":
    main()
