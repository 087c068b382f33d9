"""The weighted mix: several sources in one epoch, each exactly its share (issue 18).

``WeightedMix`` is an order (NOTE [ Orders ], training/orders.py): which samples of each
source an epoch holds; ``plan_epoch`` cuts it for ranks, workers and windows like any order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training.orders import EpochPieces, seeded_rng

# NOTE [ Weighted mix ]
#
# An epoch of E samples holds n_s = the largest-remainder rounding of E w_s / sum(w) samples
# of source s (``shares``). n_s = q N_s + r: q whole passes, each a fresh chunk-aware
# permutation seeded by (seed, source, epoch, pass); and a part pass of r samples from a
# cycle of ceil(N_s / r) epochs sharing one permutation, so successive epochs cover the
# whole source. A piece is a chunk, or the part of one a cut falls in. ``plan_pieces`` lays
# the sources out balanced (decision 0090: the j-th of a source's n samples at (j + 1/2) / n
# of the epoch), so every rank's, worker's and batch's samples hold the shares to within one
# sample; each worker shuffles each source in its own windows of K pieces. All of it is a
# pure function of (seed, epoch) and the sizes: a resumed or elastic epoch replays exactly.

# Mixed into every seed of the mix, so that its permutations are not the chunk order's.
_KEY = 0x6D6978


def shares(weights: Sequence[float], epoch_samples: int) -> np.ndarray:
    """Return ``epoch_samples`` split by ``weights``, by largest remainder (ties: earlier first).

    Example:
        >>> shares([3, 1], 10).tolist(), shares([1, 1, 1], 10).tolist()
        ([8, 2], [4, 3, 3])
    """
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * epoch_samples
    counts: np.ndarray = np.floor(exact).astype(np.int64)
    short = int(epoch_samples - counts.sum())
    if short > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


def check_weights(weights: Sequence[float], num_sources: int | None = None) -> tuple[float, ...]:
    """Return ``weights`` as floats, refusing what is not one positive finite weight a source."""
    values = tuple(float(w) for w in weights)
    if not values or any(not math.isfinite(w) or w <= 0 for w in values):
        raise OptionsError(f"weights should be positive numbers, but got weights={list(weights)}")
    if num_sources is not None and len(values) != num_sources:
        raise OptionsError(
            f"weights should have one weight per source ({num_sources}), but got "
            f"{len(values)} weights"
        )
    return values


@dataclass(frozen=True)
class SourcePosition:
    """Where one source stands in one epoch (``part``: samples of its part pass, 0: none).

    The part pass belongs to a cycle of ``cycle_epochs`` epochs, which cover the source.
    """

    samples: int
    passes: int
    part: int
    cycle: int
    epoch_in_cycle: int
    cycle_epochs: int


@dataclass(frozen=True, eq=False)
class WeightedMix:
    """Several sources in every epoch, each exactly its share (see the note "Weighted mix").

    Source s's local index i is global index ``offsets[s] + i``; ``epoch_samples`` None:
    all samples of all sources.

    Example:
        >>> mix = WeightedMix((ChunkMap.regular(40, 8), ChunkMap.regular(5, 5)), (3.0, 1.0))
        >>> mix.num_samples, mix.takes.tolist()
        (45, [34, 11])
        >>> pieces = mix.epoch(seed=0, epoch=0)
        >>> np.bincount(pieces.sources_of(np.arange(45))).tolist()
        [34, 11]
    """

    chunk_maps: tuple[ChunkMap, ...]
    weights: tuple[float, ...]
    epoch_samples: int | None = None
    shuffle: bool = True
    name = "weighted"

    def __post_init__(self) -> None:
        check_weights(self.weights, len(self.chunk_maps))
        empty = [s for s, cmap in enumerate(self.chunk_maps) if cmap.num_samples == 0]
        if empty:
            raise OptionsError(
                f"a mixed source should hold samples, but source {empty[0]} has none"
            )
        if self.epoch_samples is not None and self.epoch_samples < 1:
            raise OptionsError(
                f"epoch_samples should be >= 1, but got epoch_samples={self.epoch_samples}"
            )

    @property
    def sizes(self) -> np.ndarray:
        """Samples of each source."""
        return np.asarray([cmap.num_samples for cmap in self.chunk_maps], dtype=np.int64)

    @property
    def offsets(self) -> np.ndarray:
        """Global index of each source's first sample, and the total."""
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    @property
    def num_samples(self) -> int:
        """Samples per epoch."""
        return int(self.sizes.sum()) if self.epoch_samples is None else int(self.epoch_samples)

    @property
    def takes(self) -> np.ndarray:
        """Samples of each source per epoch (``shares``)."""
        return shares(self.weights, self.num_samples)

    def positions(self, epoch: int) -> list[SourcePosition]:
        """Return where each source stands in ``epoch``."""
        out = []
        for size, take in zip(self.sizes.tolist(), self.takes.tolist(), strict=True):
            passes, part = divmod(take, size)
            cycle_epochs = -(-size // part) if part else 1
            cycle, at = divmod(epoch, cycle_epochs)
            out.append(SourcePosition(take, passes, part, cycle, at, cycle_epochs))
        return out

    def _chunks(self, seed: int, source: int, *key: int) -> np.ndarray:
        count = self.chunk_maps[source].num_chunks
        if not self.shuffle:
            return np.arange(count)
        return seeded_rng(seed, _KEY, source, *key).permutation(count)

    def _stream(
        self, order: np.ndarray, cmap: ChunkMap, low: int, high: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pieces (first sample, size) of samples ``low .. high - 1`` of chunks in ``order``."""
        sizes = cmap.sizes()[order]
        ends = np.cumsum(sizes)
        begins = ends - sizes
        keep = (ends > low) & (begins < high)
        begins, ends, chosen = begins[keep], ends[keep], order[keep]
        cut_low = np.maximum(begins, low) - begins
        cut_high = np.minimum(ends, high) - begins
        return cmap.starts[chosen] + cut_low, cut_high - cut_low

    def source_pieces(self, seed: int, epoch: int, source: int) -> tuple[np.ndarray, np.ndarray]:
        """Return one source's pieces of ``epoch`` in stream order: (first local sample, size)."""
        cmap = self.chunk_maps[source]
        size = cmap.num_samples
        where = self.positions(epoch)[source]
        pieces = [
            self._stream(self._chunks(seed, source, 1, epoch, one), cmap, 0, size)
            for one in range(where.passes)
        ]
        if where.part:
            order = self._chunks(seed, source, 2, where.cycle)
            low = where.epoch_in_cycle * where.part  # where in the cycle's stream it starts
            high = min(low + where.part, size)
            for a, b in ((low, high), (0, where.part - (high - low))):
                if b > a:
                    pieces.append(self._stream(order, cmap, a, b))
        return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])

    def epoch(self, seed: int, epoch: int) -> EpochPieces:
        """Return the epoch's pieces, source by source (``plan_pieces`` interleaves them)."""
        offsets = self.offsets
        starts, sizes, sources = [], [], []
        for source, take in enumerate(self.takes.tolist()):
            if take == 0:
                continue
            local, size = self.source_pieces(seed, epoch, source)
            starts.append(local + offsets[source])
            sizes.append(size)
            sources.append(np.full(len(size), source, dtype=np.int64))
        sizes_all = np.concatenate(sizes).astype(np.int64)
        return EpochPieces(
            sizes_all,
            np.arange(len(sizes_all)),
            shuffle=self.shuffle,
            sample_starts=np.concatenate(starts).astype(np.int64),
            sources=np.concatenate(sources),
        )

    def arrange(self, seed: int, epoch: int, parents: np.ndarray, whole: EpochPieces) -> np.ndarray:
        """Return the sub-pieces in the served order of the pieces they come from."""
        served = np.empty(len(whole.order), dtype=np.int64)
        served[whole.order] = np.arange(len(whole.order))
        return np.argsort(served[parents], kind="stable")

    def settings(self) -> dict[str, Any]:
        """The weights, the epoch's length, the layout and the sources' sizes."""
        return {
            "weights": list(self.weights),
            "epoch_samples": self.num_samples,
            "layout": "balanced",  # states of the older jittered layout are another order
            "sizes": self.sizes.tolist(),
        }


