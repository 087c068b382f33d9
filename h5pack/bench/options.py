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


def check_loader(batch_size: int, workers: object, repeats: int) -> None:
    """Refuse a batch size or repeats below 1, or workers neither ``"auto"`` nor >= 0.

    Raises:
        OptionsError: one of them is out of range.
    """
    if batch_size < 1:
        raise OptionsError(f"batch_size should be >= 1, but got batch_size={batch_size}")
    if workers != "auto" and (not isinstance(workers, int) or workers < 0):
        raise OptionsError(f"workers should be 'auto' or >= 0, but got {workers!r}")
    if repeats < 1:
        raise OptionsError(f"repeats should be >= 1, but got repeats={repeats}")


def check_cache(cache: object, cache_bytes: int | None) -> None:
    """Refuse a cache other than ``"decoded"``, or a decoded budget without the cache.

    Raises:
        OptionsError: ``cache`` is not None or ``"decoded"``; ``cache_bytes`` without it.
    """
    if cache not in (None, "decoded"):
        raise OptionsError(f"cache should be 'decoded' or None, but got cache={cache!r}")
    if cache_bytes is not None and (cache is None or cache_bytes < 1):
        raise OptionsError(
            "cache_bytes (--cache-bytes) is the decoded cache's budget, as make_loader's: "
            f"give it with cache='decoded' (--cache decoded), positive; got {cache_bytes}. "
            "The decompressed chunks kept per process are chunk_cache_bytes "
            "(--chunk-cache-bytes)"
        )


