"""A simulated large pack set: open it, plan an epoch and iterate it on 8 simulated ranks.

    python scripts/bench_packset.py --data /tmp/packset-1m        # build once, then measure
    python scripts/bench_packset.py --data /tmp/packset-1m --ranks 8 --rounds 5

The set is ``--samples`` (default 1,281,167, ImageNet's train split) tiny random images
(``--side`` x ``--side`` x 3, default 8) in ``--shards`` shards (default 128), each written
by ``write_arrays`` with ``--chunk-samples`` samples per chunk (default 64, about 20,000
chunks: the chunk count of an ImageNet pack with 8 MiB chunks of ~110 KB photos), and a
manifest (``core.packset.write_manifest``). The set is built once into ``--data`` and reused.

Each simulated rank runs in a fresh process (``--rank`` is the per-rank entry point) and
measures, for ``make_loader(set, EpochSpec(batch_size=256, num_replicas=R, rank=r))``:

- open: ``describe`` of the set, and the whole ``make_loader`` construction (describe, the
  sampler with its label-mixing check, the dataset), seconds;
- plan: ``ChunkBatchSampler.plan()`` of one epoch for this rank, seconds;
- iterate: turning the plan into the index lists the DataLoader consumes (``list(sampler)``);
- index: the memory the loader and one epoch's plan hold in this process (``tracemalloc``
  current after construction and planning, and its peak), and the RSS growth;
- files: open file descriptors (``/proc/self/fd``) before, and at most while reading one
  batch from every shard in turn (samples across all shards), against the reader's bound
  ``max_open`` shards x 2 descriptors.

Figures are medians over ``--rounds`` rounds per rank (the first open of a round pays the
page cache's misses of nothing: the set was just built or read, so the files are cached);
the report gives the worst rank. Targets (issue 11): open < 2 s, plan < 1 s, index < 64 MiB
per rank, open files bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

TARGET_OPEN_S = 2.0
TARGET_PLAN_S = 1.0
TARGET_INDEX_MIB = 64.0


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    """Resident set size of this process, MiB."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def build(data: Path, *, samples: int, shards: int, side: int, chunk_samples: int) -> float:
    """Write the shards and the manifest into ``data`` (skipped when present); seconds."""
    from h5pack.core.format import load_meta
    from h5pack.core.packset import (
        MANIFEST_NAME,
        PackSetManifest,
        ShardEntry,
        shard_name,
        shard_slice,
        write_manifest,
    )
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    if (data / MANIFEST_NAME).is_file():
        return 0.0
    started = time.perf_counter()
    data.mkdir(parents=True, exist_ok=True)
    classes = [f"n{c:08d}" for c in range(1000)]
    options = ConvertOptions(chunk_samples=chunk_samples, seed=0)
    entries = []
    for index in range(shards):
        low, high = shard_slice(samples, index, shards)
        rng = np.random.default_rng(index)
        count = high - low
        images = rng.integers(0, 256, (count, side, side, 3), dtype=np.uint8)
        labels = (np.arange(low, high) * 7919) % len(classes)
        path = data / shard_name(index, shards)
        write_arrays(
            path,
            list(images),
            labels,
            classes=classes,
            paths=[f"train/{labels[i]:04d}/img_{low + i:08d}.JPEG" for i in range(count)],
            options=options,
            overwrite=True,
        )
        meta = load_meta(path)
        entries.append(ShardEntry.of(path, meta))
        print(f"  shard {index + 1}/{shards}", end="\r", file=sys.stderr, flush=True)
    write_manifest(
        PackSetManifest(
            root=data,
            shards=tuple(entries),
            classes=tuple(classes),
            num_samples=samples,
            seed=0,
            num_shards=shards,
        )
    )
    return time.perf_counter() - started


