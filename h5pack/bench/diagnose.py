"""``bench --diagnose``: where a loader's time goes on one pack, and what would help.

# NOTE [ Diagnosing a loader ]
#
# After DS-Analyzer (Mohan et al., "Analyzing and Mitigating Data Stalls in DNN
# Training", VLDB 2021), the same loader settings run three ways:
# 1. ceiling: the pack's own images, already as the loader delivers them (cropped), held in
#    memory and served by the same DataLoader, sampler, workers and collation,
#    each batch allocated and filled by as many threads as the reader has: the loader's
#    own cost, everything but reading;
# 2. warm: the pack with its pages in the OS page cache: adds reading, decompression,
#    decoding, cropping;
# 3. cold: the pack dropped from the page cache before each epoch (see "Dropping the page
#    cache"): adds the storage.
# The stages are timed alike and interleaved, in runs long enough to time (see "Timing
# enough work"); a pack over ``INTERLEAVE_COLD_BYTES`` is timed cold after the others,
# since reading it back into the page cache before every warm run would take too long.
# A stage does strictly more work than the one before it, so a faster measured rate is
# noise: the rates are made non-increasing by pooling the offending neighbours (the
# weighted mean of their seconds per image, i.e. isotonic regression), and the report says
# so, and warns when the gap was wider than the measured spread. The time per image each
# stage adds is the difference of consecutive stages (never negative). The bottleneck is
# the stage that adds the most; storage counts only for a pack larger than the page cache
# can hold (a smaller one is read from disk in the first epoch alone). The advice is
# chosen for the pack measured (``pack_facts``; the words are ``h5pack.training.advice``'s,
# which the loader's stall report shares).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from h5pack.bench.ceiling import CeilingRunner, InMemoryImages, held_images
from h5pack.bench.options import BenchOptions
from h5pack.bench.system import (
    CacheDrop,
    drop_source,
    pack_files,
    source_bytes,
    warm_source,
)
from h5pack.bench.throughput import (
    BenchResult,
    Setup,
    bench_result,
    format_bench,
    open_bench,
)
from h5pack.bench.timing import Count, Timing, time_interleaved
from h5pack.core import jpegbox
from h5pack.core.machine import available_memory_bytes
from h5pack.core.units import human_bytes
from h5pack.read.packset import PackSource
from h5pack.training.advice import BOTTLENECKS, PackFacts, advise, share_labels

STAGES: tuple[str, ...] = ("ceiling", "warm", "cold")
SHARE_OF_STAGE = dict(zip(STAGES, BOTTLENECKS, strict=True))
STAGE_TITLES = {
    "ceiling": "in-memory batches (loader ceiling)",
    "warm": "pack, warm page cache",
    "cold": "pack, cold page cache",
}
# Up to this size the cold stage is interleaved with the others (the pack is read back
# into the page cache before each warm run); a larger pack is timed cold afterwards.
INTERLEAVE_COLD_BYTES = 2**30


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One stage of a diagnosis.

    Attributes:
        name: ``"ceiling"``, ``"warm"`` or ``"cold"``.
        timing: The timed runs, None when not measured.
        images_per_s: The stage's rate, consistent with the others (see "Diagnosing a
            loader"); the measured median is ``timing.images_per_s``.
        note: Why it was not measured, or how its rate was made consistent.
    """

    name: str
    timing: Timing | None
    images_per_s: float = 0.0
    note: str = ""

    @property
    def measured_per_s(self) -> float:
        """The measured median images per second (0 when not measured)."""
        return self.timing.images_per_s if self.timing else 0.0


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """Where a loader's time goes (see the note "Diagnosing a loader").

    Attributes:
        result: The warm run, as ``bench`` reports it.
        stages: ``ceiling``, ``warm`` and ``cold``.
        shares: Seconds per image added by ``loader``, ``decode`` and ``storage``.
        labels: What each share is for this pack (e.g. ``"decoding, crop and resize"``).
        bottleneck: The share that adds the most time, one of ``BOTTLENECKS``.
        cache_drop: What dropping the page cache did.
        advice: What would help, for this pack and these settings.
        explanation: One line naming the bottleneck and what would help.
        warnings: Figures to take with care (unstable timings, a ceiling below the pack).
    """

    result: BenchResult
    stages: tuple[Stage, ...]
    shares: dict[str, float]
    labels: dict[str, str]
    bottleneck: str
    cache_drop: CacheDrop
    advice: str
    explanation: str
    warnings: tuple[str, ...] = ()


