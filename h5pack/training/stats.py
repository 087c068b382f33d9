"""Whether training waits for its batches, and which stage of the loader is why: ``stats()``.

NOTE [ Stall report ]: for a few clock readings per batch, the loop's wait in ``next()``
against its step, and each process's nanoseconds per stage (``StageTimes``), sent along with
each batch by ``TimedCollate``. The dominant stage names a bottleneck (``training.advice``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from h5pack.core.arguments import check_int
from h5pack.training.advice import PackFacts, advise, share_labels, short_fix

STAGES: tuple[str, ...] = ("storage", "decompression", "decode", "crop", "collation", "transfer")
STAGE_WORDS = {
    "storage": "reading the pack",
    "decompression": "decompressing chunks",
    "decode": "decoding the image files",
    "crop": "cropping and resizing",
    "collation": "filling and collating batches",
    "transfer": "moving batches to the device",
}
# The bottleneck (``advice.BOTTLENECKS``) each stage belongs to.
STAGE_BOTTLENECK = {
    "storage": "storage",
    "decompression": "decode",
    "decode": "decode",
    "crop": "decode",
    "collation": "loader",
    "transfer": "loader",
}
# Below this share of the step spent waiting, training is compute-bound: say so, not more.
COMPUTE_BOUND_WAIT = 0.1

_INDEX = {name: i for i, name in enumerate(STAGES)}
Clock = Callable[[], int]  # nanoseconds
T = TypeVar("T")


class StageTimes:
    """Nanoseconds per stage spent by this process's threads since the last ``take``."""

    def __init__(self, clock: Clock = time.perf_counter_ns) -> None:
        self.clock = clock
        self._ns = np.zeros(len(STAGES), dtype=np.int64)
        self._lock = threading.Lock()

    def add(self, stage: str, ns: int) -> None:
        """Count ``ns`` nanoseconds spent in ``stage`` (one of ``STAGES``)."""
        with self._lock:
            self._ns[_INDEX[stage]] += max(0, ns)

    def take(self) -> np.ndarray:
        """Return the nanoseconds per stage since the last call, and start again."""
        with self._lock:
            taken, self._ns = self._ns, np.zeros(len(STAGES), dtype=np.int64)
        return taken


_TIMES: dict[int, StageTimes] = {}
_TIMES_LOCK = threading.Lock()


def stage_times() -> StageTimes:
    """Return this process's ``StageTimes`` (a forked worker gets its own, empty)."""
    pid = os.getpid()
    times = _TIMES.get(pid)
    if times is None:
        with _TIMES_LOCK:
            times = _TIMES.setdefault(pid, StageTimes())
    return times


def timed_read(reader: Any, read: Callable[[], T]) -> tuple[T, int]:
    """Return ``read()`` and its ns: ``decompress_ns`` as decompression, the rest as storage."""
    times = stage_times()
    start, before = times.clock(), reader.decompress_ns
    result = read()
    spent, decompressing = times.clock() - start, reader.decompress_ns - before
    times.add("decompression", decompressing)
    times.add("storage", spent - decompressing)
    return result, spent


@dataclass(slots=True)
class StageNs:
    """A batch's nanoseconds per stage, beside it: its own type, never mistaken for user data."""

    ns: np.ndarray


def images_in(batch: Any) -> int:
    """The images in a batch: the length of its first element (or of the batch itself)."""
    first = batch[0] if isinstance(batch, tuple | list) and batch else batch
    try:
        return len(first)
    except TypeError:
        return 1


