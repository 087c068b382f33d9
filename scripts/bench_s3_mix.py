"""A remote 3:1 mix's first epoch against the same mix on local disk, with and without its plan.

Two raw 96x96 lz4 packs (3,072 + 1,024 images, 64 per chunk) in a bucket of the local
``rclone serve s3`` server (``h5pack.bench.s3local``), read by
``make_loader(urls, 256, weights=[3, 1], cache_disk_bytes=0)``: every round a first epoch.
Arms: the local packs; the remote mix with its read plan (each source fetches its chunks
ahead by its part, ``ReadPlan.restricted``); the remote mix with the plan taken
away (``loader.dataset.planner = None``: each source fetches a batch's chunks when asked).
Rounds run the arms in turn, the order reversed every round; the first round warms up. Per
arm: the median images/s, the median CPU per image of the loader's process tree (the server
counted apart), and the median of the per-round ratios to the local arm. With
``--delay-ms D`` the remote arms go through the test proxy (``FaultProxy``), which holds
every GET D ms before serving it: a bucket's time to first byte, which the loopback lacks
(the proxy's CPU is then in the loader's process and counted with it).

    python scripts/bench_s3_mix.py --rounds 5
    python scripts/bench_s3_mix.py --rounds 5 --delay-ms 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_s3  # the pack builder

from h5pack.bench.s3local import Bucket, Fault, FaultProxy, S3Server
from h5pack.bench.system import tree_cpu_s
from h5pack.training.loader import make_loader


def first_epoch(
    sources: list[Any],
    storage_options: dict[str, object] | None,
    plan: bool,
    workers: int,
    server_pid: int,
) -> tuple[float, float]:
    """One epoch of the 3:1 mix: (images/s, CPU us per image of the loader's processes)."""
    remote: dict[str, Any] = (
        {"cache_disk_bytes": 0, "storage_options": storage_options} if storage_options else {}
    )
    loader = make_loader(sources, 256, weights=[3, 1], num_workers=workers, seed=0, **remote)
    if not plan:
        loader.dataset.planner = None
    wall, cpu = time.perf_counter(), tree_cpu_s(exclude=(server_pid,))
    count = sum(int(images.shape[0]) for images, _ in loader)
    elapsed, used = time.perf_counter() - wall, tree_cpu_s(exclude=(server_pid,)) - cpu
    return count / elapsed, used / count * 1e6


def main() -> None:
    """Print one table row per arm and worker count."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--delay-ms", type=float, default=0.0, help="each GET held so long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, S3Server(Path(work) / "s3") as server:
        proxy = FaultProxy(server.endpoint)
        bucket = Bucket(server, proxy, "bench")
        options: dict[str, object] = (
            dict(bucket.storage_options)  # through the proxy, which delays every GET
            if args.delay_ms > 0
            else dict(server.storage_options())  # straight to rclone
        )
        a, b = Path(work) / "a.h5", Path(work) / "b.h5"
        bench_s3.build_pack(a, 3072, 96, 64)
        bench_s3.build_pack(b, 1024, 96, 64)
        urls = [bucket.put(a, "a.h5"), bucket.put(b, "b.h5")]
        arms: dict[str, tuple[list[Any], dict[str, object] | None, bool]] = {
            "local packs": ([a, b], None, True),
            "remote, read ahead by the plan": (urls, options, True),
            "remote, no plan": (urls, options, False),
        }
        print("| workers | arm | images/s | CPU us/image | x local |")
        print("|---|---|---|---|---|")
        for workers in args.workers:
            found: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
            for round_ in range(args.rounds + 1):
                order = list(arms) if round_ % 2 else list(reversed(arms))
                for name in order:
                    sources, storage, plan = arms[name]
                    proxy.clear()
                    if args.delay_ms > 0:
                        delay = Fault("delay", delay_s=args.delay_ms / 1e3)
                        proxy.inject(delay, times=100_000)
                    found[name].append(first_epoch(sources, storage, plan, workers, server.pid))
            local = found["local packs"][1:]
            for name, rows in found.items():
                kept = rows[1:]
                ratio = statistics.median(r[0] / o[0] for r, o in zip(kept, local, strict=True))
                print(
                    f"| {workers} | {name} | {statistics.median(r[0] for r in kept):,.0f} | "
                    f"{statistics.median(r[1] for r in kept):.0f} | {ratio:.2f} |"
                )
        proxy.close()


if __name__ == "__main__":
    main()
