"""Conversion scaling (issue 11): a pack set against one pack, on the same folder.

Every round converts the same folder with each variant, in a rotated order (interleaved),
and the medians over rounds are reported with their ratio to the plain conversion:

- ``convert``: ``h5pack.convert`` into one pack (``--workers`` processes);
- ``shards-N``: ``h5pack.convert_set(..., shards=N)``, the N shards one after the other
  in this process, sharing one pool of ``--workers`` processes (the manifest included);
- ``dask-2``: ``h5pack.convert_on_dask`` with ``--dask-shards`` shards on a
  ``distributed.LocalCluster`` of 2 worker processes of 1 thread (started once, outside
  the timed region, as a cluster a user already has; its start time is printed), without
  Dask's statistical profiler, as ``--dask local`` starts it (``--dask-profile``: with).

Each run writes into a fresh directory (the page cache, after ``sync``), scans the folder,
probes nothing (``--size H W`` makes every image one size) and checksums every sample.
Besides wall time, the CPU of each run is reported (this process and its pools, plus the
Dask workers' own): on a machine shared with other work, wall time is mostly noise and
CPU per image is what shows a cost. Target (issue 11): shards cost no more than 10% of
total throughput.

Usage::

    python scripts/bench_shards.py /tmp/shards-bench/images --make 1000 --rounds 3

Data: ``--make`` ImageNet-like JPEGs (``h5pack.synthetic.make_image_folder`` cut from
``../shared/data/photos`` when present, 10 classes, around 500x375 with +-30% jitter)
when the folder is absent. Prints a markdown table and the load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from h5pack import ConvertOptions, convert, convert_on_dask, convert_set
from h5pack.synthetic import SampleSpec, make_image_folder

SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None


def load_text() -> str:
    """Return the load averages (1, 5, 15 min)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def own_cpu_s() -> float:
    """Return the CPU seconds of this process and its reaped children (the pools)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def worker_cpu_s() -> float:
    """Return the CPU seconds of this process (run in each Dask worker)."""
    times = os.times()
    return times.user + times.system


def timed(
    run: Callable[[Path], Any], scratch: Path, client: Any, dask: bool
) -> tuple[float, float]:
    """Return the seconds and CPU seconds ``run`` takes to write into a fresh directory.

    CPU: this process and its pools (reaped at the end of each conversion), plus, for a
    Dask run, the cluster's worker processes (asked before and after).
    """
    target = Path(tempfile.mkdtemp(dir=scratch))
    subprocess.run(["sync"], check=False)
    workers_before = sum(client.run(worker_cpu_s).values()) if dask else 0.0
    cpu_before = own_cpu_s()
    started = time.perf_counter()
    run(target)
    elapsed = time.perf_counter() - started
    cpu = own_cpu_s() - cpu_before
    if dask:
        cpu += sum(client.run(worker_cpu_s).values()) - workers_before
    shutil.rmtree(target)
    return elapsed, cpu


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--make", type=int, default=1000, help="images to make if absent")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, nargs=2, default=(256, 256), metavar=("H", "W"))
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--dask-shards", type=int, default=4)
    parser.add_argument("--no-dask", action="store_true")
    parser.add_argument(
        "--dask-profile", action="store_true", help="keep the Dask workers' profiler on"
    )
    parser.add_argument("--compression", default="none", help="none, zstd, lz4...")
    args = parser.parse_args()

    if not args.folder.exists():
        spec = SampleSpec(num_images=args.make, num_classes=10, size=(375, 500), size_jitter=0.3)
        make_image_folder(args.folder, spec, photos=PHOTOS, workers=args.workers)
    from h5pack import Compression

    options = ConvertOptions(
        size=tuple(args.size),
        workers=args.workers,
        compression=Compression(codec=args.compression),
    )
    num = sum(1 for p in args.folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    scratch = Path(tempfile.mkdtemp(prefix="bench-shards-", dir=args.folder.parent))
    variants: dict[str, Callable[[Path], Any]] = {
        "convert": lambda out: convert(args.folder, out / "all.h5", options),
    }
    for n in args.shards:
        variants[f"shards-{n}"] = lambda out, n=n: convert_set(
            args.folder, out / "set", options, shards=n
        )
    cluster = client = None
    if not args.no_dask:
        import dask
        import distributed

        started = time.perf_counter()
        # as `h5pack convert --dask local` starts it (NOTE [ Dask's profiler ] in
        # h5pack/write/dask.py); --dask-profile keeps Dask's default
        with dask.config.set({"distributed.worker.profile.enabled": args.dask_profile}):
            cluster = distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            )
        client = distributed.Client(cluster)
        start_s = time.perf_counter() - started
        variants["dask-2"] = lambda out: convert_on_dask(
            client, args.folder, out / "set", options, shards=args.dask_shards
        )
    print(f"# data: {num} JPEGs in {args.folder}")
    print(
        f"# machine: {platform.platform()}, {os.cpu_count()} cores; {args.workers} workers; "
        f"--size {args.size[0]} {args.size[1]}, compression {args.compression}; medians of "
        f"{args.rounds} interleaved rounds; load average at start {load_text()}"
    )
    if cluster is not None:
        print(f"# LocalCluster(2 processes) started in {start_s:.1f} s (not timed)")
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    try:
        timed(variants["convert"], scratch, client, False)  # warm the page cache, imports
        if client is not None:
            timed(variants["dask-2"], scratch, client, True)  # and the workers' imports
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                elapsed, cpu = timed(variants[name], scratch, client, name.startswith("dask"))
                times[name].append(elapsed)
                cpus[name].append(cpu)
            print(f"# round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    finally:
        if client is not None and cluster is not None:
            client.close()
            cluster.close()
        shutil.rmtree(scratch, ignore_errors=True)
    base = statistics.median(times["convert"])
    base_cpu = statistics.median(cpus["convert"])
    print(
        "\n| variant | median s | images/s | throughput ratio to convert | CPU ms/image "
        "| CPU ratio to convert |"
    )
    print("|---|---|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        cpu = statistics.median(cpus[name])
        print(
            f"| {name} | {median:.2f} | {num / median:.0f} | {base / median:.2f} | "
            f"{1000 * cpu / num:.2f} | {cpu / base_cpu:.2f} |"
        )
    print(f"\n# load average at end {load_text()}")


if __name__ == "__main__":
    main()
