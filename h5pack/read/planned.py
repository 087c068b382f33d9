"""A pack's byte source with the worker's plan: read-ahead and the disk cache.

``PlannedSource`` serves a range that is exactly one of the pack's chunks through the
``ReadAhead`` (NOTE [ Planned read-ahead ]) and the ``DiskCache`` (NOTE [ One disk cache per
machine ]), any other range from the source. The plan (``ReadPlan``, built by
``training.mapstyle.read_plan``) is in sample indices, so that a pack set's reader splits it
by shard.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap
from h5pack.core.source import ByteSource, SourceIdentity
from h5pack.errors import FormatError
from h5pack.read.diskcache import DiskCache, DiskCacheOptions, pack_key
from h5pack.read.eviction import Future
from h5pack.read.readahead import ReadAhead, ReadAheadOptions


@dataclass(frozen=True)
class ReadPlan:
    """Which samples one process reads next, and when its rank uses which.

    ``samples`` at ``times`` (epochs) are this process's; ``future_*`` every sample its rank reads
    this epoch and the next (for the disk cache's eviction).
    """

    samples: np.ndarray
    times: np.ndarray
    future_samples: np.ndarray
    future_times: np.ndarray

    def restricted(self, low: int, high: int) -> ReadPlan:
        """Return the plan of the samples ``low .. high - 1``, renumbered from 0."""
        mine = (self.samples >= low) & (self.samples < high)
        later = (self.future_samples >= low) & (self.future_samples < high)
        return ReadPlan(
            self.samples[mine] - low,
            self.times[mine],
            self.future_samples[later] - low,
            self.future_times[later],
        )


def chunk_stream(chunks: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the chunks of a sequence of uses in order of first use, with those times."""
    chunks = np.asarray(chunks, dtype=np.int64)
    times = np.asarray(times, dtype=np.float64)
    if not len(chunks):
        return chunks, times
    epochs = np.floor(times).astype(np.int64)
    keys = epochs * (int(chunks.max()) + 1) + chunks
    _, first = np.unique(keys, return_index=True)
    first.sort()
    return chunks[first], times[first]


def group_spans(
    chunk_map: ChunkMap, meta: PackMeta, sample_bytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return each group's ``[begin, end)`` bytes in the images' data."""
    lo, hi = chunk_map.starts[:-1], chunk_map.starts[1:]
    if meta.storage == "array":
        return lo * sample_bytes, hi * sample_bytes
    slots, sizes = meta.blob_slots()
    offsets = np.asarray(slots, dtype=np.int64)
    return offsets[lo], offsets[hi - 1] + np.asarray(sizes, dtype=np.int64)[hi - 1]


def group_chunks(
    chunk_map: ChunkMap, meta: PackMeta, chunk_nbytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return each group's first HDF5 chunk and its chunk count (``chunk_nbytes`` 0: one)."""
    groups = chunk_map.num_chunks
    if meta.storage == "array" or not chunk_nbytes:
        return np.arange(groups, dtype=np.int64), np.ones(groups, dtype=np.int64)
    begin, end = group_spans(chunk_map, meta, 0)
    first = begin // chunk_nbytes
    return first, np.maximum(end - 1, begin) // chunk_nbytes - first + 1


def chunk_uses(
    samples: np.ndarray,
    times: np.ndarray,
    chunk_map: ChunkMap,
    first: np.ndarray,
    count: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the HDF5 chunks that reading ``samples`` at ``times`` uses, first uses only."""
    groups, group_times = chunk_stream(chunk_map.chunks_of(np.asarray(samples)), times)
    spans = count[groups]
    chunks = np.repeat(first[groups] - np.cumsum(spans) + spans, spans) + np.arange(
        int(spans.sum())
    )
    return chunk_stream(chunks, np.repeat(group_times, spans))


def planned_source(
    source: ByteSource,
    offsets: np.ndarray,
    sizes: np.ndarray,
    *,
    pack_id: str | None,
    read_ahead: ReadAheadOptions | None,
    disk_cache: DiskCacheOptions | None,
    reader_checks: bool = False,
) -> ByteSource:
    """Return ``source`` wrapped to read ahead (remote, or ``read_ahead`` given), else itself."""
    if isinstance(source, PlannedSource) or not (source.remote or read_ahead is not None):
        return source
    if not source.remote:  # a local file is its own cache
        disk_cache = None
    identity = source.identity()
    return PlannedSource(
        source,
        offsets,
        sizes,
        pack=pack_key(pack_id, identity.size, identity.tag),
        read_ahead=read_ahead,
        cache=disk_cache,
        reader_checks=reader_checks,
    )


class PlannedSource(ByteSource):
    """A source whose chunk reads go through a read-ahead and the machine's disk cache."""

    def __init__(
        self,
        source: ByteSource,
        offsets: np.ndarray,
        sizes: np.ndarray,
        *,
        pack: str,
        read_ahead: ReadAheadOptions | None = None,
        cache: DiskCacheOptions | None = None,
        reader_checks: bool = False,
    ) -> None:
        self.source = source
        self.reader_checks = reader_checks
        self._fresh: dict[int, np.ndarray] = {}  # refetched pieces, for their next read
        self.url = source.url
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.pack = pack
        self.read_ahead_options = read_ahead or ReadAheadOptions()
        self.cache_options = cache
        self._by_offset = {int(o): c for c, o in enumerate(self.offsets.tolist()) if o >= 0}
        self._ahead: ReadAhead | None = None
        self._cache: DiskCache | None = None
        self._pid = -1

    def size(self) -> int:
        """Return the wrapped source's size."""
        return self.source.size()

    def identity(self) -> SourceIdentity:
        """Return the wrapped source's identity."""
        return self.source.identity()

    @property
    def remote(self) -> bool:
        """Whether the wrapped source crosses a network."""
        return self.source.remote

    def ahead(self) -> ReadAhead:
        """Return this process's read-ahead (made on first use after a fork)."""
        if self._ahead is None or self._pid != os.getpid():
            self._cache = DiskCache(self.cache_options) if self.cache_options else None
            self._ahead = ReadAhead(
                self.source,
                self.offsets,
                self.sizes,
                options=self.read_ahead_options,
                cache=self._cache,
                pack=self.pack,
                defer_store=self.reader_checks,
            )
            self._pid = os.getpid()
        return self._ahead

    @property
    def cache(self) -> DiskCache | None:
        """This process's disk cache, if any."""
        self.ahead()
        return self._cache

    def plan_samples(
        self,
        plan: ReadPlan,
        chunk_map: ChunkMap,
        pieces: tuple[np.ndarray, np.ndarray],
        *,
        held: Sequence[int] = (),
    ) -> None:
        """Read ahead for the samples of ``plan`` (their chunks, first uses in order)."""
        first, count = pieces
        samples, times = plan.samples, plan.times
        if len(held):
            groups = chunk_map.chunks_of(samples)
            soon, _ = chunk_stream(groups, times)
            window, kept = [int(g) for g in held], []  # the reader's FIFO window, oldest first
            for group in soon.tolist():
                if group in window:
                    kept.append(group)
                    continue
                window = [*window[1:], group]
                if not set(held) & set(window):
                    break
            keep = ~np.isin(groups, np.asarray(kept, dtype=np.int64))
            samples, times = samples[keep], times[keep]
        chunks, times = chunk_uses(samples, times, chunk_map, first, count)
        later, later_times = chunk_uses(
            plan.future_samples, plan.future_times, chunk_map, first, count
        )
        self.plan(chunks, times, Future(later, later_times))

    def plan(self, chunks: np.ndarray, times: np.ndarray, future: Future | None) -> None:
        """Read the chunks ``chunks`` ahead, in this order; tell the cache the rank's future."""
        ahead = self.ahead()
        keep = self.offsets[chunks] >= 0  # unallocated chunks are read through HDF5
        chunks, times = chunks[keep], times[keep]
        if self._cache is not None and future is not None:
            # just before the first use: it is still to come
            now = float(times[0]) - 1e-6 if len(times) else 0.0
            self._cache.set_future(self.pack, future, now=now)
        ahead.plan(chunks, times)

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Return each ``[start, end)`` range; whole chunks through the read-ahead."""
        found: list[memoryview | None] = [None] * len(ranges)
        pieces: dict[int, int] = {}  # position in ranges -> chunk
        others: list[int] = []
        for at, (start, end) in enumerate(ranges):
            chunk = self._by_offset.get(int(start))
            if chunk is None or int(self.sizes[chunk]) != end - start:
                others.append(at)
            elif (again := self._fresh.pop(chunk, None)) is not None:  # ``refetch``'s
                found[at] = again.data
            else:
                pieces[at] = chunk
        if pieces:
            fetched = self.ahead().get_many(list(pieces.values()))
            for at, piece in zip(pieces, fetched, strict=True):
                found[at] = piece.data
        if others:
            answers = self.source.read_ranges([ranges[at] for at in others])
            for at, view in zip(others, answers, strict=True):
                found[at] = view
        return [view for view in found if view is not None]

    def refetch(self, pieces: Sequence[int]) -> None:
        """Fetch ``pieces`` again for their next read: the reader found their bytes wrong."""
        self._fresh.update(self.ahead().refetch(pieces))

    def verified(self, pieces: Sequence[int]) -> None:
        """Cache ``pieces``: the reader checked their bytes."""
        self.ahead().verified(pieces)

    def damaged(self, pieces: Sequence[int], cause: str, reads: int) -> FormatError:
        """Return the error for ``pieces`` found wrong (``cause``) in each of ``reads`` reads."""
        begin = int(self.offsets[pieces[0]])
        end = int(self.offsets[pieces[-1]] + self.sizes[pieces[-1]]) - 1
        named = f"chunk {pieces[0]}" if len(pieces) == 1 else f"chunks {pieces[0]}-{pieces[-1]}"
        return FormatError(
            f"{self.url}: bytes {begin}-{end} ({named}) {cause} in each of {reads} reads: "
            f"the object in the store is damaged, run `h5pack verify {self.url}`"
        )

    def read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill the contiguous uint8 ``buffer`` from ``offset`` (a chunk: from the plan)."""
        (data,) = self.read_ranges([(offset, offset + buffer.nbytes)])
        buffer.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)

    def close(self) -> None:
        """Stop reading ahead and leave the disk cache (its chunks stay)."""
        if self._ahead is not None and self._pid == os.getpid():
            self._ahead.close()
            if self._cache is not None:
                self._cache.close()
        self._ahead = None
        self._cache = None
        self.source.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_ahead=None, _cache=None, _pid=-1, _fresh={})
        return state