@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How a pack is measured.

    Attributes:
        batch_size: Samples per batch of the h5pack loader.
        workers: DataLoader workers of the h5pack loader, or ``"auto"`` (``make_loader``).
        repeats: Timed runs per pattern (medians and spread are over these).
        warmup: Untimed epochs first (worker start-up, lazy opens); they also size the runs.
        min_run_s: Seconds a timed run lasts at least (whole epochs).
        epoch_budget_s: Seconds of one loader epoch at most: a slow pattern (a full shuffle
            of large compressed chunks) is timed on a prefix of its epoch, its rate being
            steady.
        patterns: What to measure, among ``PATTERNS``.
        train: How training reads the images (size, crop, flip).
        seed: Seed of every order.
        target_spread: Runs of a pattern spread wider than this (fastest - slowest over
            median) are lengthened and timed again while ``budget_s`` allows (see "Timing
            enough work"); None times each run once.
        budget_s: Seconds the timing of one pack may take while runs are lengthened.
    """

    batch_size: int = 64
    workers: int | Literal["auto"] = "auto"
    repeats: int = 3
    warmup: int = 1
    min_run_s: float = 0.2
    epoch_budget_s: float = 10.0
    patterns: tuple[str, ...] = PATTERNS
    train: TrainingRead = field(default_factory=TrainingRead)
    seed: int = 0
    target_spread: float | None = 0.1
    budget_s: float | None = 15.0

    def __post_init__(self) -> None:
        check_loader(self.batch_size, self.workers, self.repeats)
        if self.min_run_s < 0:
            raise OptionsError(f"min_run_s should be >= 0, but got min_run_s={self.min_run_s}")
        if self.epoch_budget_s <= 0:
            raise OptionsError(
                f"epoch_budget_s should be positive, but got epoch_budget_s={self.epoch_budget_s}"
            )
        unknown = [p for p in self.patterns if p not in PATTERNS]
        if unknown or not self.patterns:
            raise OptionsError(
                f"patterns should be among {', '.join(PATTERNS)}, but got {self.patterns!r}"
            )


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """Loader settings of ``bench``.

    Attributes:
        batch_size: Samples per batch.
        workers: DataLoader workers, or ``"auto"`` (``make_loader``'s choice).
        order: ``"chunk"`` (h5pack's sampler), ``"random"`` (a full shuffle, batches read
            through the same dataset) or ``"sequential"``.
        cache: ``"decoded"``: read through ``make_loader``'s decoded cache (README's
            training loop); the warm-up epochs fill it and the timed epochs are the later
            ones; None reads without it (every epoch as the first).
        cache_bytes: The decoded cache's budget, ``make_loader``'s ``cache_bytes`` (None:
            its default); only with ``cache``.
        train: How training reads the images (``TrainingRead``: size, crop, flip), or
            ``"auto"`` (see the note "Training size by default" in ``bench.reading``).
        repeats: Timed runs (of one or more epochs each).
        warmup: Untimed epochs first; they also size the runs.
        max_batches: Stop each epoch after this many batches (None: whole epochs).
        min_run_s: Seconds a timed run lasts at least (whole epochs).
        target_spread: Lengthen the runs while the spread (fastest - slowest over median)
            is above this and ``budget_s`` allows.
        budget_s: Seconds the timing may take before runs stop being lengthened.
        seed: Seed of the order.
        reader: How each process reads: decompressed chunks kept (``chunk_cache_bytes``),
            a remote pack's store, read-ahead and disk cache (``--disk-cache-dir``...).
    """

    batch_size: int = 64
    workers: int | Literal["auto"] = "auto"
    order: str = "chunk"
    cache: Literal["decoded"] | None = None
    cache_bytes: int | None = None
    train: TrainChoice = "auto"
    repeats: int = 3
    warmup: int = 1
    max_batches: int | None = None
    min_run_s: float = 0.3
    target_spread: float = 0.1
    budget_s: float = 30.0
    seed: int = 0
    reader: ReaderOptions = field(default_factory=ReaderOptions)

    def __post_init__(self) -> None:
        check_pattern(self.order)
        check_loader(self.batch_size, self.workers, self.repeats)
        check_cache(self.cache, self.cache_bytes)
        if self.max_batches is not None and self.max_batches < 1:
            raise OptionsError(f"max_batches should be >= 1, but got {self.max_batches}")
        if self.min_run_s < 0 or self.target_spread <= 0 or self.budget_s < 0:
            raise OptionsError(
                "min_run_s and budget_s should be >= 0 and target_spread positive, but got "
                f"min_run_s={self.min_run_s}, target_spread={self.target_spread}, "
                f"budget_s={self.budget_s}"
            )
        if not (self.train == "auto" or isinstance(self.train, TrainingRead)):
            raise OptionsError(
                f"train should be a TrainingRead or 'auto', but got train={self.train!r}"
            )


EventKind = Literal["phase", "step", "status", "skipped"]


@dataclass(frozen=True)
class CompareEvent:
    """Progress of a comparison (the CLI renders it as a progress bar).

    Attributes:
        kind: ``"phase"`` (``total`` steps follow), ``"step"`` (one done, ``message`` says
            which), ``"status"`` (what runs now) or ``"skipped"`` (a variant left out).
        message: One line.
        total: Steps of the whole comparison (``"phase"`` only).
        unit: What a step is, for the bar.
    """

    kind: EventKind
    message: str
    total: int | None = None
    unit: str = "step"


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """What ``compare`` builds and how it measures.

    Attributes:
        variants: Variant names (``h5pack.bench.variants``) built from an image folder, or
            ``"quick"``: four chosen from what the folder's images allow
            (``variants.quick_variants``).
        size: ``(H, W)`` raw variants are stored at (the conversion's ``--size``); None
            keeps the images' size.
        train: How training reads the images (``TrainingRead``: size, crop, flip), or
            ``"auto"`` (see the note "Training size by default" in ``bench.reading``).
        measure: How each pack is measured (its ``train`` is set by ``compare``).
        convert_workers: Conversion processes (None: every core).
        memory_bytes: Memory available to the page cache; None reads it when the
            comparison starts.
        seed: Seed of the stored sample order.
        across_pixels: Rank packs holding different pixels (other sizes or images)
            together, on speed alone (see "Like with like" in ``bench.ranking``).
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
        if not (self.train == "auto" or isinstance(self.train, TrainingRead)):
            raise OptionsError(
                f"train should be a TrainingRead or 'auto', but got train={self.train!r}"
            )

    @classmethod
    def quick(cls, **changes: Any) -> CompareOptions:
        """Return the ``--quick`` settings: four variants, two repeats, short budgets."""
        measure = MeasureOptions(
            repeats=2,
            warmup=1,
            min_run_s=0.1,
            epoch_budget_s=2.0,
            budget_s=5.0,
        )
        return cls(**{"variants": "quick", "measure": measure, **changes})

    def to_json(self) -> dict[str, Any]:
        """Return the options as JSON-ready data."""
        data = dataclasses.asdict(self)
        data["variants"] = self.variants if self.variants == "quick" else list(self.variants)
        data["size"] = list(self.size) if self.size else None
        data["train"] = self.train if self.train == "auto" else self.train.to_json()
        data["measure"]["patterns"] = list(self.measure.patterns)
        data["measure"]["train"] = self.measure.train.to_json()
        return data