@dataclass(frozen=True)
class SourceShare:
    """What one epoch of a mix takes of one source (``h5pack info`` and ``bench`` show it).

    ``passes``: ``per_epoch / samples``; ``coverage``: the part of it one epoch serves.
    """

    name: str
    samples: int
    per_epoch: int
    share: float
    passes: float
    coverage: float
    epochs_to_cover: int

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as JSON-ready values."""
        return asdict(self)


def source_shares(mix: WeightedMix, names: Sequence[str]) -> list[SourceShare]:
    """Return what each epoch of ``mix`` takes of each source.

    Example:
        >>> mix = WeightedMix((ChunkMap.regular(900, 9), ChunkMap.regular(30, 3)), (3.0, 1.0))
        >>> [(s.per_epoch, round(s.passes, 2), s.epochs_to_cover) for s in
        ...  source_shares(mix, ["a", "b"])]
        [(698, 0.78, 2), (232, 7.73, 1)]
    """
    out = []
    for name, size, where in zip(names, mix.sizes.tolist(), mix.positions(0), strict=True):
        per_epoch, passes = where.samples, where.samples / size
        cover = 1 if where.passes else where.cycle_epochs
        share = per_epoch / mix.num_samples
        out.append(SourceShare(name, size, per_epoch, share, passes, min(1.0, passes), cover))
    return out
