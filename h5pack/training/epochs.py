"""How a rank's epoch is planned: ``EpochSpec``, the window, ``plan_epoch``. Pure, no torch."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from h5pack.core.arguments import check_bool, check_int, check_optional_int, check_seed
from h5pack.core.layout import ChunkMap
from h5pack.core.machine import memory_bytes
from h5pack.errors import OptionsError
from h5pack.training.orders import EpochPieces, Order, chunk_order, seeded_rng
from h5pack.training.weighted import check_weights

# NOTE [ Chunk-aware epoch order ]
#
# ``plan_epoch`` plans one rank's epoch as a pure function of (seed, epoch, rank, ...):
# 1. The order's pieces (chunks, permuted by ``(seed, epoch)``) laid end to end.
# 2. Ranks take consecutive slices (``r * N // R`` on), so they split chunks, not samples.
# 3. Batch b goes to worker b mod W; the rank's slice is cut into W consecutive slices, one
#    per worker, so each worker reads its own chunks (boundary chunks by two).
# 4. Each worker's slice is cut into the fewest windows of at most K pieces, of even sizes;
#    a window's samples are shuffled together and cut into batches, so a reader keeping
#    its last K chunks (first in, first out) decompresses each chunk once per epoch.
# Ranks: ``drop_last=False`` gives every rank ceil(N / R) samples, a short rank repeating
# the last sample of its slice (the first of the next one when it has none), as
# ``DistributedSampler`` does; ``drop_last=True`` gives every rank N // R // B full batches
# and skips the tail of the epoch's order.

# NOTE [ Shuffle window ]
#
# K, the chunks one worker mixes at once (and its reader keeps decompressed), is
# ``window_chunks`` when given, else the largest of three floors: ``window_bytes`` (default
# ``DEFAULT_WINDOW_BYTES``) shared by the workers; ``MIN_POOL_BATCHES`` batches per
# window; ``min_window_chunks`` (packs whose chunks do not mix labels); capped, unless
# ``window_bytes`` is given, by ``WINDOW_MEMORY_FRACTION`` of the machine's memory (not
# what is free now: K, and with it the order, is then the same in every process and in a
# resumed run) and at the pack's chunks. Measurements: docs/decisions/0022.

DEFAULT_WINDOW_BYTES = 256 * 2**20  # the bytes floor of all workers' windows together
MIN_POOL_BATCHES = 8  # the pool floor: batches a worker's window holds at least
WINDOW_MEMORY_FRACTION = 1 / 8  # the cap: the machine's memory all windows hold at most
DEFAULT_WINDOW_CHUNKS = 16  # the window when the chunk size is unknown, before the pool floor


def distributed_defaults(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Return ``(num_replicas, rank)``, filling gaps from torch.distributed when initialised."""
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if initialised else 1
        if rank is None:
            rank = dist.get_rank() if initialised else 0
    if not 0 <= rank < num_replicas:
        raise OptionsError(
            f"rank should be in 0..{num_replicas - 1}, but got rank={rank} "
            f"(num_replicas={num_replicas})"
        )
    return num_replicas, rank


