"""The options of the benchmarks, each a frozen dataclass that checks itself.

``MeasureOptions``: how ``compare`` measures one pack; ``BenchOptions``: ``bench``'s loader
settings (its reader's: ``ReaderOptions``); ``CompareOptions``: what ``compare`` builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from h5pack.bench.access import PATTERNS, check_pattern
from h5pack.bench.reading import TrainChoice, TrainingRead
from h5pack.bench.variants import DEFAULT_VARIANTS, parse_variants
from h5pack.errors import OptionsError
from h5pack.read.options import ReaderOptions


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


@dataclass(frozen=True)
class CompareEvent:
    """Progress of a comparison (a ``phase`` of ``total`` steps, ``step``, ``status``...)."""

    kind: Literal["phase", "step", "status", "skipped"]
    message: str
    total: int | None = None
    unit: str = "step"


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """What ``compare`` builds and how it measures.

    ``variants``: names (``bench.variants``) or ``"quick"``; ``size``: what raw variants
    are stored at (None: the images' own); ``measure.train`` is set by ``compare``;
    ``across_pixels``: see "Like with like" in ``bench.ranking``.
    """

    variants: tuple[str, ...] | Literal["quick"] = DEFAULT_VARIANTS
    size: tuple[int, int] | None = None
    train: TrainChoice = "auto"
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    convert_workers: int | None = None
    seed: int = 0
    across_pixels: bool = False

    def __post_init__(self) -> None:
        if self.variants != "quick":
            parse_variants(list(self.variants))  # refuse a bad name before any work

    @classmethod
    def quick(cls, **changes: Any) -> CompareOptions:
        """Return the ``--quick`` settings: four variants, two repeats, short budgets."""
        measure = MeasureOptions(repeats=2, min_run_s=0.1, epoch_budget_s=2.0, budget_s=5.0)
        return cls(**{"variants": "quick", "measure": measure, **changes})
