"""The disk cache's budget sweep on a local S3 server (issue 17 item 7, the cache's part).

    python scripts/bench_s3_cache.py                       # defaults: see --help
    python scripts/bench_s3_cache.py --samples 4096 --side 128 --workers 2 --rounds 3

One remote pack (``--samples`` images of ``--side`` squared, smooth noise, zstd,
``--chunk-samples`` per chunk) on ``rclone serve s3`` through the counting proxy
(``h5pack.bench.s3local``), read by ``make_loader`` (chunk-aware order, ``--workers``
DataLoader workers) for two epochs with a fresh disk cache of 1/4, 1/2 and 1x the chunks'
stored bytes, evicting by Belady's rule and by LRU (the same code path,
``cache_eviction=``). For each: the bytes and GETs of epoch 2 (counted by the proxy) against
the bound ``(1 - budget/size) x size``; and, per round, the first epoch's rate (downloading,
read ahead) and the second's (from the disk cache) against the same loader on the local
copy, side by side (``--rate-workers`` workers), with CPU seconds per image.

No figure is asserted: the tests assert the counts (tests/test_remote_cache.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5pack.bench.s3local import Bucket, Fault, FaultProxy, S3Server
from h5pack.core.layout import Compression
from h5pack.read.direct import chunk_table

FRACTIONS = (0.25, 0.5, 1.0)


def build_pack(path: Path, samples: int, side: int, chunk_samples: int) -> int:
    """Write the pack; return the stored bytes of its image chunks."""
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (samples, 1, 1, 3), dtype=np.uint8)
    images = list(base + rng.integers(0, 48, (samples, side, side, 3), dtype=np.uint8))
    options = ConvertOptions(chunk_samples=chunk_samples, compression=Compression(codec="zstd"))
    write_arrays(path, images, [i % 10 for i in range(samples)], options=options, overwrite=True)
    with h5py.File(path, "r") as handle:
        table = chunk_table(handle["images"])
    assert table is not None
    return int(table.sizes.sum())


def run_epoch(loader: Any, epoch: int) -> tuple[int, float, float]:
    """Return images, wall seconds and this process's CPU seconds of one epoch."""
    loader.set_epoch(epoch)
    wall, cpu = time.perf_counter(), time.process_time()
    images = 0
    for batch, _labels in loader:
        images += len(batch)
    return images, time.perf_counter() - wall, time.process_time() - cpu


def make(source: str, args: argparse.Namespace, workers: int, **options: Any) -> Any:
    from h5pack.training.loader import make_loader

    return make_loader(
        source,
        args.batch_size,
        num_workers=workers,
        seed=args.seed,
        window_chunks=args.window_chunks,
        persistent_workers=True if workers else None,
        multiprocessing_context="fork" if workers else None,
        **options,
    )