def measure_rank(data: Path, rank: int, ranks: int, batch_size: int) -> dict[str, Any]:
    """One simulated rank, in this (fresh) process: see the module docstring."""
    import torch  # noqa: F401  (imported before timing: every training process has it)

    from h5pack.read.packset import describe
    from h5pack.training.epochs import EpochSpec
    from h5pack.training.loader import make_loader

    fds_start = open_fds()
    rss_start = rss_mib()
    started = time.perf_counter()
    view = describe(data)
    describe_s = time.perf_counter() - started
    del view

    def construct() -> Any:
        return make_loader(
            data,
            EpochSpec(batch_size=batch_size, num_replicas=ranks, rank=rank),
            num_workers=0,
            seed=0,
            shuffle=True,
        )

    started = time.perf_counter()
    loader = construct()
    open_s = time.perf_counter() - started
    sampler = loader.chunk_sampler
    sampler.set_epoch(1)
    started = time.perf_counter()
    plan = sampler.plan()
    plan_s = time.perf_counter() - started
    del loader, sampler, plan
    # again under tracemalloc (which slows allocation: not timed) for the memory held
    tracemalloc.start()
    loader = construct()
    sampler = loader.chunk_sampler
    sampler.set_epoch(1)
    plan = sampler.plan()
    index_bytes, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    started = time.perf_counter()
    served = 0
    for batch in sampler:
        served += len(batch)
    iterate_s = time.perf_counter() - started
    rss_index = rss_mib() - rss_start

    dataset = loader.dataset
    reader = dataset.reader
    fds_before_reads = open_fds()
    fds_max = fds_before_reads
    cuts = np.cumsum([0] + [s.num_samples for s in dataset.view.shards or ()])
    started = time.perf_counter()
    for shard in range(len(cuts) - 1):  # a batch from every shard, in turn
        dataset.__getitems__(list(range(int(cuts[shard]), int(cuts[shard]) + batch_size)))
        fds_max = max(fds_max, open_fds())
    for batch in plan[:20]:  # and the rank's first batches: samples across all shards
        dataset.__getitems__(batch.tolist())
        fds_max = max(fds_max, open_fds())
    read_s = time.perf_counter() - started
    return {
        "rank": rank,
        "describe_s": describe_s,
        "open_s": open_s,
        "plan_s": plan_s,
        "iterate_s": iterate_s,
        "batches": len(plan),
        "samples": served,
        "index_mib": index_bytes / 2**20,
        "index_peak_mib": peak_bytes / 2**20,
        "rss_growth_mib": rss_index,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "fds_start": fds_start,
        "fds_before_reads": fds_before_reads,
        "fds_max": fds_max,
        "open_shards": getattr(reader, "open_shards", 1),
        "max_open": getattr(reader, "max_open", 1),
        "read_s": read_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder of the set (cached)")
    parser.add_argument("--samples", type=int, default=1_281_167)
    parser.add_argument("--shards", type=int, default=128)
    parser.add_argument("--side", type=int, default=8)
    parser.add_argument("--chunk-samples", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # one rank's process
    args = parser.parse_args(argv)
    if args.rank is not None:
        print(json.dumps(measure_rank(args.data, args.rank, args.ranks, args.batch_size)))
        return 0

    build_s = build(
        args.data,
        samples=args.samples,
        shards=args.shards,
        side=args.side,
        chunk_samples=args.chunk_samples,
    )
    size = sum(p.stat().st_size for p in args.data.iterdir())
    print(
        f"set: {args.data} ({args.samples:,} samples of {args.side}x{args.side}x3 in "
        f"{args.shards} shards, {args.chunk_samples} samples a chunk, {size / 2**20:.0f} MiB)"
        + (f"; built in {build_s:.1f} s" if build_s else "; reused")
    )
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"load {os.getloadavg()[0]:.2f} before"
    )
    rows: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for rank in range(args.ranks):  # interleaved: every rank in every round
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--data",
                    str(args.data),
                    "--rank",
                    str(rank),
                    "--ranks",
                    str(args.ranks),
                    "--batch-size",
                    str(args.batch_size),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    per_rank = {
        key: [
            statistics.median(r[key] for r in rows if r["rank"] == rank)
            for rank in range(args.ranks)
        ]
        for key in (
            "describe_s",
            "open_s",
            "plan_s",
            "iterate_s",
            "index_mib",
            "index_peak_mib",
            "rss_growth_mib",
            "fds_max",
            "fds_before_reads",
        )
    }
    batches = {r["batches"] for r in rows}
    samples = {r["samples"] for r in rows}
    bound = max(r["max_open"] for r in rows) * 2 + max(r["fds_before_reads"] for r in rows)
    summary = {
        "describe_s": max(per_rank["describe_s"]),
        "open_s": max(per_rank["open_s"]),
        "plan_s": max(per_rank["plan_s"]),
        "iterate_s": max(per_rank["iterate_s"]),
        "index_mib": max(per_rank["index_mib"]),
        "index_peak_mib": max(per_rank["index_peak_mib"]),
        "rss_growth_mib": max(per_rank["rss_growth_mib"]),
        "fds_max": max(per_rank["fds_max"]),
        "fds_bound": bound,
        "open_shards_max": max(r["open_shards"] for r in rows),
        "batches_per_rank": sorted(batches),
        "samples_per_rank": sorted(samples),
        "load_after": os.getloadavg()[0],
    }
    print(f"medians of {args.rounds} rounds, worst of {args.ranks} ranks:")
    print(
        f"  open:    describe {summary['describe_s']:.2f} s, make_loader "
        f"{summary['open_s']:.2f} s (target < {TARGET_OPEN_S} s)"
    )
    print(
        f"  plan:    {summary['plan_s']:.3f} s per epoch per rank (target < {TARGET_PLAN_S} s);"
        f" iterate the indices {summary['iterate_s']:.3f} s"
    )
    print(
        f"  index:   {summary['index_mib']:.1f} MiB held (peak {summary['index_peak_mib']:.1f};"
        f" RSS growth {summary['rss_growth_mib']:.1f}) per rank (target < {TARGET_INDEX_MIB})"
    )
    print(
        f"  files:   at most {summary['fds_max']} descriptors open while reading every shard"
        f" (bound {bound}: {summary['open_shards_max']} shards open of {args.shards})"
    )
    print(
        f"  batches: {summary['batches_per_rank']} per rank, samples "
        f"{summary['samples_per_rank']} per rank; load {summary['load_after']:.2f} after"
    )
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    ok = (
        summary["open_s"] < TARGET_OPEN_S
        and summary["plan_s"] < TARGET_PLAN_S
        and summary["index_mib"] < TARGET_INDEX_MIB
        and summary["fds_max"] <= bound
    )
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