class TimedCollate:
    """Wrap a collate function to also return the process's stage times since its last batch."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, samples: Any) -> tuple[Any, StageNs]:  # noqa: D102
        times = stage_times()
        start = times.clock()
        batch = self.collate(samples)
        times.add("collation", times.clock() - start)
        return batch, StageNs(times.take())


@dataclass(frozen=True, kw_only=True)
class LoaderStats:
    """Where a training loop's time went, and why the loader is as fast as it is.

    Attributes:
        wait_share: ``wait_s / (wait_s + step_s)``: the share of each step spent waiting.
        loader_images_per_s: Images per second of stage time, times the processes (or
            threads) filling batches; 0 when unknown.
        stage_s: Seconds per stage (``STAGES``), summed over processes and threads.
        dominant: The stage with the most time ("" when none was timed).
        bottleneck: ``"compute"`` (waits under ``COMPUTE_BOUND_WAIT``), else ``"storage"``,
            ``"decode"`` or ``"loader"`` (``advice.BOTTLENECKS``).
        advice: What would help, in words; ``fix``: the first thing to try.

    ``str()`` is one short line; ``line(full=True)`` the whole report.
    """

    steps: int
    images: int
    wait_s: float
    step_s: float
    wait_share: float
    images_per_s: float
    loader_images_per_s: float
    stage_s: dict[str, float]
    dominant: str
    bottleneck: str
    advice: str
    fix: str = ""

    def __str__(self) -> str:
        return self.line()

    def line(self, *, full: bool = False) -> str:
        """Return the report in one line: short (wait, bottleneck, fix), or ``full``."""
        if not full:
            head = f"waited {self.wait_share:.0%} for batches"
            if self.bottleneck == "compute":
                return head + "; compute-bound: nothing to change"
            if not self.fix:
                return head + "; bottleneck: the loader (its stages are not timed)"
            return head + f"; bottleneck: {self.bottleneck}; fix: {self.fix}"
        head = (
            f"{self.steps} steps, waited {self.wait_share:.0%} of the time for batches; "
            f"{self.images_per_s:,.0f} images/s taken"
        )
        if self.loader_images_per_s > 0:
            head += f", the loader alone ~{self.loader_images_per_s:,.0f} images/s"
        total = sum(self.stage_s.values())
        if self.dominant and total > 0:
            share = self.stage_s[self.dominant] / total
            head += f"; {STAGE_WORDS[self.dominant]} takes {share:.0%} of its time"
        if self.bottleneck == "compute":
            return head + " — compute-bound: the loader keeps up, nothing to change"
        if not self.advice:  # no stage times or facts: not an h5pack loader underneath
            return head + " — the loader is the bottleneck (its stages are not timed)"
        return head + f" — bottleneck: {self.bottleneck}: {self.advice}"


@dataclass
class StallMonitor:
    """Accumulate a training loop's waits, steps and the loader's stage times.

    ``parallel``: processes (or threads) filling batches; ``facts``: the ``PackFacts`` for
    the advice, or a function returning them at the first ``stats()``; ``every``, ``log``
    and ``full``: as ``report_every`` sets them.
    """

    parallel: int = 1
    facts: PackFacts | Callable[[], PackFacts] | None = None
    clock: Callable[[], float] = time.perf_counter
    every: int = 0
    log: Callable[[str], None] | None = None
    full: bool = False
    steps: int = 0
    images: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    stage_ns: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES), dtype=np.int64))
    last_stage_ns: np.ndarray | None = None  # the stage times of the batch taken last

    def record(self, wait_s: float, step_s: float, images: int, stage_ns: Any = None) -> None:
        """Count one batch: the wait for it, the step on it, its images and stage times."""
        self.steps += 1
        self.images += images
        self.wait_s += max(0.0, wait_s)
        self.step_s += max(0.0, step_s)
        if stage_ns is not None:
            self.stage_ns += np.asarray(stage_ns, dtype=np.int64)
        if self.every and self.steps % self.every == 0:
            (self.log or logging.getLogger("h5pack").info)(self.stats().line(full=self.full))

    def report_every(
        self, steps: int, log: Callable[[str], None] | None = None, *, full: bool = False
    ) -> None:
        """Log the short line (or ``full`` report) every ``steps`` batches (0: never).

        ``log`` defaults to the ``h5pack`` logger at INFO.
        """
        self.every, self.log, self.full = check_int("steps", steps, minimum=0), log, full

    def reset(self) -> None:
        """Forget what was counted (e.g. after a warm-up epoch)."""
        self.steps = self.images = 0
        self.wait_s = self.step_s = 0.0
        self.stage_ns = np.zeros(len(STAGES), dtype=np.int64)

    def stats(self) -> LoaderStats:
        """Return what was counted so far (see ``LoaderStats``)."""
        if callable(self.facts):
            self.facts = self.facts()
        facts = self.facts if isinstance(self.facts, PackFacts) else None
        stage_s = {name: float(ns) / 1e9 for name, ns in zip(STAGES, self.stage_ns, strict=True)}
        busy = sum(stage_s.values())
        total = self.wait_s + self.step_s
        wait_share = self.wait_s / total if total > 0 else 0.0
        dominant = max(STAGES, key=lambda name: stage_s[name]) if busy > 0 else ""
        if wait_share < COMPUTE_BOUND_WAIT or not dominant:
            bottleneck = "compute" if wait_share < COMPUTE_BOUND_WAIT else "loader"
        else:
            bottleneck = STAGE_BOTTLENECK[dominant]
            if bottleneck == "storage" and facts is not None and not facts.large:
                # a pack the page cache holds is read from memory: copying it is decode's work
                bottleneck = "decode"
        advice = fix = ""
        if bottleneck != "compute" and facts is not None:
            advice = f"{share_labels(facts)[bottleneck]}: {advise(bottleneck, facts)}"
            fix = short_fix(bottleneck, facts)
        images = self.images
        return LoaderStats(
            steps=self.steps,
            images=images,
            wait_s=self.wait_s,
            step_s=self.step_s,
            wait_share=wait_share,
            images_per_s=images / total if total > 0 else 0.0,
            loader_images_per_s=images * max(1, self.parallel) / busy if busy > 0 else 0.0,
            stage_s=stage_s,
            dominant=dominant,
            bottleneck=bottleneck,
            advice=advice,
            fix=fix,
        )

    def timed(self, batches: Any) -> Iterator[Any]:
        """Yield the batches, timing the waits for them and the steps on them.

        ``(batch, StageNs)`` pairs (a list once pinned) are unwrapped, their stage times
        counted and kept as ``last_stage_ns``.
        """
        clock = self.clock
        iterator = iter(batches)
        back = clock()
        for item in iterator:
            got = clock()
            timed = isinstance(item, tuple | list) and len(item) == 2
            if timed and isinstance(item[1], StageNs):
                batch, self.last_stage_ns = item[0], item[1].ns
            else:
                batch, self.last_stage_ns = item, None
            stage_ns = self.last_stage_ns
            yield batch
            resumed = clock()
            self.record(got - back, resumed - got, images_in(batch), stage_ns)
            back = resumed
