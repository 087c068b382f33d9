"""Orders: what one epoch is made of, and in which order its pieces come; one class per kind."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training.mixing import stratified_order

if TYPE_CHECKING:
    from h5pack.training.weighted import WeightedMix

# NOTE [ Orders ]
#
# An epoch is a sequence of ``num_samples`` positions (all samples once for the chunk
# orders, ``epoch_samples`` for a weighted mix). An order cuts it into pieces in a canonical
# order (piece p: positions ``starts[p] ..``, samples ``sample_starts[p] ..`` of one chunk)
# and says in which order they are served (``EpochPieces.order``); ``plan_epoch`` cuts that
# for ranks, workers and windows the same way for every order. Elastic resume works on
# positions: the rest of each piece is a sub-piece (``rest_of``), served as
# ``Order.arrange`` says (chunk orders apply themselves again; a mix keeps its order).


@dataclass(frozen=True, eq=False)
class EpochPieces:
    """One epoch of an order: pieces of its positions, and the order they are served in.

    Attributes:
        sizes: Positions of each piece, canonical order (pieces laid end to end).
        order: The serving order: a permutation of the pieces.
        shuffle: Whether windows of pieces are shuffled.
        sample_starts: First sample of each piece (consecutive samples); None: positions
            are sample indices.
        sources: The source of each piece (a weighted mix), or None.
        parent: For the rest of an epoch (``rest_of``), the whole epoch it is part of;
            ``top``: the parent's position of each of its positions.
    """

    sizes: np.ndarray
    order: np.ndarray
    shuffle: bool = True
    sample_starts: np.ndarray | None = None
    sources: np.ndarray | None = None
    parent: EpochPieces | None = None
    top: np.ndarray | None = None

    @property
    def num_samples(self) -> int:
        """Positions of the epoch (samples served, before ranks pad or drop)."""
        return int(self.sizes.sum())

    @cached_property
    def starts(self) -> np.ndarray:
        """First position of each piece (canonical order)."""
        starts: np.ndarray = np.cumsum(self.sizes) - self.sizes
        return starts

    def top_positions(self, positions: np.ndarray) -> np.ndarray:
        """Return the whole epoch's positions of ``positions`` (themselves at top level)."""
        if self.top is None:
            return positions
        top: np.ndarray = self.top[positions]
        return top

    def samples(self, positions: np.ndarray) -> np.ndarray:
        """Return the sample index at each of ``positions``."""
        if self.parent is not None:
            return self.parent.samples(self.top_positions(positions))
        if self.sample_starts is None:
            return positions
        piece = np.searchsorted(self.starts, positions, side="right") - 1
        samples: np.ndarray = self.sample_starts[piece] + positions - self.starts[piece]
        return samples.astype(np.int64)

    def sources_of(self, positions: np.ndarray) -> np.ndarray | None:
        """Return the source of each of ``positions``, or None for an order of one source."""
        if self.parent is not None:
            return self.parent.sources_of(self.top_positions(positions))
        if self.sources is None:
            return None
        piece = np.searchsorted(self.starts, positions, side="right") - 1
        return self.sources[piece]


# An epoch order (NOTE [ Orders ]): ``name`` is recorded in a sampler's state; ``epoch`` gives an
# epoch's pieces and their serving order (pure); ``arrange`` the serving order of sub-pieces of
# ``whole``'s pieces ``parents`` (a rest); ``settings`` what fixes it beyond the seed.
Order: TypeAlias = "ChunkOrder | WeightedMix"


def seeded_rng(*key: int) -> np.random.Generator:
    """Return the generator of ``key`` (each int taken mod 2**64)."""
    return np.random.default_rng([k % 2**64 for k in key])


@dataclass(frozen=True, eq=False)
class ChunkOrder:
    """Every chunk once per epoch: in pack order, permuted, or permuted by stratum.

    ``shuffle=False``: pack order, windows not shuffled; else ``default_rng((seed, epoch))``
    permutes the chunks, spreading each stratum (``mixing.chunk_strata``) evenly if given.
    """

    chunk_map: ChunkMap
    shuffle: bool = True
    strata: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.strata is not None and len(self.strata) != self.chunk_map.num_chunks:
            raise OptionsError(
                f"chunk_strata should have one entry per chunk ({self.chunk_map.num_chunks}), "
                f"but got {len(self.strata)}"
            )

    @property
    def name(self) -> str:
        """The kind of order: "sequential", "permutation" or "stratified"."""
        if not self.shuffle:
            return "sequential"
        return "permutation" if self.strata is None else "stratified"

    @property
    def num_samples(self) -> int:
        """All the pack's samples."""
        return self.chunk_map.num_samples

    def epoch(self, seed: int, epoch: int) -> EpochPieces:
        """Return the pack's chunks in this order."""
        parents = np.arange(self.chunk_map.num_chunks)
        order = self.arrange(seed, epoch, parents, None)
        return EpochPieces(self.chunk_map.sizes(), order, shuffle=self.shuffle)

    def arrange(
        self, seed: int, epoch: int, parents: np.ndarray, whole: EpochPieces | None
    ) -> np.ndarray:
        """Return the pieces in this order, each taking its chunk's stratum."""
        if not self.shuffle:
            return np.arange(len(parents))
        if self.strata is None:
            return seeded_rng(seed, epoch).permutation(len(parents))
        return stratified_order(seeded_rng(seed, epoch), self.strata[parents])

    def settings(self) -> dict[str, Any]:
        """Nothing beyond the seed (a stratified order records only that it was used)."""
        return {}


def chunk_order(
    chunk_map: ChunkMap, *, shuffle: bool = True, chunk_strata: tuple[int, ...] | None = None
) -> ChunkOrder:
    """Return the order of one pool of chunks that ``shuffle`` and strata ask."""
    strata = None if chunk_strata is None or not shuffle else np.asarray(chunk_strata, np.int64)
    return ChunkOrder(chunk_map, shuffle, strata)


def rest_of(order: Order, seed: int, epoch: int, delivered: np.ndarray) -> EpochPieces:
    """Return the pieces of ``epoch``'s positions not yet ``delivered``: a sub-piece of each."""
    whole = order.epoch(seed, epoch)
    remaining = np.flatnonzero(~np.asarray(delivered, dtype=bool))
    if remaining.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return EpochPieces(empty, empty, whole.shuffle, parent=whole, top=remaining)
    ends = np.cumsum(whole.sizes)
    parents = np.searchsorted(ends, remaining, side="right")
    cuts = np.flatnonzero(np.diff(parents)) + 1
    first = np.concatenate([[0], cuts]).astype(np.int64)
    sizes = np.diff(np.concatenate([first, [remaining.size]])).astype(np.int64)
    arranged = order.arrange(seed, epoch, parents[first], whole)
    return EpochPieces(sizes, arranged, whole.shuffle, parent=whole, top=remaining)
