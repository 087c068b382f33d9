"""Measure one pack under the access patterns: throughput, reads, shuffle quality.

Every pattern reads through one dataset and loader, with the training read (see the note
"One loader for every pattern" in ``h5pack.bench.loaders``); the patterns' runs are
interleaved and long enough to time (see "Timing enough work" in ``h5pack.bench.timing``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from h5pack.bench.access import MEASURED as MEASURED  # re-exported
from h5pack.bench.access import (
    NAIVE,
    PATTERNS,
    PackShape,
    Pattern,
    ReadCount,
    pack_shape,
    random_order,
    read_per_sample,
)
from h5pack.bench.loaders import PatternLoader, open_dataset
from h5pack.bench.options import MeasureOptions, RemoteReading
from h5pack.bench.reading import batch_problem, survey_pack
from h5pack.bench.system import CacheDrop, drop_source, warm_source
from h5pack.bench.timing import Count, Timing, time_interleaved
from h5pack.core.store import Store, open_store
from h5pack.read.packset import PackSource
from h5pack.training.shuffle_quality import (
    expected_pair_repetition,
    jump_entropy,
    pair_repetition,
)


@dataclass(frozen=True, kw_only=True)
class PatternResult:
    """One access pattern measured on one pack.

    Attributes:
        pattern: ``"random"``, ``"chunk"``, ``"sequential"`` or ``"naive"``.
        timing: The timed repeats.
        workers: DataLoader workers used (0 for naive reads and in-process loading).
        window_chunks: Chunk groups each reader keeps decompressed (0 for naive reads).
        reads: Chunk loads and bytes read over the samples delivered (see "Chunk work per
            sample").
        shuffle_bits: Jump entropy of the epoch order (``h5pack.training.shuffle_quality``).
        shuffle_vs_random: ``shuffle_bits`` over that of a full shuffle of the same size.
        pair_repeat: Of the pairs of samples sharing a batch after the first epoch, the
            fraction that already shared one (see "Batch-pair repetition").
        pair_repeat_shuffle: The same, expected of a full shuffle of this pack.
        page_cache: ``"warm"``, ``"cold"``, or why a cold measurement was warm after all.
        epoch_fraction: The share of an epoch each timed epoch covered: 1.0 for whole
            epochs, less when a slow pattern was timed on a prefix (``epoch_budget_s``,
            short under ``--quick``); its rate and reads rest on that prefix.
        side_by_side: Timed again in ``compare``'s settling round, interleaved with the
            other front-runners (see "A recommendation stable run to run").
    """

    pattern: str
    timing: Timing
    workers: int
    window_chunks: int
    reads: ReadCount
    shuffle_bits: float
    shuffle_vs_random: float
    pair_repeat: float = 0.0
    pair_repeat_shuffle: float = 0.0
    page_cache: str = "warm"
    epoch_fraction: float = 1.0
    side_by_side: bool = False

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

    @property
    def pair_repeat_ratio(self) -> float:
        """``pair_repeat`` over a full shuffle's expectation (1.0: as a full shuffle)."""
        if self.pair_repeat_shuffle <= 0:
            return 0.0
        return self.pair_repeat / self.pair_repeat_shuffle


def epoch_fraction(timing: Timing, num_samples: int) -> float:
    """Return the share of an epoch of ``num_samples`` the shortest timed epoch delivered."""
    if not timing.images or num_samples <= 0:
        return 1.0
    per_epoch = min(timing.images) / max(1, timing.epochs_per_run)
    return min(1.0, per_epoch / num_samples)


def _shuffle(order: np.ndarray, seed: int) -> tuple[float, float]:
    bits = jump_entropy(order)
    reference = jump_entropy(random_order(order.size, seed=seed, epoch=99))
    return bits, (bits / reference if reference > 0 else 0.0)


def _pairs(loader: PatternLoader, epochs: int) -> tuple[float, float]:
    plans = [loader.plan(epoch) for epoch in range(epochs)]
    sizes = [b.size for b in plans[0]]
    return pair_repetition(plans), expected_pair_repetition(sizes, epochs)


class _Cold:
    """Drops the pack from the page cache before each epoch and remembers if it could."""

    def __init__(self, source: PackSource) -> None:
        self.source = source
        self.failed: CacheDrop | None = None

    def __call__(self) -> None:
        drop = drop_source(self.source)
        if not drop.dropped and self.failed is None:
            self.failed = drop

    def state(self) -> str:
        return "cold" if self.failed is None else f"warm: {self.failed.message}"


def measure_naive(
    path: PackSource,
    shape: PackShape,
    options: MeasureOptions,
    *,
    before: Callable[[], None] | None = None,
    step: Callable[[], None] | None = None,
) -> PatternResult:
    """Measure bare h5py per-sample reads in a full shuffle, h5py's default cache."""
    num = shape.num_samples
    epochs = iter(range(10**9))
    crop = options.train.crop_spec()

    def run() -> Count:
        order = random_order(num, seed=options.seed, epoch=next(epochs))
        return read_per_sample(
            path,
            order,
            budget_s=options.naive_budget_s,
            min_samples=min(num, options.naive_min_samples),
            crop=crop,
            seed=options.seed,
        )

    timing = time_interleaved(
        {NAIVE: run},
        repeats=options.repeats,
        before={NAIVE: before} if before is not None else None,
        on_run=(lambda name: step()) if step is not None else None,
    )[NAIVE]
    order = random_order(num, seed=options.seed, epoch=0)
    reads = shape.reads(NAIVE, max(timing.images))
    bits, relative = _shuffle(order, options.seed)
    return PatternResult(
        pattern=NAIVE,
        timing=timing,
        workers=0,
        window_chunks=0,
        reads=reads,
        shuffle_bits=bits,
        shuffle_vs_random=relative,
    )


def measure_pack(
    path: PackSource,
    options: MeasureOptions | None = None,
    *,
    on_step: Callable[[str], None] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> dict[str, PatternResult]:
    """Measure ``path`` under each access pattern of ``options``.

    The page cache is warm, or dropped before every timed epoch with ``options.cold``. A
    URL is read with ``storage_options`` (beyond the environment's), through the loader
    only: the naive h5py per-sample read is a local file's reference, not measured there.

    Args:
        path: The pack, or a pack set (its directory or manifest, or a list of packs).
        options: How to measure (default ``MeasureOptions()``).
        on_step: Called with the pattern's name after each warm-up epoch and timed run.
        storage_options: The remote client's settings for a URL, beyond the environment's.
        store: Where the pack is kept (default: ``open_store(path, storage_options)``).

    Returns:
        The result of each pattern, keyed by pattern name.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack.
    """
    options = options or MeasureOptions()
    store = store or open_store(path, storage_options)
    shape = pack_shape(path, store)
    batchable = batch_problem(survey_pack(path, store), options.train) is None
    remote = store.remote
    cold = _Cold(path) if options.cold and not remote else None
    if cold is None:
        warm_source(path)
    wanted: list[Pattern] = [p for p in PATTERNS if p in options.patterns]
    dataset = open_dataset(
        path,
        options.train,
        seed=options.seed,
        cache=options.cache,
        cache_bytes=options.cache_bytes,
        remote=RemoteReading(store=store),
    )
    loaders: dict[str, PatternLoader] = {
        pattern: PatternLoader(
            dataset,
            pattern,
            batch_size=options.batch_size,
            workers=options.workers,
            seed=options.seed,
            batchable=batchable,
            budget_s=options.epoch_budget_s,
        )
        for pattern in wanted
    }
    try:
        timings = time_interleaved(
            dict(loaders),
            repeats=options.repeats,
            warmup=options.warmup,
            min_run_s=options.min_run_s,
            target_spread=options.target_spread,
            budget_s=options.budget_s,
            before={p: cold for p in wanted} if cold is not None else None,
            on_run=on_step,
        )
    finally:
        for loader in loaders.values():
            loader.close()
    results: dict[str, PatternResult] = {}
    state = cold.state() if cold is not None else "warm"
    for pattern in wanted:
        loader = loaders[pattern]
        bits, relative = _shuffle(np.concatenate(loader.plan(0)), options.seed)
        repeat, expected = _pairs(loader, options.pair_epochs)
        results[pattern] = PatternResult(
            pattern=pattern,
            timing=timings[pattern],
            workers=loader.workers,
            window_chunks=loader.window_chunks,
            reads=shape.reads(pattern, loader.images_per_epoch, window_chunks=loader.window_chunks),
            shuffle_bits=bits,
            shuffle_vs_random=relative,
            pair_repeat=repeat,
            pair_repeat_shuffle=expected,
            page_cache=state,
            epoch_fraction=epoch_fraction(timings[pattern], shape.num_samples),
        )
    if NAIVE in options.patterns and not remote:

        def step() -> None:
            if on_step is not None:
                on_step(NAIVE)

        naive = measure_naive(path, shape, options, before=cold, step=step)
        results[NAIVE] = replace(
            naive,
            page_cache=cold.state() if cold is not None else "warm",
            epoch_fraction=epoch_fraction(naive.timing, shape.num_samples),
        )
    return results
