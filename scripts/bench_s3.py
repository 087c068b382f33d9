"""Remote packs on a local S3 server (issue 17 item 7, the read side).

    python scripts/bench_s3.py                       # defaults: see --help
    python scripts/bench_s3.py --samples 4096 --side 96 --rounds 3 --shards 128
    python scripts/bench_s3.py --shards 16 --rounds 5 --pin both --jpeg-images 1200

On ``rclone serve s3`` over a temporary folder (``h5pack.bench.s3local``), for one pack of
``--samples`` images (``--side`` squared, smooth noise, lz4, ``--chunk-samples`` per chunk)
and a set of ``--shards`` shards:

- open: requests (counted by the proxy) and seconds to open the pack (``PackReader``) and
  the set (``describe``, shards concurrently), medians of ``--rounds``;
- an epoch through ``make_loader`` (batch 256, ``num_workers=0``, chunk-aware order): GETs
  per chunk and bytes transferred over the chunks' stored bytes (counted by the proxy);
- first epochs, remote against the same loader on the local copy, side by side in each
  round (straight to rclone, no proxy; ``cache_disk_bytes=0``, so every remote round is a
  first epoch), for two packs:
  - ``raw96``: the pack above, batch 256, ``--workers`` DataLoader workers: a stress test
    (~25 us of CPU per image locally, so the transport dominates); remote with the lean
    ranged GETs (the default) and with botocore's (``ranged_gets="botocore"``); and every
    stored chunk fetched once with 8 GETs in flight, nothing decompressed (the transport's
    ceiling);
  - ``jpeg``: ``--jpeg-images`` ImageNet-like JPEGs (~500x375, quality 90, cut from
    ../shared/data/photos as scripts/bench_photos.py does, synthetic without it) in an
    encoded pack, read as training reads them: ``make_loader(pack, 64, size=224,
    flip=True)`` (RandomResizedCrop(224) + flip), ``--jpeg-workers`` workers;
- ``--pin``: ``off`` (every process on every CPU), ``on`` (the S3 server on the last CPU,
  the loader, its threads and its workers on the others: a bucket on other machines, as a
  user has it), or ``both`` (each round runs every arm both ways).

Reported per arm: images/s (median of rounds), remote/local (median of the per-round
ratios), and CPU microseconds per image of the loader's process tree (this process, its
threads and its workers) and of the server, separately. No figure is asserted: the tests
assert the counts (tests/test_remote.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from h5pack.bench.s3local import Bucket, FaultProxy, S3Server
from h5pack.bench.system import tree_cpu_s
from h5pack.core import format as fmt
from h5pack.core.layout import Compression


def smooth(count: int, side: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (count, 1, 1, 3), dtype=np.uint8)
    return list(base + rng.integers(0, 32, (count, side, side, 3), dtype=np.uint8))


def build_pack(path: Path, samples: int, side: int, chunk_samples: int) -> None:
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    options = ConvertOptions(chunk_samples=chunk_samples, compression=Compression(codec="lz4"))
    labels = [i % 10 for i in range(samples)]
    write_arrays(path, smooth(samples, side, 0), labels, options=options, overwrite=True)


def build_set(folder: Path, shards: int, per_shard: int) -> None:
    from h5pack.core.packset import PackSetManifest, ShardEntry, shard_name, write_manifest
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    folder.mkdir(parents=True, exist_ok=True)
    classes = [f"c{c}" for c in range(10)]
    entries = []
    for index in range(shards):
        path = folder / shard_name(index, shards)
        labels = [(index * per_shard + i) % 10 for i in range(per_shard)]
        write_arrays(
            path,
            smooth(per_shard, 8, index),
            labels,
            classes=classes,
            paths=[f"s{index}/{i}.png" for i in range(per_shard)],
            options=ConvertOptions(chunk_samples=16),
            overwrite=True,
        )
        entries.append(ShardEntry.of(path, fmt.load_meta(path)))
    write_manifest(
        PackSetManifest(
            root=folder,
            shards=tuple(entries),
            classes=tuple(classes),
            num_samples=shards * per_shard,
            seed=0,
            num_shards=shards,
        )
    )


def stored_bytes(path: Path) -> int:
    with fmt.open_h5(path) as handle:
        images = handle[fmt.IMAGES]
        return sum(images.id.get_chunk_info(i).size for i in range(images.id.get_num_chunks()))


SERVER_PID = [-1]  # the rclone process, left out of the loader's tree


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread)."""
    used = psutil.Process(pid).cpu_times()
    return float(used.user + used.system)


def pin(pid: int, cpus: set[int]) -> None:
    """Put every thread of ``pid`` on ``cpus`` (threads made later inherit it)."""
    for thread in psutil.Process(pid).threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile


@contextmanager
def placement(pinned: bool, server_pid: int) -> Iterator[None]:
    """Pinned: the server on the last CPU, this process (and what it forks) on the others."""
    every = set(os.sched_getaffinity(0)) | set(os.sched_getaffinity(server_pid))
    if pinned and len(every) > 1:
        last = max(every)
        pin(server_pid, {last})
        pin(os.getpid(), every - {last})
    else:
        pin(server_pid, every)
        pin(os.getpid(), every)
    try:
        yield
    finally:
        pin(server_pid, every)
        pin(os.getpid(), every)


def epoch(
    source: Any,
    storage_options: dict[str, object] | None,
    workers: int = 0,
    in_flight: int | None = None,
    *,
    batch_size: int = 256,
    **settings: Any,
) -> tuple[float, float, int]:
    """One first epoch: (seconds, CPU seconds of the loader's process tree, images)."""
    from h5pack.read.readahead import ReadAheadOptions
    from h5pack.training.loader import make_loader

    wall, cpu = time.perf_counter(), tree_cpu_s(exclude=SERVER_PID)
    # a remote pack without the disk cache: every round is a first epoch (the default cache
    # would serve rounds 2 and later, and later runs, from the local disk)
    remote: dict[str, Any] = {} if storage_options is None else {"cache_disk_bytes": 0}
    if storage_options is not None and in_flight is not None:
        remote["read_ahead"] = ReadAheadOptions(requests_in_flight=in_flight)
    loader = make_loader(
        source,
        batch_size,
        num_workers=workers,
        seed=0,
        storage_options=storage_options,
        **remote,
        **settings,
    )
    count = sum(int(images.shape[0]) for images, _ in loader)
    return time.perf_counter() - wall, tree_cpu_s(exclude=SERVER_PID) - cpu, count


def fetch_all(url: str, storage_options: dict[str, object]) -> tuple[float, float, int]:
    """Every stored chunk fetched once, 8 GETs in flight, nothing decompressed.

    The transport's ceiling for a first epoch: the server, the loopback and the client.
    Returns (seconds, CPU seconds of this process, GETs).
    """
    from h5pack.core.s3 import S3Source, resolve_options
    from h5pack.read.reader import PackReader, ReaderOptions

    options = ReaderOptions(storage_options=storage_options, cache_disk_bytes=0)
    with PackReader(url, options) as reader:
        index = reader.chunk_index
    assert index is not None  # a chunked pack on the direct path
    ranges = [(int(o), int(o) + int(n)) for o, n in zip(*index, strict=True)]
    source = S3Source(url, resolve_options({**storage_options, "max_in_flight": 8}))
    wall, cpu = time.perf_counter(), tree_cpu_s(exclude=SERVER_PID)
    source.read_ranges(ranges)
    return time.perf_counter() - wall, tree_cpu_s(exclude=SERVER_PID) - cpu, len(ranges)


def build_jpeg_pack(work: Path, images: int) -> Path:
    """ImageNet-like JPEGs (as scripts/bench_photos.py makes them) in an encoded pack."""
    from h5pack.synthetic import SampleSpec, make_image_folder
    from h5pack.write.convert import convert

    photos = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
    folder = work / "jpegs"
    spec = SampleSpec(
        num_images=images, num_classes=10, size=(375, 500), size_jitter=0.3, quality=90
    )
    make_image_folder(folder, spec, photos=photos if photos.is_dir() else None, workers=2)
    pack = work / "jpeg.h5"
    convert(folder, pack)
    return pack


Arm = Callable[[], tuple[float, float, int]]  # (seconds, loader CPU seconds, images)