def window_for(
    *,
    window_chunks: int | None = None,
    window_bytes: int | None = None,
    group_bytes: int | None = None,
    num_workers: int = 0,
    batch_size: int | None = None,
    chunk_samples: float | None = None,
    min_window_chunks: int | None = None,
    num_chunks: int | None = None,
    machine_bytes: int | None = None,
) -> int:
    """Return K, the chunks per shuffle window of one worker (NOTE [ Shuffle window ]).

    ``group_bytes`` is one decompressed chunk's bytes (None: unknown, so
    ``DEFAULT_WINDOW_CHUNKS`` and no cap); ``chunk_samples`` its mean samples, for the pool
    floor; ``machine_bytes`` defaults to ``memory_bytes()``.
    """
    if window_chunks is not None:
        return int(window_chunks)
    processes = max(1, num_workers)
    if group_bytes:
        floor = (window_bytes or DEFAULT_WINDOW_BYTES) // (processes * group_bytes)
    else:
        floor = DEFAULT_WINDOW_CHUNKS
    if batch_size and chunk_samples:
        floor = max(floor, math.ceil(MIN_POOL_BATCHES * batch_size / chunk_samples))
    floor = max(1, floor, min_window_chunks or 1)
    if group_bytes:
        cap: int | None = window_bytes
        if cap is None:
            machine = machine_bytes if machine_bytes is not None else memory_bytes()
            cap = int(machine * WINDOW_MEMORY_FRACTION) if machine else None
        if cap is not None:
            floor = min(floor, max(1, cap // (processes * group_bytes)))
    if num_chunks is not None:
        floor = min(floor, max(1, num_chunks))
    return int(floor)


@dataclass(frozen=True, kw_only=True)
class EpochSpec:
    """How a rank's epochs are cut into batches: everything ``plan_epoch`` needs but the epoch.

    Built once at the public edge and passed whole; ``resolved`` fills the fields left to
    defaults (ranks from ``torch.distributed``, the window by NOTE [ Shuffle window ]).

    Attributes:
        shuffle: Shuffle chunks and windows; ``False``: each worker a contiguous range in
            pack order.
        seed: Seed of the order, a pure function of ``(seed, epoch)``.
        window_chunks: K, chunks mixed at once by one worker (and kept decompressed).
        window_bytes: Memory budget of all workers' windows (decompressed bytes).
        drop_last: Drop the incomplete last batch (and the tail ranks do not divide).
        num_replicas: Ranks, and ``rank`` this one; None: ``torch.distributed``'s, else 1, 0.
        num_workers: The DataLoader's ``num_workers`` (batch b goes to worker b mod W).
        min_window_chunks: Widen a default window to at least this many chunks.
        chunk_strata: One stratum (dominant label) per chunk, spread evenly over the epoch
            (``mixing.stratified_order``); None: a uniformly random chunk order.
        weights: Mix several sources by weight (``training.weighted``), one per source.
        epoch_samples: Samples per epoch of a mix; None: all samples of all sources.
    """

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    window_chunks: int | None = None
    window_bytes: int | None = None
    drop_last: bool = False
    num_replicas: int | None = None
    rank: int | None = None
    num_workers: int = 0
    min_window_chunks: int | None = None
    chunk_strata: tuple[int, ...] | None = None
    weights: tuple[float, ...] | None = None
    epoch_samples: int | None = None

    def __post_init__(self) -> None:
        check_int("batch_size", self.batch_size, minimum=1)
        check_bool("shuffle", self.shuffle)
        check_seed("seed", self.seed)
        check_bool("drop_last", self.drop_last)
        check_int("num_workers", self.num_workers, minimum=0)
        check_optional_int("window_chunks", self.window_chunks, minimum=1)
        check_optional_int("window_bytes", self.window_bytes, minimum=1)
        check_optional_int("min_window_chunks", self.min_window_chunks, minimum=1)
        check_optional_int("num_replicas", self.num_replicas, minimum=1)
        check_optional_int("rank", self.rank, minimum=0)
        if self.weights is not None:
            object.__setattr__(self, "weights", check_weights(self.weights))
        check_optional_int("epoch_samples", self.epoch_samples, minimum=1)
        if self.chunk_strata is not None and not isinstance(self.chunk_strata, tuple):
            strata = tuple(int(c) for c in self.chunk_strata)
            object.__setattr__(self, "chunk_strata", strata)
        if self.num_replicas is not None and self.rank is not None:
            distributed_defaults(self.num_replicas, self.rank)

    def resolved(self, group_bytes: int | None, *, chunk_map: ChunkMap | None = None) -> EpochSpec:
        """Return a copy with ranks and the window filled in (``group_bytes``: one chunk's)."""
        num_replicas, rank = distributed_defaults(self.num_replicas, self.rank)
        chunk_samples = num_chunks = None
        if chunk_map is not None and chunk_map.num_chunks:
            num_chunks = chunk_map.num_chunks
            chunk_samples = chunk_map.num_samples / num_chunks
        window = window_for(
            window_chunks=self.window_chunks,
            window_bytes=self.window_bytes,
            group_bytes=group_bytes,
            num_workers=self.num_workers,
            batch_size=self.batch_size,
            chunk_samples=chunk_samples,
            min_window_chunks=self.min_window_chunks,
            num_chunks=num_chunks,
        )
        return replace(self, num_replicas=num_replicas, rank=rank, window_chunks=window)


def epoch_spec(spec: EpochSpec | int | None = None, /, **fields: Any) -> EpochSpec:
    """Return the ``EpochSpec`` of ``spec`` (a spec, or a batch size) with ``fields`` replaced.

    Example:
        >>> epoch_spec(32, seed=3) == EpochSpec(batch_size=32, seed=3)
        True
    """
    if isinstance(spec, EpochSpec):
        return replace(spec, **fields) if fields else spec
    if spec is not None:
        if "batch_size" in fields:
            raise OptionsError("give batch_size once, positionally or as batch_size=")
        fields["batch_size"] = spec
    if "batch_size" not in fields:
        raise OptionsError("batch_size should be an integer >= 1, but none was given")
    return EpochSpec(**fields)


def num_batches(
    num_samples: int, batch_size: int, *, num_replicas: int = 1, drop_last: bool = False
) -> int:
    """Return the batches each rank yields per epoch."""
    if num_samples == 0:
        return 0
    if drop_last:
        return num_samples // num_replicas // batch_size
    return math.ceil(math.ceil(num_samples / num_replicas) / batch_size)


def samples_per_rank(num_samples: int, spec: EpochSpec) -> int:
    """Return the samples each rank yields per epoch (NOTE [ Chunk-aware epoch order ])."""
    if num_samples == 0:
        return 0
    num_replicas = spec.num_replicas or 1
    if spec.drop_last:
        return num_samples // num_replicas // spec.batch_size * spec.batch_size
    return math.ceil(num_samples / num_replicas)


def plan_epoch(source: ChunkMap | Order, spec: EpochSpec, epoch: int) -> list[np.ndarray]:
    """Return one rank's batches of one epoch, in the order the DataLoader consumes them.

    A pure function of (order, seed, epoch, topology): NOTE [ Chunk-aware epoch order ]. A
    bare ``ChunkMap`` takes the chunk order ``spec.shuffle`` and ``spec.chunk_strata`` ask.

    Example:
        >>> cmap = ChunkMap.regular(10, 4)
        >>> [b.tolist() for b in plan_epoch(cmap, EpochSpec(batch_size=3, shuffle=False), epoch=0)]
        [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    """
    if isinstance(source, ChunkMap):
        source = chunk_order(source, shuffle=spec.shuffle, chunk_strata=spec.chunk_strata)
    pieces = source.epoch(spec.seed, epoch)
    return samples_of_batches(pieces, plan_pieces(pieces, spec, epoch=epoch))


def samples_of_batches(pieces: EpochPieces, batches: list[np.ndarray]) -> list[np.ndarray]:
    """Return the sample indices of batches of ``pieces``' positions (one lookup for all)."""
    if not batches:
        return []
    flat = pieces.samples(np.concatenate(batches))
    return np.split(flat, np.cumsum([len(b) for b in batches])[:-1])


def _window_shuffle(
    seq: np.ndarray, chunks: np.ndarray, window_chunks: int, rng: np.random.Generator
) -> np.ndarray:
    """Shuffle ``seq`` within the fewest windows of at most K consecutive pieces, even sizes."""
    piece = np.concatenate([[0], np.cumsum(np.diff(chunks) != 0)])
    num_pieces = int(piece[-1]) + 1
    windows = -(-num_pieces // window_chunks)
    keys = rng.random(len(seq))
    shuffled: np.ndarray = seq[np.lexsort((keys, piece * windows // num_pieces))]
    return shuffled


def _balanced_layout(
    pieces: EpochPieces,
) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """Return ``segment`` of a mix's epoch: the j-th of a source's n at (j + 1/2) / n of it."""
    starts, sizes, order = pieces.starts, pieces.sizes, pieces.order
    piece_sources = pieces.sources_of(starts)
    assert piece_sources is not None  # the caller checked
    num = pieces.num_samples
    labels = np.repeat(piece_sources[order], sizes[order])
    rank = np.empty(num, dtype=np.int64)
    counts = np.bincount(labels)
    by_source = np.argsort(labels, kind="stable")
    rank[by_source] = np.arange(num) - (np.cumsum(counts) - counts)[labels[by_source]]
    balanced = by_source[np.argsort(((rank + 0.5) / counts[labels])[by_source], kind="stable")]
    served = np.repeat(starts[order], sizes[order]) + (
        np.arange(num) - np.repeat(np.cumsum(sizes[order]) - sizes[order], sizes[order])
    )
    seq, chunk_seq = served[balanced], np.repeat(order, sizes[order])[balanced]

    def segment(low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
        return seq[low:high], chunk_seq[low:high]

    return segment


def plan_pieces(pieces: EpochPieces, spec: EpochSpec, *, epoch: int) -> list[np.ndarray]:
    """Return one rank's batches of one epoch as positions of ``pieces`` (``plan_epoch``)."""
    batch_size, seed, drop_last = spec.batch_size, spec.seed, spec.drop_last
    shuffle, window_chunks = pieces.shuffle, spec.window_chunks or DEFAULT_WINDOW_CHUNKS
    num_replicas, rank = spec.num_replicas or 1, spec.rank or 0
    num = pieces.num_samples
    batch_count = num_batches(num, batch_size, num_replicas=num_replicas, drop_last=drop_last)
    if batch_count == 0:
        return []
    starts, sizes, order = pieces.starts, pieces.sizes, pieces.order
    ordered_sizes = sizes[order]
    ends = np.cumsum(ordered_sizes)
    first_pos = ends - ordered_sizes

    def laid_out(low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions ``low .. high - 1`` and their pieces: O(N / R + chunks), not O(N)."""
        if high <= low:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        first = int(np.searchsorted(ends, low, side="right"))
        last = int(np.searchsorted(first_pos, high, side="left"))
        part, part_sizes = order[first:last], ordered_sizes[first:last]
        origin = int(first_pos[first])
        seq = np.repeat(starts[part] - first_pos[first:last], part_sizes) + np.arange(
            origin, origin + int(part_sizes.sum()), dtype=np.int64
        )
        chunk_seq = np.repeat(part, part_sizes)
        return seq[low - origin : high - origin], chunk_seq[low - origin : high - origin]

    mix = pieces.sources_of(starts[:1]) is not None
    segment = _balanced_layout(pieces) if mix else laid_out

    if drop_last:
        per_rank = batch_count * batch_size
        low = rank * per_rank
        rank_seq, rank_chunks = segment(low, low + per_rank)
    else:
        per_rank = math.ceil(num / num_replicas)
        low, high = rank * num // num_replicas, (rank + 1) * num // num_replicas
        rank_seq, rank_chunks = segment(low, high)
        pad = per_rank - (high - low)
        if pad:
            # Repeat the last sample of the rank's own slice (or the next one if it is empty).
            where = high - 1 if high > low else low % num
            one_seq, one_chunk = segment(where, where + 1)
            rank_seq = np.concatenate([rank_seq, np.full(pad, one_seq[0])])
            rank_chunks = np.concatenate([rank_chunks, np.full(pad, one_chunk[0])])

    batch_sizes = np.full(batch_count, batch_size, dtype=np.int64)
    batch_sizes[-1] = per_rank - (batch_count - 1) * batch_size
    workers = max(1, spec.num_workers)
    worker_rngs = [seeded_rng(seed, epoch, rank, w, 1) for w in range(workers)]
    streams: list[list[np.ndarray]] = []
    low = 0
    for w in range(workers):
        own_sizes = batch_sizes[w::workers]
        high = low + int(own_sizes.sum())
        wseq, wchunks = rank_seq[low:high], rank_chunks[low:high]
        low = high
        sources = pieces.sources_of(wseq) if mix and len(wseq) else None
        if sources is not None and shuffle:
            # a mix: each source shuffled in its own windows, back into its slots
            mixed = wseq.copy()
            for source in np.unique(sources).tolist():
                slots = np.flatnonzero(sources == source)
                mixed[slots] = _window_shuffle(
                    wseq[slots], wchunks[slots], window_chunks, worker_rngs[w]
                )
            wseq = mixed
        elif shuffle and len(wseq):
            wseq = _window_shuffle(wseq, wchunks, window_chunks, worker_rngs[w])
        streams.append(np.split(wseq, np.cumsum(own_sizes)[:-1]))
    batches = [streams[b % workers][b // workers] for b in range(batch_count)]
    if mix:
        # a mix: each batch grouped by source, so each source's run is read straight into
        # its slice of the batch (a batch is a set to SGD)
        flat = np.concatenate(batches)
        sources = pieces.sources_of(flat)
        assert sources is not None  # checked above
        lengths = [len(b) for b in batches]
        ids = np.repeat(np.arange(len(batches)), lengths)
        batches = np.split(flat[np.lexsort((sources, ids))], np.cumsum(lengths)[:-1])
    return batches