def consistent_rates(rates: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """Return ``rates`` made non-increasing by pooling neighbours (isotonic regression).

    Pooling averages seconds per image, weighted by ``weights`` (e.g. timed runs).

    Example:
        >>> consistent_rates([100.0, 200.0, 50.0])     # a ceiling below the next stage
        [133.33333333333334, 133.33333333333334, 50.0]
    """
    seconds = [1.0 / r if r > 0 else math.inf for r in rates]
    blocks: list[list[float]] = []  # [mean seconds, weight, count]
    for value, weight in zip(seconds, weights or [1.0] * len(seconds), strict=True):
        blocks.append([value, float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            right, left = blocks.pop(), blocks.pop()
            total = left[1] + right[1]
            mean = (left[0] * left[1] + right[0] * right[1]) / total
            blocks.append([mean, total, left[2] + right[2]])
    pooled: list[float] = []
    for mean, _, count in blocks:
        pooled += [1.0 / mean if mean > 0 else math.inf] * int(count)
    return pooled


def pack_facts(setup: Setup) -> PackFacts:
    """Return the facts of the pack ``setup`` reads, with the memory available now."""
    from h5pack.check import pack_info

    store = setup.options.reader.store
    # a set's shards share one layout
    info = pack_info(pack_files(setup.source, store)[0], store=store)
    meta = setup.loader.dataset.meta
    return PackFacts(
        mode=meta.mode,
        codec=info.codec,
        layout=info.layout,
        chunk_bytes=info.chunk_bytes,
        file_bytes=source_bytes(setup.source, store),
        image_bytes=int(sum(int(h) * int(w) * int(c) for h, w, c in meta.shapes)),
        available_bytes=available_memory_bytes(),
        workers=setup.loader.workers,
        transforms=False,
        size=setup.train.size,
        cached=setup.options.cache is not None,
        whole_jpegs=jpegbox.unavailable_reason() or "",
    )


class _PageCache:
    """Drop the pack before a cold epoch; read it back before the next warm one."""

    def __init__(self, source: PackSource) -> None:
        self.source = source
        self.dropped = False
        self.failed: CacheDrop | None = None

    def drop(self) -> None:
        outcome = drop_source(self.source)
        self.dropped = True
        if not outcome.dropped and self.failed is None:
            self.failed = outcome

    def warm(self) -> None:
        if self.dropped:
            warm_source(self.source)
            self.dropped = False


def _consistent_stages(
    timings: dict[str, Timing | None], notes: dict[str, str]
) -> tuple[list[Stage], list[str]]:
    """Return the stages with consistent rates, and warnings about the measurement."""
    measured = [(name, t) for name in STAGES if (t := timings.get(name)) is not None]
    rates = [timing.images_per_s for _, timing in measured]
    weights = [float(len(timing.rates)) for _, timing in measured]
    pooled = dict(zip([n for n, _ in measured], consistent_rates(rates, weights), strict=True))
    warnings: list[str] = []
    unstable = [(name, timing) for name, timing in measured if not timing.stable]
    if unstable:
        spreads = ", ".join(f"±{50 * t.spread:.0f}% ({name})" for name, t in unstable)
        longest = max(t.epochs_per_run for _, t in unstable)
        warnings.append(
            f"the runs still differ by {spreads} after runs of up to {longest} epoch(s) "
            "(--time-budget): the machine may be busy; take those figures as rough"
        )
    for (upper, high), (lower, low) in itertools.pairwise(measured):
        if high.images_per_s >= low.images_per_s:
            continue
        gap = 1 - high.images_per_s / low.images_per_s
        noise = (high.spread + low.spread) / 2
        text = (
            f"{STAGE_TITLES[upper]} measured {gap:.0%} below {STAGE_TITLES[lower]}, though it "
            "does less work: both are taken at their pooled rate"
        )
        notes[upper] = notes[lower] = "pooled with the next stage: equal within noise"
        if gap > max(noise, 0.05):
            warnings.append(text + f" (beyond the measured spread of ±{50 * noise:.0f}%)")
    stages = [
        Stage(
            name=name,
            timing=timings.get(name),
            images_per_s=pooled.get(name, 0.0),
            note=notes.get(name, ""),
        )
        for name in STAGES
    ]
    return stages, warnings


def _shares(stages: Sequence[Stage]) -> dict[str, float]:
    """Seconds per image each stage adds (consistent rates: never negative)."""
    shares = dict.fromkeys(BOTTLENECKS, 0.0)
    previous = 0.0
    for stage in stages:
        if stage.timing is None:
            continue
        seconds = 1.0 / stage.images_per_s if stage.images_per_s > 0 else math.inf
        shares[SHARE_OF_STAGE[stage.name]] = max(0.0, seconds - previous)
        previous = seconds
    return shares


def diagnose(
    path: PackSource,
    options: BenchOptions | None = None,
    *,
    on_step: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Diagnosis:
    """Separate where the loader's time goes, name the bottleneck, say what would help.

    See the note "Diagnosing a loader". The cold stage is skipped, and says why, when the
    OS keeps the pack cached despite the request. Every duration is read from ``clock``
    (see "Timing enough work"), which tests replace with a fake one.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack.
    """
    options = options or BenchOptions()
    started = clock()
    setup = open_bench(path, options)
    images, labels = held_images(setup.loader.dataset)
    memory = InMemoryImages(
        images,
        labels,
        len(setup.loader.dataset),
        threads=setup.loader.threads,
    )
    ceiling = CeilingRunner(setup.loader, memory)

    def step(name: str) -> None:
        if on_step is not None:
            on_step()

    facts = pack_facts(setup)
    notes: dict[str, str] = {}
    cache = _PageCache(setup.source)

    def timed(
        runs: dict[str, Callable[[], Count]], *, warmup: int, budget_s: float
    ) -> dict[str, Timing]:
        return time_interleaved(
            runs,
            repeats=options.repeats,
            warmup=warmup,
            min_run_s=options.min_run_s,
            target_spread=options.target_spread,
            budget_s=budget_s,
            before={"warm": cache.warm, "cold": cache.drop},
            on_run=step,
            clock=clock,
        )

    try:
        probe = drop_source(setup.source)
        cold = probe.dropped
        together = cold and facts.file_bytes <= INTERLEAVE_COLD_BYTES
        warm_source(setup.source)
        runs: dict[str, Callable[[], Count]] = {"ceiling": ceiling, "warm": setup.loader}
        if together:
            runs["cold"] = setup.loader
        timings: dict[str, Timing | None] = dict(
            timed(runs, warmup=options.warmup, budget_s=options.budget_s)
        )
        if cold and not together:
            left = max(0.0, options.budget_s - (clock() - started))
            timings.update(timed({"cold": setup.loader}, warmup=0, budget_s=left))
        if facts.large:
            notes["warm"] = (
                f"the pack ({human_bytes(facts.file_bytes)}) is larger than half the memory "
                "available: the page cache cannot hold it all, so part of it came from disk"
            )
        if cache.failed is not None:
            probe, cold = cache.failed, False
        if not cold:
            timings["cold"] = None
            notes["cold"] = probe.message
        warm = timings["warm"]
        assert warm is not None  # always measured
        result = bench_result(setup, warm)
    finally:
        ceiling.close()
        setup.close()
    stages, warnings = _consistent_stages(timings, notes)
    shares = _shares(stages)
    labels_of = share_labels(facts)
    # A pack that fits in the page cache is read from disk in the first epoch only: the
    # bottleneck of training is then the larger of the other two.
    fits = facts.available_bytes is not None and not facts.large
    candidates = [k for k in BOTTLENECKS if k != "storage" or not fits]
    bottleneck = max(candidates, key=lambda k: shares[k])
    advice = advise(bottleneck, facts)
    explanation = f"bottleneck: {bottleneck} ({labels_of[bottleneck]}) — {advice}"
    if timings.get("cold") is None:
        explanation += f" (storage not measured: {probe.message})"
    elif fits and shares["storage"] > 0:
        explanation += (
            f". Reading from disk adds {1e3 * shares['storage']:.3f} ms/image to the first "
            f"epoch only: the pack ({human_bytes(facts.file_bytes)}) fits in the page cache "
            f"({human_bytes(facts.available_bytes or 0)} of memory available)"
        )
    return Diagnosis(
        result=result,
        stages=tuple(stages),
        shares=shares,
        labels=labels_of,
        bottleneck=bottleneck,
        cache_drop=probe,
        advice=advice,
        explanation=explanation,
        warnings=tuple(warnings),
    )


def format_diagnosis(diagnosis: Diagnosis) -> str:
    """Return a diagnosis as lines of text: each stage, the time it adds, the bottleneck."""
    lines = [format_bench(diagnosis.result, warn=False), ""]
    finite = [v for v in diagnosis.shares.values() if math.isfinite(v)]
    total = sum(finite) or 1.0
    for stage in diagnosis.stages:
        title = f"  {STAGE_TITLES[stage.name]:36s}"
        if stage.timing is None:
            lines.append(f"{title} not measured: {stage.note}")
            continue
        share_name = SHARE_OF_STAGE[stage.name]
        share = diagnosis.shares[share_name]
        rate = f"{stage.images_per_s:,.0f} img/s ±{50 * stage.timing.spread:.0f}%"
        lines.append(
            f"{title} {rate:>20s}   +{1e3 * share:.3f} ms/image ({share / total:.0%}, "
            f"{diagnosis.labels[share_name]})"
        )
        if abs(stage.images_per_s - stage.measured_per_s) > 0.005 * stage.measured_per_s:
            lines.append(f"  {'':36s} measured {stage.measured_per_s:,.0f} img/s; {stage.note}")
        elif stage.note:
            lines.append(f"  {'':36s} {stage.note}")
    lines += [f"warning: {w}" for w in diagnosis.warnings]
    lines += ["", diagnosis.explanation]
    return "\n".join(lines)