def latency_sweep(
    url: str, storage: dict[str, Any], proxy: FaultProxy, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """First epochs without a disk cache, every GET delayed: how the depth hides latency.

    In this process (no workers), so that the read-ahead's counts can be read: chunks the
    reader asked for before they had arrived (``waited``), requests, the most in flight.
    """
    from h5pack.read.readahead import ReadAheadOptions

    found = []
    for depth in (1, 2, 4, 8, None):
        proxy.clear()
        proxy.inject(Fault("delay", delay_s=args.latency_ms / 1000), times=10**6)
        ahead = None if depth is None else ReadAheadOptions(requests_in_flight=depth)
        loader = make(url, args, 0, storage_options=storage, cache_disk_bytes=0, read_ahead=ahead)
        images, wall, used = run_epoch(loader, 0)
        stats = loader.dataset.reader.source.ahead().stats
        loader.close()
        found.append(
            {
                "requests_in_flight": depth or "auto",
                "images_s": images / wall,
                "cpu_ms_per_image": 1e3 * used / images,
                "served": stats.served,
                "waited": stats.waited,
                "requests": stats.requests,
                "most_in_flight": stats.most_in_flight,
            }
        )
    proxy.clear()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--side", type=int, default=128)
    parser.add_argument("--chunk-samples", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--rate-workers",
        type=int,
        default=0,
        help="Workers of the rate comparison (0: everything in this process, so its CPU "
        "time is the whole cost per image).",
    )
    parser.add_argument("--window-chunks", type=int, default=4)
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=20.0,
        help="Delay the proxy adds to every GET in the latency sweep (0: no sweep).",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="h5pack-bench-cache-") as tmp:
        root = Path(tmp)
        pack = root / "pack.h5"
        stored = build_pack(pack, args.samples, args.side, args.chunk_samples)
        with S3Server(root / "s3") as server, FaultProxy(server.endpoint) as proxy:
            bucket = Bucket(server, proxy, "bench")
            url = bucket.put(pack, "pack.h5")
            storage = bucket.storage_options
            sweep = []
            for fraction in FRACTIONS:
                budget = int(fraction * stored)
                row: dict[str, Any] = {"fraction": fraction, "budget_bytes": budget}
                for policy in ("belady", "lru"):
                    loader = make(
                        url,
                        args,
                        args.workers,
                        storage_options=storage,
                        cache_dir=root / f"cache-{fraction}-{policy}",
                        cache_disk_bytes=budget,
                        cache_eviction=policy,
                    )
                    proxy.reset_counts()
                    run_epoch(loader, 0)
                    first = proxy.reset_counts()
                    run_epoch(loader, 1)
                    second = proxy.reset_counts()
                    loader.close()
                    row[policy] = {
                        "epoch1_gets": first.gets,
                        "epoch1_bytes": first.body_bytes,
                        "epoch2_gets": second.gets,
                        "epoch2_bytes": second.body_bytes,
                    }
                row["bound_bytes"] = (1 - fraction) * stored
                sweep.append(row)

            # Second-epoch rate: remote with a cache that fits (1x) against the local copy,
            # side by side in each round; fresh cache directories per round. CPU seconds of
            # this process (all its threads) per image are steadier than the wall rate on a
            # shared machine.
            rates: dict[str, list[float]] = {"remote": [], "local": []}
            firsts: dict[str, list[float]] = {"remote": [], "local": []}
            cpu: dict[str, list[float]] = {"remote": [], "local": []}
            first_cpu: dict[str, list[float]] = {"remote": [], "local": []}
            for index in range(args.rounds):
                for kind in ("remote", "local"):
                    if kind == "remote":
                        loader = make(
                            url,
                            args,
                            args.rate_workers,
                            storage_options=storage,
                            cache_dir=root / f"rate-{index}",
                            cache_disk_bytes=stored * 2,
                        )
                    else:
                        loader = make(str(pack), args, args.rate_workers)
                    images, wall, used = run_epoch(loader, 0)
                    firsts[kind].append(images / wall)
                    first_cpu[kind].append(used / images)
                    images, wall, used = run_epoch(loader, 1)
                    loader.close()
                    rates[kind].append(images / wall)
                    cpu[kind].append(used / images)
            latency = latency_sweep(url, storage, proxy, args) if args.latency_ms > 0 else []
    remote, local = statistics.median(rates["remote"]), statistics.median(rates["local"])
    result = {
        "pack": {
            "samples": args.samples,
            "side": args.side,
            "chunk_samples": args.chunk_samples,
            "chunks": -(-args.samples // args.chunk_samples),
            "stored_bytes": stored,
        },
        "loader": {
            "batch_size": args.batch_size,
            "workers": args.workers,
            "window_chunks": args.window_chunks,
        },
        "sweep": sweep,
        "latency": latency,
        "epoch1_rate": {
            "remote_images_s": statistics.median(firsts["remote"]),
            "local_images_s": statistics.median(firsts["local"]),
            "ratio": statistics.median(firsts["remote"]) / statistics.median(firsts["local"]),
            "rounds_ratio": [r / q for r, q in zip(firsts["remote"], firsts["local"], strict=True)],
            "cpu_ms_per_image": {k: 1e3 * statistics.median(v) for k, v in first_cpu.items()},
        },
        "epoch2_rate": {
            "remote_images_s": remote,
            "local_images_s": local,
            "ratio": remote / local,
            "rounds_ratio": [r / q for r, q in zip(rates["remote"], rates["local"], strict=True)],
            "workers": args.rate_workers,
            "cpu_ms_per_image": {k: 1e3 * statistics.median(v) for k, v in cpu.items()},
        },
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    mib = 2**20
    print(
        f"pack: {args.samples} images {args.side}x{args.side}, zstd, {result['pack']['chunks']} "
        f"chunks, {stored / mib:.1f} MiB stored; loader: batch {args.batch_size}, "
        f"{args.workers} workers"
    )
    print("| budget | bound (MiB) | Belady epoch 2 (MiB, GETs) | LRU epoch 2 (MiB, GETs) |")
    print("|---|---|---|---|")
    for row in sweep:
        b, lru = row["belady"], row["lru"]
        print(
            f"| {row['fraction']:g} x pack | {row['bound_bytes'] / mib:.1f} | "
            f"{b['epoch2_bytes'] / mib:.1f} ({b['epoch2_gets']}) | "
            f"{lru['epoch2_bytes'] / mib:.1f} ({lru['epoch2_gets']}) |"
        )
    for row in latency:
        print(
            f"latency {args.latency_ms:g} ms, requests in flight {row['requests_in_flight']}: "
            f"{row['images_s']:.0f} images/s, reader waited for {row['waited']} of "
            f"{row['served']} chunks, {row['requests']} requests, at most "
            f"{row['most_in_flight']} in flight"
        )
    first = result["epoch1_rate"]
    print(
        f"epoch 1 (downloading, read ahead): remote {first['remote_images_s']:.0f} images/s, "
        f"local copy {first['local_images_s']:.0f}, ratio {first['ratio']:.2f} (rounds: "
        f"{', '.join(f'{r:.2f}' for r in first['rounds_ratio'])}); CPU per image "
        f"{first['cpu_ms_per_image']['remote']:.3f} vs {first['cpu_ms_per_image']['local']:.3f} ms"
    )
    rate = result["epoch2_rate"]
    print(
        f"epoch 2, cache fits: remote {remote:.0f} images/s, local copy {local:.0f} images/s, "
        f"ratio {rate['ratio']:.2f} (rounds: "
        f"{', '.join(f'{r:.2f}' for r in rate['rounds_ratio'])}); CPU per image "
        f"(this process, {args.rate_workers} workers) "
        f"{rate['cpu_ms_per_image']['remote']:.3f} vs {rate['cpu_ms_per_image']['local']:.3f} ms"
    )


if __name__ == "__main__":
    main()
