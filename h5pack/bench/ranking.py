"""Which measured variant to use: each variant's results, and the recommendation.

A variant is recommended only when the loader can batch it as training reads it, and a
pack larger than the page cache is judged by its cold figures (see the note "Packs larger
than memory").

# NOTE [ Packs larger than memory ]
#
# The page cache holds what memory the training process leaves. A pack larger than
# ``CACHE_SHARE`` of the memory available when the comparison starts cannot stay cached
# next to training, so every epoch reads it from disk: it is measured with the page cache
# dropped before every timed epoch (``MeasureOptions.cold``), as ``bench --diagnose`` does.
# Where the OS keeps it cached anyway (tmpfs), its warm figures would overstate it: it is
# then recommended only when no pack that fits is a candidate, and the report says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from h5pack.bench.measure import PatternResult
from h5pack.bench.reading import TrainingRead
from h5pack.bench.units import human_bytes
from h5pack.training.advice import CACHE_SHARE

# A variant within this fraction of the fastest counts as "as fast" for the recommendation,
# which then prefers the smallest file among them.
AS_FAST = 0.9

# CACHE_SHARE: the share of the available memory a pack may take and still count as cached
# while training runs (see "Packs larger than memory"); the loader's stall report uses it too.


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    """One pack measured.

    Attributes:
        name: The variant's name (or the pack's file name).
        path: The pack, or None when it was removed after measuring.
        mode: ``"raw"`` or ``"encoded"``.
        storage: ``"array"`` or ``"blob"``.
        layout: ``"chunked"`` or ``"contiguous"``.
        codec: Compression, e.g. ``"gzip level 4"`` or ``"none"``.
        chunk_bytes: Uncompressed bytes of one chunk (0 when contiguous).
        samples_per_chunk: Mean samples per chunk group.
        num_samples: Samples in the pack.
        file_bytes: Size of the pack.
        image_bytes: Decoded bytes of every image (what training receives).
        convert_s: Conversion wall time, None for a pack given as it is.
        command: The ``h5pack convert`` command that builds it, None for a given pack.
        patterns: Each access pattern's result.
        problem: Why the loader cannot batch it as training reads it (then it is never
            recommended), else None.
        cold: Whether it was measured with a cold page cache (larger than the cache).
    """

    name: str
    path: str | None
    mode: str
    storage: str
    layout: str
    codec: str
    chunk_bytes: int
    samples_per_chunk: float
    num_samples: int
    file_bytes: int
    image_bytes: int
    convert_s: float | None
    command: str | None
    patterns: dict[str, PatternResult]
    problem: str | None = None
    cold: bool = False

    @property
    def ratio(self) -> float:
        """Decoded image bytes over file bytes (how much smaller than raw pixels)."""
        return self.image_bytes / self.file_bytes if self.file_bytes else 0.0

    @property
    def batchable(self) -> bool:
        """Whether the loader can stack its images into batches as training reads them."""
        return self.problem is None

    @property
    def page_cache(self) -> str:
        """``"warm"``, ``"cold"``, or why a cold measurement stayed warm."""
        states = [r.page_cache for r in self.patterns.values()]
        return next((s for s in states if s.startswith("warm:")), states[0] if states else "warm")

    @property
    def overstated(self) -> bool:
        """Larger than the page cache, but measured warm (the OS kept it cached)."""
        return self.cold and self.page_cache != "cold"

    def rate(self, pattern: str = "chunk") -> float:
        """Median images per second of ``pattern`` (0 when not measured)."""
        result = self.patterns.get(pattern)
        return result.images_per_s if result else 0.0


@dataclass(frozen=True)
class SkippedVariant:
    """A variant that could not be built, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Recommendation:
    """The variant to use for this data and machine, and why.

    Attributes:
        name: The variant, or None when no variant is a candidate.
        line: One line saying which and why, in the user's terms.
        command: The ``h5pack convert`` command that builds it (None for a given pack).
        notes: Further lines: the other patterns, memory, variants not recommended.
    """

    name: str | None
    line: str
    command: str | None
    notes: tuple[str, ...] = ()


def rank_key(result: VariantResult) -> float:
    """Sort key of the ranking: chunk-aware throughput, else the best pattern measured."""
    if "chunk" in result.patterns:
        return result.rate("chunk")
    return max((r.images_per_s for r in result.patterns.values()), default=0.0)


