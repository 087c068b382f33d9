"""Timing of repeated measurements: medians and spread, never a single run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from h5pack.errors import OptionsError


@dataclass(frozen=True)
class Count:
    """What one timed run delivered: images and their decoded bytes."""

    images: int
    nbytes: int


@dataclass(frozen=True)
class Timing:
    """Throughput of several repeats of one measurement.

    Attributes:
        elapsed_s: Wall time of each repeat.
        images: Images delivered by each repeat.
        nbytes: Decoded bytes (what the training loop receives) delivered by each repeat.
    """

    elapsed_s: tuple[float, ...]
    images: tuple[int, ...]
    nbytes: tuple[int, ...]

    @property
    def rates(self) -> tuple[float, ...]:
        """Images per second of each repeat."""
        return tuple(
            n / s if s > 0 else float("inf")
            for n, s in zip(self.images, self.elapsed_s, strict=True)
        )

    @property
    def images_per_s(self) -> float:
        """Median images per second over the repeats."""
        return float(statistics.median(self.rates)) if self.rates else 0.0

    @property
    def mb_per_s(self) -> float:
        """Median decoded megabytes (10^6 bytes) per second over the repeats."""
        rates = [b / s / 1e6 for b, s in zip(self.nbytes, self.elapsed_s, strict=True) if s > 0]
        return float(statistics.median(rates)) if rates else 0.0

    @property
    def low(self) -> float:
        """Slowest repeat, images per second."""
        return min(self.rates, default=0.0)

    @property
    def high(self) -> float:
        """Fastest repeat, images per second."""
        return max(self.rates, default=0.0)

    @property
    def spread(self) -> float:
        """(fastest - slowest) / median of the repeats' rates; 0 for a single repeat."""
        median = self.images_per_s
        if len(self.rates) < 2 or median <= 0 or median == float("inf"):
            return 0.0
        return (self.high - self.low) / median

    def describe(self) -> str:
        """Return e.g. ``"1,234 img/s ±3%"`` (half the spread, as a plus-minus)."""
        return f"{self.images_per_s:,.0f} img/s ±{50 * self.spread:.0f}%"


def time_repeats(
    run: Callable[[], Count],
    *,
    repeats: int,
    warmup: int = 0,
    before: Callable[[], None] | None = None,
    on_repeat: Callable[[], None] | None = None,
) -> Timing:
    """Time ``run`` ``repeats`` times after ``warmup`` untimed runs.

    Args:
        run: One measurement; returns what it delivered.
        repeats: Timed runs (at least 1).
        warmup: Untimed runs first (worker start-up, page cache, lazy imports).
        before: Called before each timed run, outside the timing (e.g. drop the page
            cache).
        on_repeat: Called after each run, warm-up included (progress).

    Raises:
        OptionsError: ``repeats`` is below 1 or ``warmup`` negative.
    """
    if repeats < 1:
        raise OptionsError(f"repeats should be >= 1, but got repeats={repeats}")
    if warmup < 0:
        raise OptionsError(f"warmup should be >= 0, but got warmup={warmup}")
    for _ in range(warmup):
        run()
        if on_repeat is not None:
            on_repeat()
    elapsed: list[float] = []
    images: list[int] = []
    nbytes: list[int] = []
    for _ in range(repeats):
        if before is not None:
            before()
        started = time.perf_counter()
        count = run()
        elapsed.append(time.perf_counter() - started)
        images.append(count.images)
        nbytes.append(count.nbytes)
        if on_repeat is not None:
            on_repeat()
    return Timing(tuple(elapsed), tuple(images), tuple(nbytes))
