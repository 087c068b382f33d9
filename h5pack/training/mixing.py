"""How well a pack's chunks mix labels (the unmixed-pack warning), how random an order is."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap, chunk_map_of
from h5pack.errors import OptionsError

# NOTE [ Label mixing ]: a chunk-aware epoch mixes one window of K chunks at a time; chunks
# in class order make a batch hold the classes of K chunks only, which costs accuracy
# (docs/decisions/0022). The figure is the mean label entropy of the sampler's windows over
# the same with the labels spread at random: ~1 for a shuffled pack whatever its classes,
# 0 for one class per window. It counts below the threshold only beyond ``MIN_Z`` standard
# deviations of ``NULL_SHUFFLES`` random spreads; labels -1 are left out, under two labels
# is exempt. Where chunks do not mix, the sampler orders them with ``stratified_order`` and
# widens a default window to ``window_needed`` (``sampler_for_labels``).

MIXING_THRESHOLD = 0.99  # below it (significantly) the loader warns (decisions/0022)
MIN_Z = 5.0
NULL_SHUFFLES = 16
# The cost bound: samples measured per window draw, and draws while under MIN_WINDOWS windows.
MAX_SAMPLED = 2**18
WINDOW_DRAWS = 8
MIN_WINDOWS = 64


class MixingWarning(UserWarning):
    """A loader's window does not mix the pack's labels (see the note "Label mixing")."""


@dataclass(frozen=True, kw_only=True)
class MixingReport:
    """How well a pack's chunks, and windows of them, mix labels (see "Label mixing").

    ``figure`` is single chunks' (``nan`` when ``exempt``: under two labels),
    ``window_figure`` windows of ``window_chunks``'; ``*_unmixed``: below ``threshold``
    beyond a shuffle's noise. ``window_needed``: the smallest window that mixes, within 1/8
    (None when exempt or not searched).
    """

    figure: float
    window_chunks: int
    window_figure: float
    stratified: bool
    threshold: float
    window_needed: int | None
    exempt: bool = False
    chunks_unmixed: bool = False
    window_unmixed: bool = False
    path: str | None = None

    @property
    def warns(self) -> bool:
        """Whether to warn: the chunks (and maybe the windows) do not mix labels."""
        return not self.exempt and (self.chunks_unmixed or self.window_unmixed)

    @property
    def message(self) -> str:
        """The warning's text: the figures, what the loader does and what to do."""
        where = f"{self.path}: " if self.path else ""
        head = (
            f"{where}the pack's chunks do not mix labels (label mixing {self.figure:.2f} per "
            "chunk, where a shuffled pack scores ~1), so a chunk-aware batch holds the classes "
            "of a few chunks only"
        )
        reconvert = "re-convert with the write-time shuffle (convert's default; no --no-shuffle)"
        order = " in an order stratified by label" if self.stratified else ""
        if not self.window_unmixed:
            return (
                f"{head}; the loader mixes them in windows of {self.window_chunks} chunks"
                f"{order} (label mixing {self.window_figure:.2f}), which costs "
                f"{self.window_chunks} decompressed chunks per worker and trains close to, "
                f"not as well as, a full shuffle. To train like a full shuffle with any "
                f"window, {reconvert}."
            )
        wider = (
            f"read with window_chunks >= {self.window_needed} (that many decompressed chunks "
            "per worker)"
            if self.window_needed is not None and self.window_needed > self.window_chunks
            else "read with a larger window"
        )
        return (
            f"{head}: windows of {self.window_chunks} chunks{order} score "
            f"{self.window_figure:.2f}, and below {self.threshold} training falls behind a "
            "full shuffle (by 10 points or more in scripts/bench_training.py). "
            f"{reconvert[0].upper()}{reconvert[1:]}, or {wider}."
        )