def _names(results: Sequence[VariantResult]) -> str:
    return ", ".join(r.name for r in results)


def _memory_note(
    results: Sequence[VariantResult], available_bytes: int | None, cache_share: float
) -> str:
    if available_bytes is None:
        return "The memory available is unknown here: every pack was measured warm."
    cold = [r for r in results if r.cold]
    largest = max(results, key=lambda r: r.file_bytes)
    if not cold:
        return (
            f"Every pack fits in the page cache ({human_bytes(largest.file_bytes)} at most, with "
            f"{human_bytes(available_bytes)} of memory available), so each was read from memory: "
            "here a smaller file saves disk and cache room, not time."
        )
    verb = "is" if len(cold) == 1 else "are"
    them = "it" if len(cold) == 1 else "them"
    note = (
        f"{_names(cold)} {verb} larger than {cache_share:.0%} of the memory available "
        f"({human_bytes(available_bytes)}), so training would read {them} from disk: measured "
        "with a cold page cache."
    )
    overstated = [r for r in cold if r.overstated]
    if overstated:
        note += (
            f" The OS kept {_names(overstated)} cached all the same "
            f"({overstated[0].page_cache.removeprefix('warm: ')}): their figures are warm and "
            "overstate them, so packs that fit are preferred."
        )
    return note


def recommend(
    results: Sequence[VariantResult],
    *,
    train: TrainingRead | None = None,
    available_bytes: int | None = None,
    cache_share: float = CACHE_SHARE,
) -> Recommendation | None:
    """Pick the smallest pack among the candidates within ``AS_FAST`` of the fastest.

    Candidates are the packs the loader can batch as training reads them; a pack larger
    than the page cache that was measured warm all the same is one only when no pack that
    fits is (see "Packs larger than memory"). Throughput is the h5pack loader's in its
    chunk-aware order; a pack nearly as fast but much smaller wins, because it also costs
    less disk and page cache, and its advantage grows when storage is slower than the
    machine this ran on.
    """
    if not results:
        return None
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
            "e.g. --train-size 224), or store raw pixels at one size (--size H W)."
        )
        return Recommendation(None, line, None, tuple(notes))
    trusted = [r for r in candidates if not r.overstated] or candidates
    best = max(rank_key(r) for r in trusted)
    close = [r for r in trusted if rank_key(r) >= AS_FAST * best]
    choice = min(close, key=lambda r: (r.file_bytes, -rank_key(r)))
    fastest = max(trusted, key=rank_key)
    why = (
        f"{rank_key(choice):,.0f} images/s as training reads it ({train.describe()}) through "
        "h5pack's chunk-aware loader"
    )
    if choice is not fastest:
        why += (
            f", within {1 - rank_key(choice) / best:.0%} of the fastest ({fastest.name}) and "
            f"{fastest.file_bytes / choice.file_bytes:.1f}x smaller "
            f"({human_bytes(choice.file_bytes)} against {human_bytes(fastest.file_bytes)})"
        )
    else:
        why += f", the fastest ({human_bytes(choice.file_bytes)})"
    if choice.cold:
        why += "; measured from disk, as training will read a pack this large"
    others = [
        f"{choice.rate(p):,.0f} images/s {where}"
        for p, where in (("random", "in a full shuffle"), ("sequential", "in pack order"))
        if p in choice.patterns
    ]
    if others:
        notes.insert(0, f"Through the same loader, {choice.name} reads {' and '.join(others)}.")
    smallest = min(trusted, key=lambda r: r.file_bytes)
    if smallest is not choice and choice.file_bytes >= 2 * smallest.file_bytes:
        slower = rank_key(choice) / rank_key(smallest) if rank_key(smallest) else math.inf
        notes.append(
            f"The smallest, {smallest.name} ({human_bytes(smallest.file_bytes)}, "
            f"{choice.file_bytes / smallest.file_bytes:.1f}x smaller), reads at "
            f"{rank_key(smallest):,.0f} images/s ({slower:.1f}x slower): the choice when "
            "disk space or memory for the page cache is short."
        )
    notes.insert(1 if others else 0, _memory_note(results, available_bytes, cache_share))
    return Recommendation(
        choice.name,
        f"Use {choice.name} for this data on this machine: {why}.",
        choice.command,
        tuple(notes),
    )