def measure(arms: dict[str, Arm], rounds: int, placements: list[bool], server_pid: int) -> None:
    """Run every arm under every placement in each round; print the medians and ratios."""
    rows: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for _ in range(rounds):
        for pinned in placements:
            with placement(pinned, server_pid):
                for name, arm in arms.items():
                    served = process_cpu_s(server_pid)
                    wall, cpu, count = arm()
                    serving = process_cpu_s(server_pid) - served
                    rows.setdefault((name, pinned), []).append(
                        (count / wall, cpu / count * 1e6, serving / count * 1e6)
                    )
    # "server cap": the rate at which one CPU doing nothing but serve (its measured CPU per
    # image) would deliver the images, over the local copy's rate: a remote arm cannot pass
    # it when the server has one CPU (pinned), whatever the client does
    print(
        f"{'arm':34s} {'placement':9s} {'img/s':>8s} {'x local':>8s} "
        f"{'loader us/img':>14s} {'server us/img':>14s} {'server cap x local':>19s}"
    )
    for pinned in placements:
        local = rows[(next(iter(arms)), pinned)]
        local_rate = statistics.median(r[0] for r in local)
        for name in arms:
            found = rows[(name, pinned)]
            ratio = statistics.median(r[0] / b[0] for r, b in zip(found, local, strict=True))
            serving = statistics.median(r[2] for r in found)
            cap = f"{1e6 / serving / local_rate:19.2f}" if serving > 0 else " " * 19
            print(
                f"{name:34s} {'pinned' if pinned else 'unpinned':9s} "
                f"{statistics.median(r[0] for r in found):8.0f} {ratio:8.2f} "
                f"{statistics.median(r[1] for r in found):14.0f} {serving:14.0f} {cap}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--side", type=int, default=96)
    parser.add_argument("--chunk-samples", type=int, default=64)
    parser.add_argument("--shards", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (rates)")
    parser.add_argument(
        "--requests-in-flight", type=int, default=None, help="Read-ahead depth [default: sized]"
    )
    parser.add_argument("--pin", choices=["off", "on", "both"], default="both")
    parser.add_argument("--jpeg-images", type=int, default=1200, help="0: no jpeg arm")
    parser.add_argument("--jpeg-workers", type=int, default=2)
    args = parser.parse_args()
    from h5pack.read.packset import describe
    from h5pack.read.reader import PackReader, ReaderOptions

    with tempfile.TemporaryDirectory() as work, S3Server(Path(work) / "s3") as server:
        proxy = FaultProxy(server.endpoint)
        bucket = Bucket(server, proxy, "bench")
        direct: dict[str, object] = dict(server.storage_options())  # straight to rclone
        pack = Path(work) / "pack.h5"
        build_pack(pack, args.samples, args.side, args.chunk_samples)
        url = bucket.put(pack, "pack.h5")
        sets = Path(work) / "set"
        build_set(sets, args.shards, 32)
        set_url = bucket.put_tree(sets, "set")
        size, stored = pack.stat().st_size, stored_bytes(pack)
        print(f"pack: {args.samples} images {args.side}x{args.side}x3, lz4, {size / 2**20:.1f} MiB")

        opens, open_s, set_opens, set_s = [], [], [], []
        for _ in range(args.rounds):
            proxy.reset_counts()
            started = time.perf_counter()
            with PackReader(url, ReaderOptions(storage_options=bucket.storage_options)) as r:
                chunks = r.chunk_map.num_chunks
            open_s.append(time.perf_counter() - started)
            opens.append(proxy.reset_counts().total)
            started = time.perf_counter()
            view = describe(set_url, storage_options=bucket.storage_options)
            set_s.append(time.perf_counter() - started)
            set_opens.append(proxy.reset_counts().total)
            assert view.shards is not None
            assert len(view.shards) == args.shards
        print(
            f"open one pack: {statistics.median(opens):.0f} requests, "
            f"{statistics.median(open_s) * 1e3:.0f} ms (through the proxy)"
        )
        print(
            f"open a {args.shards}-shard set: {statistics.median(set_opens):.0f} requests "
            f"({statistics.median(set_opens) / args.shards:.2f} per shard), "
            f"{statistics.median(set_s):.2f} s (through the proxy)"
        )

        proxy.reset_counts()
        _, _, count = epoch(url, bucket.storage_options)
        counts = proxy.reset_counts()
        opened = statistics.median(opens)
        gets = counts.gets - opened
        print(
            f"epoch through the proxy: {count} images, {chunks} chunks, {gets:.0f} GETs after "
            f"open = {gets / chunks:.2f} per chunk; {counts.body_bytes / stored:.3f} x the "
            f"chunks' stored bytes ({counts.body_bytes} / {stored}, open's reads included)"
        )

        SERVER_PID[0] = server.pid
        botocore = {**direct, "ranged_gets": "botocore"}
        workers, depth = args.workers, args.requests_in_flight

        def fetch() -> tuple[float, float, int]:
            wall, cpu, _ = fetch_all(url, direct)
            return wall, cpu, args.samples

        arms: dict[str, Arm] = {
            f"raw96 local copy, {workers} workers": lambda: epoch(pack, None, workers),
            "raw96 remote (lean GETs)": lambda: epoch(url, direct, workers, depth),
            "raw96 remote (botocore GETs)": lambda: epoch(url, botocore, workers, depth),
            "raw96 fetch only, 8 in flight": fetch,
        }
        placements = {"off": [False], "on": [True], "both": [False, True]}[args.pin]
        print(
            f"first epochs, medians of {args.rounds} rounds (x local: median of per-round "
            f"ratios); CPUs {sorted(os.sched_getaffinity(0))}"
        )
        measure(arms, args.rounds, placements, server.pid)
        if args.jpeg_images:
            jpeg = build_jpeg_pack(Path(work), args.jpeg_images)
            jpeg_url = bucket.put(jpeg, "jpeg.h5")
            train = {"batch_size": 64, "size": 224, "flip": True}
            jw = args.jpeg_workers
            print(
                f"jpeg pack: {args.jpeg_images} JPEGs, {jpeg.stat().st_size / 2**20:.1f} MiB, "
                f"RandomResizedCrop(224) + flip, batch 64, {jw} workers"
            )
            measure(
                {
                    f"jpeg local copy, {jw} workers": lambda: epoch(jpeg, None, jw, **train),
                    "jpeg remote (lean GETs)": lambda: epoch(jpeg_url, direct, jw, **train),
                },
                args.rounds,
                placements,
                server.pid,
            )
        proxy.close()


if __name__ == "__main__":
    main()
