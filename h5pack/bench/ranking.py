"""Which measured variant to use: each variant's results, and the recommendation.

A variant is recommended only when the loader can batch it as training reads it.

# NOTE [ A recommendation stable run to run ]
#
# Medians of a few runs on a shared machine move by tens of percent between comparisons,
# so each variant is judged by its interval, slowest to fastest timed run: it is a
# front-runner when its fastest run reaches ``AS_FAST`` of the fastest variant's slowest
# run, and the smallest front-runner is chosen; noise widens the set rather than
# reordering it. When the choice's runs overlap a faster front-runner's, the line says
# "too close to call". Runs spread past ``ROUGH_SPREAD`` carry a warning.
#
# NOTE [ Like with like ]
#
# A pack of thumbnails reads faster than the full-resolution pack it came from, but holds
# other pixels: only layouts of the same images compete. Packs are grouped by the images
# they hold (``VariantResult.pixels``); the recommendation is made within the group of the
# largest images that has two packs or more. ``across_pixels`` ranks every pack together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from h5pack.bench.measure import PatternResult
from h5pack.bench.reading import TrainingRead
from h5pack.core.units import human_bytes
from h5pack.training.advice import CACHE_SHARE

AS_FAST = 0.9  # within this fraction of the fastest counts as "as fast"
ROUGH_SPREAD = 0.2  # runs spread wider (fastest - slowest over median) are rough


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    """One pack measured (``mode``, ``storage``, ``layout``, ``codec`` as ``info`` says them)."""

    name: str  # the variant's, or the pack's file name
    path: str | None  # None when removed after measuring
    mode: str
    storage: str
    layout: str
    codec: str
    chunk_bytes: int  # uncompressed, 0 when contiguous
    samples_per_chunk: float  # mean
    num_samples: int
    file_bytes: int
    image_bytes: int  # decoded bytes of every image: what training receives
    convert_s: float | None  # None for a pack given as it is
    command: str | None  # the ``h5pack convert`` command that builds it
    patterns: dict[str, PatternResult]
    problem: str | None = None  # why the loader cannot batch it (never recommended then)
    pixels: str = ""  # the images it holds, in words (see "Like with like")

    @property
    def pixels_per_file_byte(self) -> float:
        """Decoded image bytes over file bytes (not ``info``'s ratio: the codec's alone)."""
        return self.image_bytes / self.file_bytes if self.file_bytes else 0.0

    def interval(self, pattern: str = "chunk") -> tuple[float, float]:
        """Slowest and fastest timed run of ``pattern`` (images/s; 0, 0 when not measured)."""
        result = self.patterns.get(pattern)
        return (result.timing.low, result.timing.high) if result else (0.0, 0.0)

    @property
    def batchable(self) -> bool:
        """Whether the loader can stack its images into batches as training reads them."""
        return self.problem is None

    def rate(self, pattern: str = "chunk") -> float:
        """Median images per second of ``pattern`` (0 when not measured)."""
        result = self.patterns.get(pattern)
        return result.images_per_s if result else 0.0


@dataclass(frozen=True)
class Recommendation:
    """The variant to use for this data and machine (None: no candidate), and why."""

    name: str | None
    line: str  # which and why, in the user's terms
    command: str | None  # the ``h5pack convert`` command that builds it
    notes: tuple[str, ...] = ()  # the other patterns, memory, variants not recommended
    too_close: tuple[str, ...] = ()  # front-runners whose timed runs overlap the choice's
    rough: bool = False  # some candidate's runs still spread past ``ROUGH_SPREAD``


def rank_pattern(result: VariantResult) -> str:
    """The pattern a variant is ranked by: chunk-aware, else the fastest one measured."""
    if "chunk" in result.patterns or not result.patterns:
        return "chunk"
    return max(result.patterns, key=lambda p: result.patterns[p].images_per_s)


def rank_key(result: VariantResult) -> float:
    """Sort key of the ranking: chunk-aware throughput, else the best pattern measured."""
    return result.rate(rank_pattern(result))


def _span(result: VariantResult) -> tuple[float, float]:
    return result.interval(rank_pattern(result))


def front_runners(results: Sequence[VariantResult]) -> list[VariantResult]:
    """Return the variants the figures cannot rank below the fastest (see the note)."""
    if not results:
        return []
    best = max(rank_key(r) for r in results)
    floor = AS_FAST * min(_span(max(results, key=rank_key))[0] or best, best)
    return [r for r in results if rank_key(r) >= AS_FAST * best or _span(r)[1] >= floor]


def _rough_note(results: Sequence[VariantResult]) -> str | None:
    rough = [
        (r.name, p, t.timing.spread)
        for r in results
        for p, t in r.patterns.items()
        if t.timing.spread > ROUGH_SPREAD or not t.timing.stable
    ]
    if not rough:
        return None
    shown = ", ".join(f"±{50 * spread:.0f}% ({name}, {p})" for name, p, spread in rough[:4])
    more = f" and {len(rough) - 4} more" if len(rough) > 4 else ""
    return (
        f"The runs still differ by {shown}{more}: the machine may be busy; take those "
        "figures as rough (and compare again when it is idle)."
    )


def _names(results: Sequence[VariantResult]) -> str:
    return ", ".join(r.name for r in results)


def _memory_note(results: Sequence[VariantResult], available_bytes: int | None) -> str:
    if available_bytes is None:
        return "The memory available is unknown here: every pack was measured warm."
    large = [r for r in results if r.file_bytes > CACHE_SHARE * available_bytes]
    if not large:
        largest = max(r.file_bytes for r in results)
        return (
            f"Every pack fits in the page cache ({human_bytes(largest)} at most, with "
            f"{human_bytes(available_bytes)} of memory available), so each was read from memory: "
            "here a smaller file saves disk and cache room, not time."
        )
    verb = "is" if len(large) == 1 else "are"
    return (
        f"{_names(large)} {verb} larger than {CACHE_SHARE:.0%} of the memory available "
        f"({human_bytes(available_bytes)}): training would read from disk what this warm "
        "measurement read from memory; the loader's stall report (loader.stats()) says "
        "when storage holds training back."
    )


def pixel_groups(results: Sequence[VariantResult]) -> list[list[VariantResult]]:
    """Return ``results`` grouped by the images they hold, the largest images first."""
    groups: dict[str, list[VariantResult]] = {}
    for result in results:
        groups.setdefault(result.pixels, []).append(result)
    return sorted(groups.values(), key=lambda g: -g[0].image_bytes / max(1, g[0].num_samples))


def recommend(
    results: Sequence[VariantResult],
    *,
    train: TrainingRead | None = None,
    available_bytes: int | None = None,
    across_pixels: bool = False,
) -> Recommendation | None:
    """Pick the smallest pack among the candidates within ``AS_FAST`` of the fastest.

    Candidates are the packs the loader can batch as training reads them, ranked by the
    loader's chunk-aware throughput. Packs holding different pixels compete only with
    ``across_pixels`` (see "Like with like").
    """
    if not results:
        return None
    groups = pixel_groups([r for r in results if r.batchable])
    if len(groups) < 2:
        return _recommend(results, train, available_bytes)
    note = "These packs hold different pixels (" + "; ".join(
        f"{_names(g)}: {g[0].pixels}" for g in groups
    )
    note += ")"
    group = None if across_pixels else next((g for g in groups if len(g) > 1), None)
    if across_pixels:
        found = _recommend(results, train, available_bytes)
        extra = f"{note}: ranked on speed all the same (--across-pixels)."
    elif group is None:
        return Recommendation(
            None,
            f"Not ranked: {note[0].lower()}{note[1:]}, so the faster one is not a faster "
            "layout of the same images. Compare layouts of one image folder, or give "
            "--across-pixels to rank them on speed alone.",
            None,
        )
    else:
        rest = [*group, *(r for r in results if not r.batchable)]
        found = _recommend(rest, train, available_bytes)
        others = [r for r in results if r.batchable and r not in group]
        extra = (
            f"{note}: ranked among the packs of {group[0].pixels} only; not against "
            f"{_names(others)} (--across-pixels ranks every pack on speed alone)."
        )
    assert found is not None
    return dataclasses.replace(found, notes=(extra, *found.notes))


def _recommend(
    results: Sequence[VariantResult],
    train: TrainingRead | None,
    available_bytes: int | None,
) -> Recommendation | None:
    train = train or TrainingRead()
    notes: list[str] = []
    excluded = [r for r in results if not r.batchable]
    candidates = [r for r in results if r.batchable]
    if excluded:
        notes.append(f"Not candidates: {_names(excluded)}: {excluded[0].problem}.")
    if not candidates:
        line = (
            "No layout to recommend: the loader cannot batch any of them as read "
            f"({excluded[0].problem}). Give the size training reads them at (--train-size, "
            "e.g. --train-size 224), or store raw pixels at one size (--size N (or H,W))."
        )
        return Recommendation(None, line, None, tuple(notes))
    best = max(rank_key(r) for r in candidates)
    fastest = max(candidates, key=rank_key)
    close = front_runners(candidates)
    choice = min(close, key=lambda r: (r.file_bytes, -rank_key(r)))
    low, high = _span(choice)
    tied = [
        r
        for r in close
        if r is not choice
        and rank_key(r) > rank_key(choice)
        and low <= _span(r)[1]
        and _span(r)[0] <= high
    ]
    why = (
        f"{rank_key(choice):,.0f} images/s as training reads it ({train.describe()}) through "
        "h5pack's chunk-aware loader"
    )
    if tied:
        ranges = "; ".join(
            f"{r.name} {_span(r)[0]:,.0f}-{_span(r)[1]:,.0f}" for r in (choice, *tied)
        )
        why += (
            f"; too close to call against {_names(tied)}: their timed runs overlap ({ranges} "
            f"images/s), and {choice.name} is the smallest of them "
            f"({human_bytes(choice.file_bytes)})"
        )
    elif choice is not fastest:
        why += (
            f", within {1 - rank_key(choice) / best:.0%} of the fastest ({fastest.name}) and "
            f"{fastest.file_bytes / choice.file_bytes:.1f}x smaller "
            f"({human_bytes(choice.file_bytes)} against {human_bytes(fastest.file_bytes)})"
        )
    else:
        why += f", the fastest ({human_bytes(choice.file_bytes)})"
    others = [
        f"{choice.rate(p):,.0f} images/s {where}"
        for p, where in (("random", "in a full shuffle"), ("sequential", "in pack order"))
        if p in choice.patterns
    ]
    if others:
        notes.insert(0, f"Through the same loader, {choice.name} reads {' and '.join(others)}.")
    smallest = min(candidates, key=lambda r: r.file_bytes)
    if smallest is not choice and choice.file_bytes >= 2 * smallest.file_bytes:
        slower = rank_key(choice) / rank_key(smallest) if rank_key(smallest) else math.inf
        notes.append(
            f"The smallest, {smallest.name} ({human_bytes(smallest.file_bytes)}, "
            f"{choice.file_bytes / smallest.file_bytes:.1f}x smaller), reads at "
            f"{rank_key(smallest):,.0f} images/s ({slower:.1f}x slower): the choice when "
            "disk space or memory for the page cache is short."
        )
    notes.insert(1 if others else 0, _memory_note(results, available_bytes))
    rough = _rough_note(candidates)
    if rough is not None:
        notes.insert(0, rough)
    return Recommendation(
        choice.name,
        f"Use {choice.name} for this data on this machine: {why}.",
        choice.command,
        tuple(notes),
        too_close=tuple(r.name for r in tied),
        rough=rough is not None,
    )
