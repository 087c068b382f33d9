"""Remote packs on a local S3 server (issue 17 item 7, the read side).

    python scripts/bench_s3.py                       # defaults: see --help
    python scripts/bench_s3.py --samples 4096 --side 96 --rounds 3 --shards 128

On ``rclone serve s3`` over a temporary folder (``h5pack.bench.s3local``), for one pack of
``--samples`` images (``--side`` squared, smooth noise, lz4, ``--chunk-samples`` per chunk)
and a set of ``--shards`` shards:

- open: requests (counted by the proxy) and seconds to open the pack (``PackReader``) and
  the set (``describe``, shards concurrently), medians of ``--rounds``;
- an epoch through ``make_loader`` (batch 256, ``num_workers=0``, chunk-aware order): GETs
  per chunk and bytes transferred over the chunks' stored bytes (counted by the proxy);
- first-epoch rate, remote against the same loader on the local copy, side by side in
  each round (straight to rclone, no proxy; ``--workers`` DataLoader workers), and CPU
  seconds per image of this process (the main process only when workers > 0).

No figure is asserted: the tests assert the counts (tests/test_remote.py).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from h5pack.bench.s3local import Bucket, FaultProxy, S3Server
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


def epoch(
    source: Any,
    storage_options: dict[str, object] | None,
    workers: int = 0,
    in_flight: int | None = None,
) -> tuple[float, float, int]:
    """One first epoch: (seconds, CPU seconds of this process, images)."""
    from h5pack.read.readahead import ReadAheadOptions
    from h5pack.training.loader import make_loader

    wall, cpu = time.perf_counter(), time.process_time()
    # a remote pack without the disk cache: every round is a first epoch (the default cache
    # would serve rounds 2 and later, and later runs, from the local disk)
    remote: dict[str, Any] = {} if storage_options is None else {"cache_disk_bytes": 0}
    if storage_options is not None and in_flight is not None:
        remote["read_ahead"] = ReadAheadOptions(requests_in_flight=in_flight)
    loader = make_loader(
        source, 256, num_workers=workers, seed=0, storage_options=storage_options, **remote
    )
    count = sum(int(images.shape[0]) for images, _ in loader)
    return time.perf_counter() - wall, time.process_time() - cpu, count


def fetch_all(url: str, storage_options: dict[str, object]) -> tuple[float, float]:
    """Every stored chunk fetched once, 8 GETs in flight, nothing decompressed: (s, CPU s).

    The transport's ceiling for a first epoch: the server, the loopback and botocore.
    """
    from h5pack.core.s3 import S3Source, resolve_options
    from h5pack.read.reader import PackReader, ReaderOptions

    options = ReaderOptions(storage_options=storage_options, cache_disk_bytes=0)
    with PackReader(url, options) as reader:
        index = reader.chunk_index
    assert index is not None  # a chunked pack on the direct path
    ranges = [(int(o), int(o) + int(n)) for o, n in zip(*index, strict=True)]
    source = S3Source(url, resolve_options({**storage_options, "max_in_flight": 8}))
    wall, cpu = time.perf_counter(), time.process_time()
    source.read_ranges(ranges)
    return time.perf_counter() - wall, time.process_time() - cpu


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
    args = parser.parse_args()
    from h5pack.read.packset import describe
    from h5pack.read.reader import PackReader, ReaderOptions

    with tempfile.TemporaryDirectory() as work, S3Server(Path(work) / "s3") as server:
        proxy = FaultProxy(server.endpoint)
        bucket = Bucket(server, proxy, "bench")
        direct = server.storage_options()  # straight to rclone: botocore takes its 200s
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

        remote_rate, local_rate, remote_cpu, local_cpu = [], [], [], []
        fetch_rate, fetch_cpu = [], []
        for _ in range(args.rounds):
            wall, cpu, count = epoch(pack, None, args.workers)
            local_rate.append(count / wall)
            local_cpu.append(cpu / count)
            wall, cpu, count = epoch(url, direct, args.workers, args.requests_in_flight)
            remote_rate.append(count / wall)
            remote_cpu.append(cpu / count)
            wall, cpu = fetch_all(url, direct)
            fetch_rate.append(args.samples / wall)
            fetch_cpu.append(cpu / chunks)
        remote, local = statistics.median(remote_rate), statistics.median(local_rate)
        fetched = statistics.median(fetch_rate)
        print(
            f"first epoch, num_workers={args.workers}, medians of {args.rounds}: "
            f"remote {remote:.0f} img/s, "
            f"local copy {local:.0f} img/s, ratio {remote / local:.2f}; CPU per image "
            f"{statistics.median(remote_cpu) * 1e6:.0f} us remote, "
            f"{statistics.median(local_cpu) * 1e6:.0f} us local"
        )
        print(
            f"every chunk fetched, nothing decompressed (8 in flight): {fetched:.0f} img/s "
            f"({fetched / local:.2f} of the local copy; the remote loader reaches "
            f"{remote / fetched:.2f} of it), {statistics.median(fetch_cpu) * 1e3:.1f} ms CPU "
            "per GET"
        )
        proxy.close()


if __name__ == "__main__":
    main()
