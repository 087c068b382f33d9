"""Measure one pack under the access patterns: throughput, reads, shuffle quality.

Every pattern reads through one dataset and loader (see "One loader for every pattern" in
``bench.loaders``); the patterns' runs are interleaved and long enough to time (see
"Timing enough work" in ``bench.timing``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from h5pack.bench.access import PATTERNS, ReadCount, pack_shape, random_order
from h5pack.bench.loaders import PatternLoader, open_dataset
from h5pack.bench.options import MeasureOptions
from h5pack.bench.reading import batch_problem, resolve_training_read, survey_pack
from h5pack.bench.system import warm_source
from h5pack.bench.timing import Timing, time_interleaved
from h5pack.core.store import Store, open_store
from h5pack.read.options import ReaderOptions
from h5pack.read.packset import PackSource
from h5pack.training.shuffle_quality import jump_entropy


@dataclass(frozen=True, kw_only=True)
class PatternResult:
    """One access pattern measured on one pack."""

    pattern: str
    timing: Timing
    workers: int  # DataLoader workers (0: in-process)
    window_chunks: int  # chunk groups each reader keeps decompressed
    reads: ReadCount
    shuffle_bits: float  # jump entropy of the epoch order (``training.shuffle_quality``)
    shuffle_vs_random: float  # over that of a full shuffle of the same size
    epoch_fraction: float = 1.0  # < 1: timed on a prefix of each epoch (``epoch_budget_s``)

    @property
    def partial(self) -> bool:
        """Whether the figures rest on a prefix of the epoch, not whole epochs."""
        return self.epoch_fraction < 1.0

    @property
    def images_per_s(self) -> float:
        """Median images per second."""
        return self.timing.images_per_s

    @property
    def mb_per_s(self) -> float:
        """Median decoded MB per second."""
        return self.timing.mb_per_s


def epoch_fraction(timing: Timing, num_samples: int) -> float:
    """Return the share of an epoch of ``num_samples`` the shortest timed epoch delivered."""
    if not timing.images or num_samples <= 0:
        return 1.0
    return min(1.0, min(timing.images) / max(1, timing.epochs_per_run) / num_samples)


def measure_pack(
    path: PackSource,
    options: MeasureOptions | None = None,
    *,
    on_step: Callable[[str], None] | None = None,
    store: Store | None = None,
) -> dict[str, PatternResult]:
    """Measure ``path`` (a pack or pack set) under each pattern of ``options``, warm page cache.

    ``on_step`` is called with the pattern's name after each warm-up epoch and timed run;
    ``store``: where the pack is kept (default ``open_store(path)``).
    """
    options = options or MeasureOptions()
    store = store or open_store(path)
    shape = pack_shape(path, store)
    survey = survey_pack(path, store)
    train = resolve_training_read(options.train, survey)
    warm_source(path, store)
    dataset = open_dataset(path, train, seed=options.seed, reader=ReaderOptions(store=store))
    loaders: dict[str, PatternLoader] = {
        pattern: PatternLoader(
            dataset,
            pattern,
            batch_size=options.batch_size,
            workers=options.workers,
            seed=options.seed,
            batchable=batch_problem(survey, train) is None,
            budget_s=options.epoch_budget_s,
        )
        for pattern in PATTERNS
        if pattern in options.patterns
    }
    try:
        timings = time_interleaved(
            loaders,
            repeats=options.repeats,
            warmup=options.warmup,
            min_run_s=options.min_run_s,
            target_spread=options.target_spread,
            budget_s=options.budget_s,
            on_run=on_step,
        )
    finally:
        for loader in loaders.values():
            loader.close()
    results: dict[str, PatternResult] = {}
    for pattern, loader in loaders.items():
        order = np.concatenate(loader.plan(0))
        bits = jump_entropy(order)
        reference = jump_entropy(random_order(order.size, seed=options.seed, epoch=99))
        results[pattern] = PatternResult(
            pattern=pattern,
            timing=timings[pattern],
            workers=loader.workers,
            window_chunks=loader.window_chunks,
            reads=shape.reads(pattern, loader.images_per_epoch, window_chunks=loader.window_chunks),
            shuffle_bits=bits,
            shuffle_vs_random=bits / reference if reference > 0 else 0.0,
            epoch_fraction=epoch_fraction(timings[pattern], shape.num_samples),
        )
    return results