def label_mixing(
    source: PackMeta | np.ndarray,
    chunk_map: ChunkMap | None = None,
    *,
    window_chunks: int = 1,
    stratified: bool = False,
    threshold: float = MIXING_THRESHOLD,
    search: bool = True,
    seed: int = 0,
) -> MixingReport:
    """Measure how well a pack's chunks, and windows of K of them, mix its labels.

    Args:
        source: A pack's metadata, or its labels in pack order.
        chunk_map: The pack's chunks: required with labels.
        window_chunks: K, the sampler's window per worker.
        stratified: Measure windows of ``stratified_order``, not of a random chunk order.
        threshold: The figure below which windows do not mix.
        search: Look for ``window_needed`` when the windows do not mix.
        seed: Seed of the window draws and of the shuffled reference.

    Example:
        >>> labels = np.repeat(np.arange(4), 32)              # class-sorted, 4 classes
        >>> report = label_mixing(labels, ChunkMap.regular(128, 16), window_chunks=2)
        >>> round(report.figure, 2), report.warns, report.window_needed
        (0.0, True, 8)
    """
    path = None
    if isinstance(source, PackMeta):
        path = os.fspath(source.path)
        chunk_map = chunk_map if chunk_map is not None else chunk_map_of(source)
        labels = np.asarray(source.labels, dtype=np.int64)
    else:
        if chunk_map is None:
            raise OptionsError("label_mixing needs the chunk map when given labels")
        labels = np.asarray(source, dtype=np.int64).reshape(-1)
    if labels.size != chunk_map.num_samples:
        raise OptionsError(
            f"labels should have one entry per sample of the chunk map ({chunk_map.num_samples})"
            f", but got {labels.size}"
        )
    if window_chunks < 1:
        raise OptionsError(f"window_chunks should be >= 1, but got window_chunks={window_chunks}")
    if not 0 < threshold <= 1:
        raise OptionsError(f"threshold should be in (0, 1], but got threshold={threshold}")
    labelled = labels >= 0
    every = bool(labelled.all())
    present = labels if every else labels[labelled]
    report = partial(
        MixingReport,
        window_chunks=window_chunks,
        stratified=stratified,
        threshold=threshold,
        path=path,
    )
    if present.size == 0 or int(present.min()) == int(present.max()):  # fewer than 2 labels
        return report(figure=math.nan, window_figure=math.nan, window_needed=None, exempt=True)
    num_chunks = chunk_map.num_chunks
    # int32 where they fit, and no copy when every sample is labelled
    small = np.int32 if max(num_chunks, int(present.max()) + 1) < 2**31 else np.int64
    chunks = np.repeat(np.arange(num_chunks, dtype=small), chunk_map.sizes())
    values = labels.astype(small)
    if not every:
        chunks, values = chunks[labelled], values[labelled]
    del present
    strata = chunk_strata(labels, chunk_map) if stratified else None
    references: list[np.ndarray] = []

    def entropy_of(shuffle: int | None, window: int) -> float:
        if shuffle is None:
            mine = values
        else:
            while len(references) <= shuffle:  # the labels spread at random, made on demand
                references.append(
                    np.random.default_rng((seed, 1, len(references))).permutation(values)
                )
            mine = references[shuffle]
        return window_entropy(mine, chunks, num_chunks, window, strata=strata, seed=seed)

    def measure(window: int, *, check: bool = True) -> tuple[float, bool]:
        """Return the window's figure and whether it does not mix (``check``: beyond noise)."""
        observed, expected = entropy_of(None, window), entropy_of(0, window)
        figure = 1.0 if expected == 0.0 else observed / expected
        if figure >= threshold or not check:
            return figure, figure < threshold
        # below the threshold: is the deficit beyond what shuffles vary by? (four shuffles
        # settle an unmixed pack's deficit, half the entropy or more; else NULL_SHUFFLES)
        shuffles = [expected] + [entropy_of(r, window) for r in range(1, 4)]
        for count, margin in ((4, 2 * MIN_Z), (NULL_SHUFFLES, MIN_Z)):
            shuffles += [entropy_of(r, window) for r in range(len(shuffles), count)]
            clear = figure < 0.5 or count == NULL_SHUFFLES
            deficit = float(np.mean(shuffles)) - observed
            if clear and deficit > margin * float(np.std(shuffles, ddof=1)):
                return figure, True
        return figure, False

    figure, chunks_unmixed = measure(1)
    window_figure, window_unmixed = (
        (figure, chunks_unmixed) if window_chunks == 1 else measure(window_chunks)
    )

    def smallest_mixing(failed: int) -> int:
        """Double from a window that does not mix until one does, then bisect (figures only)."""
        needed = failed
        while needed < num_chunks:
            failed, needed = needed, min(2 * needed, num_chunks)
            if not measure(needed, check=False)[1]:
                break
        while needed - failed > max(1, needed // 8):
            middle = (failed + needed) // 2
            if measure(middle, check=False)[1]:
                failed = middle
            else:
                needed = middle
        return needed

    needed: int | None = window_chunks
    if window_unmixed:
        needed = smallest_mixing(window_chunks) if search else None
    return report(
        figure=figure,
        window_figure=window_figure,
        window_needed=needed,
        chunks_unmixed=chunks_unmixed,
        window_unmixed=window_unmixed,
    )


def chunk_strata(labels: np.ndarray, chunk_map: ChunkMap) -> np.ndarray:
    """Return each chunk's most frequent label (-1 for a chunk without labels)."""
    labels = np.asarray(labels, dtype=np.int64)
    num_chunks = chunk_map.num_chunks
    strata = np.full(num_chunks, -1, dtype=np.int64)
    labelled = labels >= 0
    if not labelled.any():
        return strata
    chunks = np.repeat(np.arange(num_chunks), chunk_map.sizes())[labelled]
    span = int(labels.max()) + 1
    keys, counts = np.unique(chunks * span + labels[labelled], return_counts=True)
    # per chunk, the key with the largest count (the smallest label among ties)
    best = np.lexsort((keys, -counts, keys // span))
    first = np.concatenate(([True], np.diff(keys[best] // span) != 0))
    winners = keys[best][first]
    strata[winners // span] = winners % span
    return strata


def stratified_order(rng: np.random.Generator, strata: np.ndarray) -> np.ndarray:
    """Return a random chunk order that spreads each stratum evenly over the epoch.

    The j-th of a stratum's n chunks (in random order) goes at a random point of the j-th
    n-th of the epoch (jittered systematic sampling); ``rng``: a permutation, then floats.

    Example:
        >>> strata = np.repeat([0, 1, 2], 4)
        >>> strata[stratified_order(np.random.default_rng(0), strata)].tolist()
        [0, 2, 1, 1, 2, 0, 2, 0, 1, 2, 0, 1]
    """
    num = len(strata)
    order = rng.permutation(num)
    _, stratum = np.unique(np.asarray(strata)[order], return_inverse=True)
    counts = np.bincount(stratum)
    by_stratum = np.argsort(stratum, kind="stable")
    rank = np.empty(num, dtype=np.int64)
    rank[by_stratum] = np.arange(num) - (np.cumsum(counts) - counts)[stratum[by_stratum]]
    position = (rank + rng.random(num)) / counts[stratum]
    return order[np.argsort(position, kind="stable")]


def window_entropy(
    labels: np.ndarray,
    chunks: np.ndarray,
    num_chunks: int,
    window_chunks: int,
    *,
    strata: np.ndarray | None = None,
    seed: int = 0,
) -> float:
    """Return the mean label entropy (bits) of windows of at most K consecutive chunks.

    ``labels`` (>= 0) and ``chunks`` are per sample measured; the chunk orders are seeded
    (random, or ``stratified_order`` of ``strata``), the same for any ``labels``.
    """
    span = int(labels.max()) + 1
    per_window = max(1.0, labels.size / max(1, num_chunks)) * window_chunks
    taken = max(1, math.ceil(MAX_SAMPLED / per_window))  # windows measured per draw
    num_windows = -(-num_chunks // window_chunks)
    windows_per_draw = min(taken, num_windows)
    # single chunks need one draw (of a random subset of them when there are many)
    draws = 1 if window_chunks == 1 else min(WINDOW_DRAWS, -(-MIN_WINDOWS // windows_per_draw))
    total = 0.0
    for draw in range(draws):
        rng = np.random.default_rng((seed, 2, draw))
        order = rng.permutation(num_chunks) if strata is None else stratified_order(rng, strata)
        position = np.empty(num_chunks, dtype=np.int64)
        position[order] = np.arange(num_chunks)
        # as the sampler cuts them: the fewest windows of <= K chunks, of even sizes
        windows = position[chunks]
        windows *= num_windows
        windows //= num_chunks
        kept = windows < taken
        if kept.all():
            total += mean_entropy(windows, labels, span)
        else:
            total += mean_entropy(windows[kept], labels[kept], span)
    return total / draws


def mean_entropy(groups: np.ndarray, labels: np.ndarray, span: int) -> float:
    """Return the sample-weighted mean Shannon entropy (bits) of each group's labels."""
    keys = groups.astype(np.int64) * span + labels
    if keys.size and int(keys.max()) < max(8 * keys.size, 2**20):
        # few distinct keys possible: count them without sorting (decisions/0025)
        every = np.bincount(keys)
        keys = np.flatnonzero(every)
        counts = every[keys]
    else:
        if keys.size and int(keys.max()) < 2**31:
            keys = keys.astype(np.int32)  # sorts faster
        keys, counts = np.unique(keys, return_counts=True)
    group = keys // span
    totals = np.bincount(group, weights=counts)
    share = counts / totals[group]
    entropy = -np.bincount(group, weights=share * np.log2(share))  # per group
    return float(np.sum(entropy * totals) / np.sum(totals))


def jump_entropy(order: Sequence[int] | np.ndarray) -> float:
    """Return the entropy (bits) of the jumps between consecutive indices: MosaicML's measure.

    A sequential order scores 0, a random permutation of N close to ``log2(N - 1)``: how
    random an order looks to SGD, next to throughput.

    Example:
        >>> round(jump_entropy([0, 2, 1, 3]), 3)   # jumps 2, 1, 2
        0.918
    """
    values = np.asarray(order, dtype=np.int64).reshape(-1)
    if values.size < 2:
        return 0.0
    counts = np.bincount(np.abs(np.diff(values)))
    probabilities = counts[counts > 0] / (values.size - 1)
    return float(-np.sum(probabilities * np.log2(probabilities)) + 0.0)
