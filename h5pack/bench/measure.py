"""Time a pack through h5pack's loader: ``measure_pack`` (compare) and ``bench_loader``.

``measure_pack`` times every access pattern, ``bench_loader`` given loader settings, each
through one dataset and loader (see "One loader for every pattern" in ``bench.loaders``),
in interleaved runs long enough to time (see "Timing enough work" in ``bench.timing``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from h5pack.bench.access import PATTERNS, ReadCount, check_pattern, pack_shape, random_order
from h5pack.bench.loaders import PatternLoader, open_dataset
from h5pack.bench.reading import (
    SizeSurvey,
    TrainChoice,
    TrainingRead,
    auto_note,
    batch_problem,
    resolve_training_read,
    survey_pack,
)
from h5pack.bench.system import source_name, warm_source
from h5pack.bench.timing import Timing, time_interleaved
from h5pack.core.store import Store, open_store
from h5pack.core.units import human_bytes
from h5pack.errors import OptionsError
from h5pack.read.options import ReaderOptions
from h5pack.read.packset import PackSource
from h5pack.training.mixing import jump_entropy


@dataclass(frozen=True, kw_only=True)
class TimedOptions:
    """The loader and timing settings ``MeasureOptions`` and ``BenchOptions`` share.

    ``repeats`` timed runs of at least ``min_run_s`` after ``warmup`` untimed epochs, runs
    lengthened while their spread exceeds ``target_spread`` and ``budget_s`` allows (see
    "Timing enough work"); ``train``: a ``TrainingRead`` or ``"auto"``.
    """

    batch_size: int = 64
    workers: int | Literal["auto"] = "auto"
    repeats: int = 3
    warmup: int = 1
    min_run_s: float = 0.2
    target_spread: float | None = 0.1
    budget_s: float | None = 15.0
    train: TrainChoice = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.repeats < 1 or self.warmup < 0 or self.min_run_s < 0:
            raise OptionsError(
                "batch_size and repeats should be >= 1, warmup and min_run_s >= 0, but got "
                f"batch_size={self.batch_size}, repeats={self.repeats}, warmup={self.warmup}, "
                f"min_run_s={self.min_run_s}"
            )
        if self.workers != "auto" and (not isinstance(self.workers, int) or self.workers < 0):
            raise OptionsError(f"workers should be 'auto' or >= 0, but got {self.workers!r}")


@dataclass(frozen=True, kw_only=True)
class MeasureOptions(TimedOptions):
    """How ``compare`` measures a pack; a slow pattern is timed on ``epoch_budget_s`` of it."""

    train: TrainChoice = field(default_factory=TrainingRead)
    epoch_budget_s: float = 10.0
    patterns: tuple[str, ...] = PATTERNS

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.patterns or any(p not in PATTERNS for p in self.patterns):
            raise OptionsError(
                f"patterns should be among {', '.join(PATTERNS)}, but got {self.patterns!r}"
            )


@dataclass(frozen=True, kw_only=True)
class BenchOptions(TimedOptions):
    """Loader settings of ``bench``.

    ``order``: an access pattern; ``cache="decoded"``: through ``make_loader``'s decoded
    cache, filled by the warm-up; ``reader``: chunks kept, a remote pack's store, read-ahead.
    """

    min_run_s: float = 0.3
    budget_s: float | None = 30.0
    order: str = "chunk"
    cache: Literal["decoded"] | None = None
    cache_bytes: int | None = None
    max_batches: int | None = None
    reader: ReaderOptions = field(default_factory=ReaderOptions)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pattern(self.order)
        if self.cache not in (None, "decoded"):
            raise OptionsError(f"cache should be 'decoded' or None, but got cache={self.cache!r}")
        if self.cache_bytes is not None and (self.cache is None or self.cache_bytes < 1):
            raise OptionsError(
                "cache_bytes (--cache-bytes) is the decoded cache's budget, as make_loader's: "
                f"give it with cache='decoded' (--cache decoded), positive; got "
                f"{self.cache_bytes}. The decompressed chunks kept per process are "
                "chunk_cache_bytes (--chunk-cache-bytes)"
            )


@dataclass(frozen=True, kw_only=True)
class PatternResult:
    """One access pattern measured on one pack."""

    pattern: str
    timing: Timing
    workers: int  # DataLoader workers (0: in-process)
    window_chunks: int  # chunk groups each reader keeps decompressed
    reads: ReadCount
    shuffle_bits: float  # jump entropy of the epoch order (``training.mixing``)
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


def epoch_fraction(timing: Timing, num_samples: int) -> float:
    """Return the share of an epoch of ``num_samples`` the shortest timed epoch delivered."""
    if not timing.images or num_samples <= 0:
        return 1.0
    return min(1.0, min(timing.images) / max(1, timing.epochs_per_run) / num_samples)


def _timed(
    path: PackSource,
    options: TimedOptions,
    patterns: Sequence[str],
    reader: ReaderOptions,
    on_run: Callable[[str], None] | None,
    **settings: Any,
) -> tuple[SizeSurvey, TrainingRead, dict[str, PatternLoader], dict[str, Timing]]:
    """Time ``patterns`` over one dataset of ``path``; ``settings``: the loaders' and cache's."""
    survey = survey_pack(path, reader.store)
    train = resolve_training_read(options.train, survey)
    cache = {k: settings.pop(k) for k in ("cache", "cache_bytes") if k in settings}
    dataset = open_dataset(path, train, seed=options.seed, reader=reader, **cache)
    loaders = {
        pattern: PatternLoader(
            dataset,
            check_pattern(pattern),
            batch_size=options.batch_size,
            workers=options.workers,
            seed=options.seed,
            batchable=batch_problem(survey, train) is None,
            **settings,
        )
        for pattern in patterns
    }
    try:
        warm_source(path, reader.store)
        timings = time_interleaved(
            loaders,
            repeats=options.repeats,
            warmup=options.warmup,
            min_run_s=options.min_run_s,
            target_spread=options.target_spread,
            budget_s=options.budget_s,
            on_run=on_run,
        )
    finally:
        for loader in loaders.values():
            loader.close()
    return survey, train, loaders, timings


def _order(loader: PatternLoader) -> np.ndarray:
    plan = loader.plan(0)
    return np.concatenate(plan) if plan else np.zeros(0, dtype=np.int64)


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
    reader = ReaderOptions(store=store or open_store(path))
    shape = pack_shape(path, reader.store)
    patterns = [p for p in PATTERNS if p in options.patterns]
    timed = _timed(path, options, patterns, reader, on_step, budget_s=options.epoch_budget_s)
    results: dict[str, PatternResult] = {}
    for pattern, loader in timed[2].items():
        timing, order = timed[3][pattern], _order(loader)
        bits = jump_entropy(order)
        reference = jump_entropy(random_order(order.size, seed=options.seed, epoch=99))
        results[pattern] = PatternResult(
            pattern=pattern,
            timing=timing,
            workers=loader.workers,
            window_chunks=loader.window_chunks,
            reads=shape.reads(pattern, loader.images_per_epoch, window_chunks=loader.window_chunks),
            shuffle_bits=bits,
            shuffle_vs_random=bits / reference if reference > 0 else 0.0,
            epoch_fraction=epoch_fraction(timing, shape.num_samples),
        )
    return results


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
    survey, train, loaders, timings = _timed(
        path,
        options,
        [options.order],
        options.reader,
        (lambda name: on_step()) if on_step is not None else None,
        cache=options.cache,
        cache_bytes=options.cache_bytes,
        max_batches=options.max_batches,
    )
    loader = loaders[options.order]
    reads = pack_shape(path, options.reader.store).reads(
        options.order, loader.images_per_epoch, window_chunks=max(1, loader.window_chunks)
    )
    return BenchResult(
        path=source_name(path),
        options=options,
        timing=timings[options.order],
        workers=loader.workers,
        threads=loader.threads,
        window_chunks=loader.window_chunks,
        reads=reads,
        shuffle_bits=jump_entropy(_order(loader)),
        train={**train.to_json(), "note": auto_note(train, survey)},
    )


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
