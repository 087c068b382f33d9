"""Timing of repeated measurements: medians and spread, never a single run.

# NOTE [ Timing enough work ]
#
# An epoch of a small or fast pack lasts milliseconds, and scheduling noise then swings
# its rate by half (docs/decisions/0025). ``time_interleaved`` times runs of several
# epochs, at least ``min_run_s`` each, interleaved (A B C A B C ...) so that a drift of the
# machine falls on each alike. While a measurement's spread stays above its target and the
# budget allows, its runs are made twice as long and timed again; a spread still above
# target is reported (``Timing.stable``), never hidden. Durations come from one injected
# ``clock`` (tests use a fake one). Beside each run's seconds the CPU seconds of the whole
# process tree are read, so every rate comes with its CPU per image.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from h5pack.bench.system import tree_cpu_s
from h5pack.errors import OptionsError


@dataclass(frozen=True)
class Count:
    """What one timed run delivered: images and their decoded bytes."""

    images: int
    nbytes: int


@dataclass(frozen=True)
class Timing:
    """Throughput of several repeats of one measurement (one entry per repeat)."""

    elapsed_s: tuple[float, ...]
    images: tuple[int, ...]
    nbytes: tuple[int, ...]  # decoded bytes delivered
    epochs_per_run: int = 1
    target_spread: float | None = None  # see "Timing enough work"
    first_epoch_s: float | None = None  # the first warm-up epoch (None without warm-up)
    first_epoch_images: int = 0
    cpu_s: tuple[float, ...] = ()  # of the process tree (``tree_cpu_s``)

    @property
    def cpu_s_per_image(self) -> float | None:
        """Median over the repeats of CPU seconds per image, or None when not measured."""
        found = [c / n for c, n in zip(self.cpu_s, self.images, strict=False) if n > 0]
        return float(statistics.median(found)) if found else None

    @property
    def first_epoch_per_s(self) -> float | None:
        """Images per second of the first warm-up epoch, or None without one."""
        if self.first_epoch_s is None or self.first_epoch_s <= 0:
            return None
        return self.first_epoch_images / self.first_epoch_s

    @property
    def rates(self) -> tuple[float, ...]:
        """Images per second of each repeat."""
        pairs = zip(self.images, self.elapsed_s, strict=True)
        return tuple(n / s if s > 0 else float("inf") for n, s in pairs)

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

    @property
    def stable(self) -> bool:
        """Whether the spread reached its target (always, without a target)."""
        return self.target_spread is None or self.spread <= self.target_spread

    def describe(self) -> str:
        """Return e.g. ``"1,234 img/s ±3%, 812 us CPU/image"`` (± half the spread)."""
        cpu = self.cpu_s_per_image
        text = f"{self.images_per_s:,.0f} img/s ±{50 * self.spread:.0f}%"
        return text if cpu is None else f"{text}, {1e6 * cpu:,.0f} us CPU/image"


class _Stage:
    """One measurement of ``time_interleaved``: its epochs, their timings, its run length."""

    def __init__(
        self, run: Callable[[], Count], clock: Callable[[], float], cpu: Callable[[], float]
    ) -> None:
        self.run, self.clock, self.cpu = run, clock, cpu
        self.epochs = 1
        self.epoch_s: float | None = None  # a typical epoch, from the warm-up
        self.first: tuple[float, int] | None = None  # the first warm-up epoch
        self.runs: list[tuple[float, int, int, float]] = []

    def epoch(self) -> tuple[float, Count, float]:
        started, spent = self.clock(), self.cpu()
        count = self.run()
        return self.clock() - started, count, self.cpu() - spent

    def timed_run(self, min_run_s: float) -> tuple[float, int, int, float]:
        """Run ``epochs`` epochs (until ``min_run_s`` on the first run without a warm-up)."""
        elapsed = used = 0.0
        images = nbytes = done = 0
        adaptive = self.epoch_s is None and not self.runs
        while done < self.epochs or (adaptive and elapsed < min_run_s):
            seconds, count, cpu_s = self.epoch()
            elapsed, used, done = elapsed + seconds, used + cpu_s, done + 1
            images, nbytes = images + count.images, nbytes + count.nbytes
        if adaptive:
            self.epochs = done
        return elapsed, images, nbytes, used

    def timing(self, target: float | None) -> Timing:
        elapsed, images, nbytes, used = zip(*self.runs, strict=True) if self.runs else [()] * 4
        first_s, first_images = self.first if self.first is not None else (None, 0)
        return Timing(
            tuple(elapsed),
            tuple(images),
            tuple(nbytes),
            self.epochs,
            target,
            first_epoch_s=first_s,
            first_epoch_images=first_images,
            cpu_s=tuple(used),
        )


def time_interleaved(
    runs: Mapping[str, Callable[[], Count]],
    *,
    repeats: int,
    warmup: int = 0,
    min_run_s: float = 0.0,
    target_spread: float | None = None,
    budget_s: float | None = None,
    on_run: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    cpu: Callable[[], float] = tree_cpu_s,
) -> dict[str, Timing]:
    """Time several measurements alike: interleaved, each run long enough, until steady.

    ``runs``: each measurement's epoch (one call, one epoch). See "Timing enough work";
    ``on_run`` is called with a name after each warm-up epoch and timed run; every duration
    is read from ``clock``, CPU seconds of the process tree from ``cpu``.
    """
    if repeats < 1 or warmup < 0 or min_run_s < 0:
        raise OptionsError(
            "repeats should be >= 1 and warmup, min_run_s >= 0, but got "
            f"repeats={repeats}, warmup={warmup}, min_run_s={min_run_s}"
        )
    started = clock()
    stages = {name: _Stage(run, clock, cpu) for name, run in runs.items()}
    report = on_run or (lambda name: None)
    for _ in range(warmup):
        for name, stage in stages.items():
            stage.epoch_s, count, _ = stage.epoch()
            if stage.first is None:
                stage.first = (stage.epoch_s, count.images)
            report(name)
    for stage in stages.values():
        if stage.epoch_s is not None:
            stage.epochs = max(1, math.ceil(min_run_s / max(stage.epoch_s, 1e-9)))

    def rounds(names: list[str]) -> None:
        for _ in range(repeats):
            for name in names:
                stages[name].runs.append(stages[name].timed_run(min_run_s))
                report(name)

    rounds(list(stages))
    for _ in range(6 if target_spread is not None and repeats > 1 else 0):  # <= 64x longer
        noisy = [n for n, s in stages.items() if not s.timing(target_spread).stable]
        cost = sum(2 * sum(stages[n].timing(None).elapsed_s) for n in noisy)
        if not noisy or budget_s is None or clock() - started + cost > budget_s:
            break
        for name in noisy:
            stages[name].epochs *= 2
            stages[name].runs.clear()
        rounds(noisy)
    return {name: stage.timing(target_spread) for name, stage in stages.items()}
