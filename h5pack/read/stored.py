"""Where a pack's stored samples lie, and the one byte path that reads them.

The direct chunk path (``read.direct``) where it applies, h5py for the rest (a codec that
needs HDF5, an unallocated chunk); no window (``read.groups`` keeps it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

from h5pack.core import format as fmt
from h5pack.core.layout import ChunkMap
from h5pack.core.source import ByteSource, LocalSource
from h5pack.errors import FormatError, RemoteError
from h5pack.read.checks import SampleChecks, copy_mapped
from h5pack.read.direct import ChunkTable, read_scratch
from h5pack.read.planned import PlannedSource

# How a group is loaded (``StoredImages.plan``): (through the direct path, buffer bytes).
Plan = tuple[bool, int]
REFETCHES = 2  # pieces of a group found wrong are fetched this many more times

# NOTE [ Checked downloads ]
# The reader checks a remote pack's pieces by checking every sample of each decompressed
# group (``load_checked``, decision 0013). A group that fails, read through a
# ``PlannedSource``, has its pieces fetched again (evicted from the disk cache) up to
# ``REFETCHES`` times, then one error names the object, the bytes and why; a piece is cached
# only once its group passed (``PlannedSource.verified``).


class StoredImages:
    """The stored samples of one pack: their layout and the reads of their bytes."""

    def __init__(
        self,
        meta: fmt.PackMeta,
        chunk_map: ChunkMap,
        *,
        table: ChunkTable | None,
        contiguous: int | None,
        source: ByteSource,
        images: Callable[[], h5py.Dataset],
    ) -> None:
        self.meta, self.chunk_map, self.table, self.contiguous = meta, chunk_map, table, contiguous
        self.source = source  # a wrapper's (``read.planned``) where the plan reads ahead
        self.h5_images = images  # h5py's images dataset, opened on first call
        self.sample_bytes = int(np.prod(meta.images_shape[1:]))
        self._step = meta.chunks[0] if meta.chunks is not None else 1
        self.all_allocated = table is None or bool(np.all(table.offsets >= 0))
        # nanoseconds spent decompressing chunks (the loader's stall report reads it; an
        # update racing another thread's may be lost: a statistic, not a count)
        self.decompress_ns = 0
        self._fetched: dict[int, Any] = {}  # stored chunks fetched for the groups being loaded

    @property
    def direct(self) -> bool:
        """Whether the direct chunk path is in use."""
        return self.table is not None or self.contiguous is not None

    def bounds(self, group: int) -> tuple[int, int]:
        """Return the ``[lo, hi)`` samples of group ``group``."""
        return int(self.chunk_map.starts[group]), int(self.chunk_map.starts[group + 1])

    def plan(self, group: int) -> Plan:
        """Return ``(direct, buffer bytes)`` for loading group ``group`` whole."""
        lo, hi = self.bounds(group)
        table = self.table
        if self.meta.storage == "array":
            if table is not None and table.offsets[group] >= 0:
                return True, table.chunk_nbytes
            return self.contiguous is not None, (hi - lo) * self.sample_bytes
        begin, end = self.blob_span(lo, hi)
        if self.contiguous is not None:
            return True, end - begin
        if table is not None:
            first, last = begin // table.chunk_nbytes, (end - 1) // table.chunk_nbytes
            if bool(np.all(table.offsets[first : last + 1] >= 0)):
                return True, (last - first + 1) * table.chunk_nbytes
        return False, end - begin

    def load(self, group: int, plan: Plan, buffer: np.ndarray) -> np.ndarray:
        """Read and decompress group ``group`` whole into ``buffer`` (unchecked)."""
        direct, _ = plan
        lo, hi = self.bounds(group)
        shape = self.meta.images_shape[1:]
        table = self.table
        if direct and table is None:  # contiguous: the group's bytes at once
            assert self.contiguous is not None  # planned direct
            if self.meta.storage == "array":
                view = buffer.reshape(hi - lo, *shape)
                self.source.read_into(view, self.contiguous + lo * self.sample_bytes)
                return view
            self.source.read_into(buffer, self.contiguous + self.blob_span(lo, hi)[0])
            return buffer
        if self.meta.storage == "array":
            if direct:
                assert table is not None  # planned direct
                self._read_chunk_into(table, group, buffer)
                return buffer.reshape(-1, *shape)[: hi - lo]
            view = buffer.reshape(hi - lo, *shape)
            self.h5_images().read_direct(view, np.s_[lo:hi], np.s_[0 : hi - lo])
            return view
        begin, end = self.blob_span(lo, hi)
        if direct:
            assert table is not None  # planned direct
            step = table.chunk_nbytes
            first = begin // step
            for k in range(buffer.size // step):
                self._read_chunk_into(table, first + k, buffer[k * step : (k + 1) * step])
            return buffer[begin - first * step : end - first * step]
        self.h5_images().read_direct(buffer, np.s_[begin:end], np.s_[0 : end - begin])
        return buffer

    def load_checked(
        self, group: int, plan: Plan, buffer: np.ndarray, checks: SampleChecks | None
    ) -> np.ndarray:
        """Load group ``group`` (``load``), each sample checked; NOTE [ Checked downloads ]."""
        source = self.source
        if not (isinstance(source, PlannedSource) and source.reader_checks and checks and plan[0]):
            block = self.load(group, plan, buffer)
            self._check(group, block, checks)
            return block
        pieces, cause = self.pieces([group], [plan]), ""
        for attempt in range(REFETCHES + 1):
            if attempt:
                for piece in pieces:
                    self._fetched.pop(piece, None)
                source.refetch(pieces)
            try:
                block = self.load(group, plan, buffer)
                self._check(group, block, checks)
            except RemoteError:
                raise
            except FormatError as err:  # "<path>: sample i (name) ... ; the pack is damaged"
                cause = f"fails its check ({str(err).split(': ', 1)[-1].split(';')[0]})"
            except (OSError, RuntimeError, ValueError, KeyError) as err:
                cause = f"does not decompress ({err})"
            else:
                source.verified(pieces)
                return block
        raise source.damaged(pieces, cause, REFETCHES + 1)

    def _check(self, group: int, block: np.ndarray, checks: SampleChecks | None) -> None:
        if checks is not None:  # every sample of the freshly decompressed group
            lo, hi = self.bounds(group)
            samples = [self.sample_of(group, block, i) for i in range(lo, hi)]
            checks.many(range(lo, hi), samples, group)

    def _read_chunk_into(self, table: ChunkTable, chunk: int, out: np.ndarray) -> None:
        fetched = self._fetched.pop(chunk, None)
        if fetched is not None:
            stored = np.frombuffer(fetched, dtype=np.uint8)
            if stored.size != int(table.sizes[chunk]):
                raise OSError(
                    f"chunk {chunk}: {stored.size} bytes read, {table.sizes[chunk]} stored"
                )
        else:
            stored = read_scratch(self.source, int(table.sizes[chunk]), int(table.offsets[chunk]))
        start = time.perf_counter_ns()
        table.decompress_into(chunk, stored, out)
        self.decompress_ns += time.perf_counter_ns() - start

    # NOTE [ One request per chunk ]: a remote pack's groups are read whole, the stored
    # chunks of every group one call misses fetched together (``source.read_ranges``: one
    # ranged GET each, concurrently) before any is decompressed.

    def fetch(self, groups: list[int], plans: list[Plan]) -> None:
        """Fetch the stored chunks of ``groups`` in one ``read_ranges`` (a remote source)."""
        table = self.table
        if not self.source.remote or table is None:
            return
        chunks = [c for c in self.pieces(groups, plans) if c not in self._fetched]
        if not chunks:
            return
        ranges = [(int(table.offsets[c]), int(table.offsets[c] + table.sizes[c])) for c in chunks]
        try:
            fetched = self.source.read_ranges(ranges)
        except RemoteError as err:
            named = ", ".join(str(c) for c in chunks[:8]) + (", ..." if len(chunks) > 8 else "")
            raise RemoteError(f"reading chunk(s) {named}: {err}") from err
        self._fetched.update(zip(chunks, fetched, strict=True))

    def pieces(self, groups: list[int], plans: list[Plan]) -> list[int]:
        """Return the pieces (chunks; a contiguous pack's groups) the direct ``groups`` read."""
        table, pieces = self.table, []
        for group, (direct, nbytes) in zip(groups, plans, strict=True):
            if not direct:
                continue
            if table is None or self.meta.storage == "array":
                pieces.append(group)
                continue
            first = self.blob_span(*self.bounds(group))[0] // table.chunk_nbytes
            pieces.extend(range(first, first + nbytes // table.chunk_nbytes))
        return list(dict.fromkeys(pieces))

    def blob_span(self, lo: int, hi: int) -> tuple[int, int]:
        """Return the ``[begin, end)`` blob bytes of samples ``lo..hi-1``."""
        offsets, sizes = self.meta.blob_slots()
        return int(offsets[lo]), int(offsets[hi - 1]) + int(sizes[hi - 1])

    def sample_of(self, group: int, block: np.ndarray, index: int) -> np.ndarray:
        """Return sample ``index`` (a view) from its group's decompressed data."""
        if self.meta.storage == "array":
            sample: np.ndarray = block[index - int(self.chunk_map.starts[group])]
            return sample
        offsets, sizes = self.meta.blob_slots()
        start = int(offsets[index]) - int(offsets[self.chunk_map.starts[group]])
        return block[start : start + int(sizes[index])]

    def sample_offsets(self, indices: np.ndarray) -> np.ndarray:
        """Return the file offsets of uncompressed array samples ``indices`` (direct path)."""
        within = indices * self.sample_bytes
        if self.contiguous is not None:
            return np.asarray(self.contiguous + within, dtype=np.int64)
        assert self.table is not None  # direct is true
        step = self._step
        base = self.table.offsets[indices // step] - (indices // step) * step * self.sample_bytes
        return np.asarray(base + within, dtype=np.int64)

    def read_uncompressed(self, idx: np.ndarray, groups: np.ndarray) -> list[np.ndarray]:
        """Read uncompressed samples ``idx`` (of ``groups``), runs of consecutive indices."""
        out: list[np.ndarray] = [np.empty(0, np.uint8)] * idx.size  # each slot filled below
        order = np.argsort(idx, kind="stable")
        boundaries = np.flatnonzero(np.diff(groups[order])) + 1
        for positions in np.split(order, boundaries):
            wanted = idx[positions]  # sorted, one group's
            unique = np.unique(wanted)
            for run in np.split(unique, np.flatnonzero(np.diff(unique) > 1) + 1):
                lo, hi = int(run[0]), int(run[-1]) + 1
                inside = (wanted >= lo) & (wanted < hi)
                samples = self._read_run(lo, hi, wanted[inside])
                for pos, sample in zip(positions[inside].tolist(), samples, strict=True):
                    out[pos] = sample
        return out

    def _read_run(self, lo: int, hi: int, wanted: np.ndarray) -> list[np.ndarray]:
        """Read samples ``lo..hi-1`` at once; return those of ``wanted``, in its order."""
        if self.meta.storage == "array":
            block = self._read_array_run(lo, hi)
            return [block[i - lo] for i in wanted.tolist()]
        begin, end = self.blob_span(lo, hi)
        data = self._read_blob_bytes(begin, end)
        offsets, sizes = self.meta.blob_slots()
        starts = offsets[wanted] - begin
        ends = starts + sizes[wanted]
        return [data[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]

    def _read_array_run(self, lo: int, hi: int) -> np.ndarray:
        block = np.empty((hi - lo, *self.meta.images_shape[1:]), dtype=np.uint8)
        table = self.table
        allocated = table is None or table.offsets[self.chunk_map.chunk_of(lo)] >= 0
        if self.direct and allocated:
            self.source.read_into(block, int(self.sample_offsets(np.array([lo]))[0]))
        else:
            self.h5_images().read_direct(block, np.s_[lo:hi], np.s_[0 : hi - lo])
        return block

    def _read_blob_bytes(self, begin: int, end: int) -> np.ndarray:
        data = np.empty(end - begin, dtype=np.uint8)
        if self.contiguous is not None:
            self.source.read_into(data, self.contiguous + begin)
            return data
        table = self.table
        if table is not None:
            step = table.chunk_nbytes
            chunk = begin // step
            if (end - 1) // step == chunk and table.offsets[chunk] >= 0:
                self.source.read_into(data, int(table.offsets[chunk]) + begin - chunk * step)
                return data
        stored: np.ndarray = self.h5_images()[begin:end]
        return stored

    def mapped_views(self, idx: np.ndarray) -> list[np.ndarray] | None:
        """Views of uncompressed samples ``idx`` in a read-only mapping of the file, unchecked."""
        source, array = self.source, self.meta.storage == "array"
        usable = self.direct and self.all_allocated if array else self.contiguous is not None
        if not (usable and isinstance(source, LocalSource)):
            return None
        if idx.size == 0:
            return []
        if array:
            starts = self.sample_offsets(idx)
            ends = starts + self.sample_bytes
        else:  # a contiguous blob dataset: each sample's bytes in one piece of the file
            offsets, sizes = self.meta.blob_slots()
            assert self.contiguous is not None  # usable
            starts = self.contiguous + offsets[idx].astype(np.int64)
            ends = starts + sizes[idx]
        mapped = source.mapped(int(ends.max()))
        views = [mapped[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        if array:
            return [view.reshape(self.meta.images_shape[1:]) for view in views]
        return views

    def read_uncompressed_into(
        self, idx: np.ndarray, out: np.ndarray, checks: SampleChecks | None
    ) -> None:
        """Fill ``out`` with uncompressed array samples ``idx`` (checked with ``checks``)."""
        if not (self.direct and self.all_allocated):  # HDF5 reads
            for pos, i in enumerate(idx.tolist()):
                self.h5_images().read_direct(out, np.s_[i : i + 1], np.s_[pos : pos + 1])
            if checks is not None:
                checks.many(idx, out)
            return
        offsets = self.sample_offsets(idx)  # mapped: NOTE [ Mapped raw reads ]
        if not offsets.size:
            return
        # in file order (faster than batch order: docs/decisions/0025), each to its place
        order = np.argsort(offsets, kind="stable")
        source = self.source
        assert isinstance(source, LocalSource)  # a local uncompressed pack's
        mapped = source.mapped(int(offsets.max()) + self.sample_bytes)
        into = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        copy_mapped(idx, order, offsets[order], mapped, into, checks)
        if into is not out:
            out[...] = into
