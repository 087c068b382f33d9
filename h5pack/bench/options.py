"""The options of the benchmarks, each a frozen dataclass that checks itself.

``MeasureOptions``: how ``compare`` measures one pack; ``BenchOptions``: ``bench``'s loader
settings (its reader's: ``ReaderOptions``); ``CompareOptions``: what ``compare`` builds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from h5pack.bench.access import PATTERNS, check_pattern
from h5pack.bench.reading import TrainChoice, TrainingRead
from h5pack.bench.variants import DEFAULT_VARIANTS, parse_variants
from h5pack.errors import OptionsError
from h5pack.read.options import ReaderOptions


def check_cache(cache: object, cache_bytes: int | None) -> None:
    """Refuse a cache other than ``"decoded"``, or a decoded budget without the cache."""
    if cache not in (None, "decoded"):
        raise OptionsError(f"cache should be 'decoded' or None, but got cache={cache!r}")
    if cache_bytes is not None and (cache is None or cache_bytes < 1):
        raise OptionsError(
            "cache_bytes (--cache-bytes) is the decoded cache's budget, as make_loader's: "
            f"give it with cache='decoded' (--cache decoded), positive; got {cache_bytes}. "
            "The decompressed chunks kept per process are chunk_cache_bytes "
            "(--chunk-cache-bytes)"
        )


def _check_train(train: object) -> None:
    if not (train == "auto" or isinstance(train, TrainingRead)):
        raise OptionsError(f"train should be a TrainingRead or 'auto', but got train={train!r}")


def _train_json(train: TrainChoice) -> Any:
    return train if train == "auto" else train.to_json()


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
        if self.batch_size < 1 or self.repeats < 1 or self.warmup < 0:
            raise OptionsError(
                "batch_size and repeats should be >= 1 and warmup >= 0, but got "
                f"batch_size={self.batch_size}, repeats={self.repeats}, warmup={self.warmup}"
            )
        if self.workers != "auto" and (not isinstance(self.workers, int) or self.workers < 0):
            raise OptionsError(f"workers should be 'auto' or >= 0, but got {self.workers!r}")
        if (
            self.min_run_s < 0
            or (self.target_spread is not None and self.target_spread <= 0)
            or (self.budget_s or 0) < 0
        ):
            raise OptionsError(
                "min_run_s and budget_s should be >= 0 and target_spread positive, but got "
                f"min_run_s={self.min_run_s}, target_spread={self.target_spread}, "
                f"budget_s={self.budget_s}"
            )
        _check_train(self.train)


@dataclass(frozen=True, kw_only=True)
class MeasureOptions(TimedOptions):
    """How ``compare`` measures a pack; a slow pattern is timed on ``epoch_budget_s`` of it."""

    train: TrainChoice = field(default_factory=TrainingRead)
    epoch_budget_s: float = 10.0
    patterns: tuple[str, ...] = PATTERNS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.epoch_budget_s <= 0:
            raise OptionsError(
                f"epoch_budget_s should be positive, but got epoch_budget_s={self.epoch_budget_s}"
            )
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
        check_cache(self.cache, self.cache_bytes)
        if self.max_batches is not None and self.max_batches < 1:
            raise OptionsError(f"max_batches should be >= 1, but got {self.max_batches}")


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
    ``memory_bytes``: None reads it when it starts; ``across_pixels``: see "Like with
    like" in ``bench.ranking``.
    """

    variants: tuple[str, ...] | Literal["quick"] = DEFAULT_VARIANTS
    size: tuple[int, int] | None = None
    train: TrainChoice = "auto"
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    convert_workers: int | None = None
    memory_bytes: int | None = None
    seed: int = 0
    across_pixels: bool = False

    def __post_init__(self) -> None:
        if self.variants != "quick":
            parse_variants(list(self.variants))  # refuse a bad name before any work
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise OptionsError(f"size should be two positive integers, but got size={self.size!r}")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise OptionsError(
                f"memory_bytes should be positive, but got memory_bytes={self.memory_bytes}"
            )
        _check_train(self.train)

    @classmethod
    def quick(cls, **changes: Any) -> CompareOptions:
        """Return the ``--quick`` settings: four variants, two repeats, short budgets."""
        measure = MeasureOptions(repeats=2, min_run_s=0.1, epoch_budget_s=2.0, budget_s=5.0)
        return cls(**{"variants": "quick", "measure": measure, **changes})

    def to_json(self) -> dict[str, Any]:
        """Return the options as JSON-ready data."""
        data = dataclasses.asdict(self)
        data["variants"] = self.variants if self.variants == "quick" else list(self.variants)
        data["size"] = list(self.size) if self.size else None
        data["train"] = _train_json(self.train)
        data["measure"]["patterns"] = list(self.measure.patterns)
        data["measure"]["train"] = _train_json(self.measure.train)
        return data
