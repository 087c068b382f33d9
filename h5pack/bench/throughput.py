"""``bench``: the h5pack loader's throughput on one pack, for given settings.

The pack is read through one dataset and ``make_loader``'s settings in the order asked for
(see "One loader for every pattern" in ``bench.loaders``), with the training read, in runs
long enough to time (see "Timing enough work" in ``bench.timing``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack.bench.access import ReadCount, check_pattern, pack_shape
from h5pack.bench.loaders import PatternLoader, open_dataset
from h5pack.bench.options import BenchOptions
from h5pack.bench.reading import auto_note, batch_problem, resolve_training_read, survey_pack
from h5pack.bench.system import source_name, warm_source
from h5pack.bench.timing import Timing, time_interleaved
from h5pack.core.units import human_bytes
from h5pack.read.packset import PackSource
from h5pack.training.shuffle_quality import jump_entropy


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """Loader throughput on one pack (or set, or list of packs: ``path`` names them)."""

    path: str
    options: BenchOptions
    timing: Timing
    workers: int  # ``"auto"`` resolved
    threads: int  # decompression threads of an in-process reader
    window_chunks: int  # chunk groups each process keeps decompressed
    reads: ReadCount
    shuffle_bits: float  # jump entropy of the epoch order
    train: dict[str, Any]  # ``TrainingRead.to_json`` with a ``note``


def bench_loader(
    path: PackSource,
    options: BenchOptions | None = None,
    *,
    on_step: Callable[[], None] | None = None,
) -> BenchResult:
    """Measure images/s of an h5pack loader over a pack or set (warm page cache).

    ``on_step`` is called after each warm-up epoch and timed run.
    """
    options = options or BenchOptions()
    store = options.reader.store
    survey = survey_pack(path, store)
    train = resolve_training_read(options.train, survey)
    dataset = open_dataset(
        path,
        train,
        seed=options.seed,
        cache=options.cache,
        cache_bytes=options.cache_bytes,
        reader=options.reader,
    )
    loader = PatternLoader(
        dataset,
        check_pattern(options.order),
        batch_size=options.batch_size,
        workers=options.workers,
        seed=options.seed,
        batchable=batch_problem(survey, train) is None,
        max_batches=options.max_batches,
    )
    try:
        warm_source(path, store)
        timing = time_interleaved(
            {"warm": loader},
            repeats=options.repeats,
            warmup=options.warmup,
            min_run_s=options.min_run_s,
            target_spread=options.target_spread,
            budget_s=options.budget_s,
            on_run=(lambda name: on_step()) if on_step is not None else None,
        )["warm"]
        reads = pack_shape(path, store).reads(
            options.order, loader.images_per_epoch, window_chunks=max(1, loader.window_chunks)
        )
        plan = loader.plan(0)
        order = np.concatenate(plan) if plan else np.zeros(0, dtype=np.int64)
        return BenchResult(
            path=source_name(path),
            options=options,
            timing=timing,
            workers=loader.workers,
            threads=loader.threads,
            window_chunks=loader.window_chunks,
            reads=reads,
            shuffle_bits=jump_entropy(order),
            train={**train.to_json(), "note": auto_note(train, survey)},
        )
    finally:
        loader.close()


def format_bench(result: BenchResult) -> str:
    """Return ``bench``'s result as lines of text, with a warning when it is unsteady."""
    options, timing = result.options, result.timing
    threads = f", {result.threads} reader threads" if result.threads else ""
    runs = (
        f"{len(timing.rates)} runs of {timing.epochs_per_run} epoch(s)"
        if timing.epochs_per_run > 1
        else f"{len(timing.rates)} epochs"
    )
    read = result.train.get("note") or f"Read: {result.train.get('description')}."
    cached = options.cache == "decoded"
    lines = [
        f"{result.path}: {timing.describe()}  ({timing.mb_per_s:,.0f} MB/s; "
        f"slowest {timing.low:,.0f}, fastest {timing.high:,.0f} over {runs}; "
        f"{max(timing.images, default=0) // max(1, timing.epochs_per_run)} images an epoch)",
        f"  {read}",
        f"  order {options.order}, batch size {options.batch_size}, {result.workers} workers"
        f"{threads}, window {result.window_chunks} chunks"
        + (", decoded cache (the timed epochs come after the warm-up filled it)" if cached else ""),
    ]
    if cached and timing.first_epoch_per_s is not None:
        lines.append(
            f"  first epoch (filling the decoded cache): {timing.first_epoch_per_s:,.0f} img/s"
        )
    lines.append(
        f"  per sample: {result.reads.chunks_per_sample:.3g} chunk loads, "
        f"{human_bytes(result.reads.bytes_per_sample)} read; shuffle entropy "
        f"{result.shuffle_bits:.2f} bits"
    )
    if not timing.stable:
        lines.append(
            f"  warning: the runs still differ by ±{50 * timing.spread:.0f}% (the machine may "
            "be busy): take the figure as rough"
        )
    return "\n".join(lines)
