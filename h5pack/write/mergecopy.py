"""The images of a merge: stored chunks copied as they are, the rest re-chunked (``merge``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import h5py
import numpy as np

from h5pack.core import format as fmt
from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap
from h5pack.write.blocks import aligned_offsets
from h5pack.write.images import COPY_BYTES, copy_array_rows
from h5pack.write.mergesources import Shard, blob_step


@dataclass(frozen=True)
class BlobPlan:
    """Where each shard's blob goes in the merged blob (NOTE [ Merging by chunks ]).

    ``step``: the merged chunk (None: contiguous); ``bases``: where each
    shard starts; ``offsets``: its slot offsets from there (N_k + 1); ``relaid``: its samples
    are laid out again (its chunk differs); ``length``: bytes of the merged blob.
    """

    step: int | None
    bases: list[int]
    offsets: list[np.ndarray]
    relaid: list[bool]
    length: int


def plan_blob(shards: Sequence[Shard]) -> BlobPlan:
    """Return where each shard's blob goes."""
    step = blob_step(shards)
    bases: list[int] = []
    offsets: list[np.ndarray] = []
    relaid: list[bool] = []
    position = end = 0
    for shard in shards:
        meta = shard.meta
        shard_offsets, shard_sizes = meta.blob_slots()
        length = meta.images_shape[0]
        local, again = shard_offsets, False
        if step is not None and meta.chunks != (step,):
            local, again = aligned_offsets(shard_sizes, step), True
            length = int(local[-1])
        bases.append(position)
        offsets.append(local.astype(np.int64))
        relaid.append(again)
        end = position + length
        position = end if step is None else -(-end // step) * step
    return BlobPlan(step, bases, offsets, relaid, end)


@dataclass
class Counts:
    """Chunks copied as stored, chunks re-chunked, bytes copied (``MergeReport``'s)."""

    copied: int = 0
    rechunked: int = 0
    bytes: int = 0


def create_like(
    handle: h5py.File, source: h5py.Dataset, length: int, step: int | None
) -> h5py.Dataset:
    """Create the merged images dataset like ``source`` (a blob's chunk: ``step`` bytes)."""
    shape = (length, *source.shape[1:])
    unlimited = source.maxshape[0] is None
    maxshape = (h5py.h5s.UNLIMITED if unlimited else length, *source.shape[1:])
    space = h5py.h5s.create_simple(shape, maxshape)
    dcpl = source.id.get_create_plist()
    if step is not None:
        dcpl.set_chunk((step,))
    dsid = h5py.h5d.create(handle.id, fmt.IMAGES.encode(), source.id.get_type(), space, dcpl=dcpl)
    return h5py.Dataset(dsid)


def _copy_chunks(
    source: h5py.Dataset, target: h5py.Dataset, rows: int, shift: int, counts: Counts
) -> None:
    """Copy the stored chunks of ``source`` that start before row ``rows``, ``shift`` rows on.

    Copied compressed, as stored; chunks never written stay unallocated.
    """
    tail = (0,) * (source.ndim - 1)
    allocated: list[int] = []
    source.id.chunk_iter(lambda info: allocated.append(int(info.chunk_offset[0])))
    for row in sorted(allocated):
        if row >= rows:
            continue
        mask, data = source.id.read_direct_chunk((row, *tail))
        target.id.write_direct_chunk((row + shift, *tail), data, mask)
        counts.copied += 1


class _Carry:
    """Rows waiting to fill whole chunks of the target (no chunk is written twice)."""

    def __init__(self, target: h5py.Dataset, step: int, counts: Counts) -> None:
        self.target = target
        self.step = step
        self.counts = counts
        self.start = 0
        self.rows: list[np.ndarray] = []

    def add(self, at: int, rows: np.ndarray) -> None:
        """Append ``rows``, which belong at row ``at`` of the target; write whole chunks."""
        if not self.rows:
            self.start = at
        self.rows.append(rows)
        self._write(final=False)

    def finish(self) -> None:
        """Write what is left (the target's last, partial chunk)."""
        if self.rows:
            self._write(final=True)

    def _write(self, *, final: bool) -> None:
        rows = np.concatenate(self.rows) if len(self.rows) > 1 else self.rows[0]
        whole = len(rows) if final else len(rows) - len(rows) % self.step
        if whole:
            self.target[self.start : self.start + whole] = rows[:whole]
            self.counts.rechunked += -(-whole // self.step)
        self.rows = [rows[whole:]] if whole < len(rows) else []
        self.start += whole


def _relay(
    source: h5py.Dataset, meta: PackMeta, local: np.ndarray, target: h5py.Dataset, base: int
) -> int:
    """Lay a blob's samples out again at ``local`` offsets from ``base``; return chunks written.

    For a shard whose chunk differs from the merged blob's: written through HDF5 in runs
    that start and end on chunk boundaries (or the shard's end), no chunk written twice.
    """
    offsets, sizes = meta.blob_slots()
    step = int(target.chunks[0])
    starts = ChunkMap.for_blob(local, step).starts
    written = 0
    lo = 0
    while lo < meta.num_samples:
        # whole groups (each starts on a chunk boundary) up to about COPY_BYTES
        g = int(np.searchsorted(starts, lo, side="right"))
        while g < len(starts) - 1 and local[starts[g]] - local[lo] < COPY_BYTES:
            g += 1
        hi = int(starts[g])
        begin = int(offsets[lo])
        end = int(offsets[hi - 1] + sizes[hi - 1])
        data = source[begin:end]
        out = np.zeros(
            int(local[hi] if hi < meta.num_samples else local[-1]) - int(local[lo]), np.uint8
        )
        for i in range(lo, hi):
            at, size = int(local[i] - local[lo]), int(sizes[i])
            start = int(offsets[i]) - begin
            out[at : at + size] = data[start : start + size]
        target[base + int(local[lo]) : base + int(local[lo]) + out.size] = out
        written += -(-out.size // step)
        lo = hi
    return written


def tails_last_order(counts: Sequence[int], step: int) -> tuple[list[int], np.ndarray | None]:
    """Return the rows of each shard copied in place, and the merged order of the samples.

    Each shard's whole chunks are copied in shard order, the rows of its last, partial
    chunk go to the end (NOTE [ Merging by chunks ]). The order is None when that is the
    concatenation, else merged sample ``j`` is sample ``order[j]`` of the concatenation.

    Example:
        >>> rows, order = tails_last_order([5, 4, 3], 2)
        >>> rows, order.tolist()
        ([4, 4, 2], [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 4, 11])
    """
    whole = [n - n % step for n in counts]
    if all(w == n for w, n in zip(whole[:-1], counts[:-1], strict=True)):
        return [*whole[:-1], counts[-1]], None
    bases = np.cumsum([0, *counts[:-1]])
    kept = [np.arange(b, b + w) for b, w in zip(bases, whole, strict=True)]
    tails = [np.arange(b + w, b + n) for b, w, n in zip(bases, whole, counts, strict=True)]
    return whole, np.concatenate(kept + tails).astype(np.int64)


def merge_images(
    shards: Sequence[Shard],
    target: h5py.Dataset,
    blob: BlobPlan | None,
    counts: Counts,
    step_done: Callable[[int], None],
    *,
    keep_order: bool,
) -> None:
    """Fill the merged images dataset from every shard (NOTE [ Merging by chunks ])."""
    step = int(target.chunks[0]) if target.chunks is not None else None
    carry = _Carry(target, step or 1, counts)
    tails: list[tuple[Shard, int]] = []
    position = 0
    for k, shard in enumerate(shards):
        num = shard.meta.num_samples
        with fmt.open_h5(shard.path) as handle, fmt.reading(str(shard.path), "the images"):
            source = handle[fmt.IMAGES]
            if blob is not None:  # whole chunks, or the exact bytes
                length = int(source.shape[0])
                if blob.relaid[k]:
                    counts.rechunked += _relay(
                        source, shard.meta, blob.offsets[k], target, blob.bases[k]
                    )
                elif step is None:
                    copy_array_rows(source, target, length, at=blob.bases[k])
                    counts.bytes += length
                else:
                    _copy_chunks(source, target, length, blob.bases[k], counts)
            elif step is None:
                copy_array_rows(source, target, num, at=position)
                counts.bytes += int(source.nbytes)
            elif not carry.rows and position % step == 0:
                last = k == len(shards) - 1 and not tails
                whole = num if last else num - num % step
                _copy_chunks(source, target, whole, position, counts)
                if whole < num and keep_order:
                    carry.add(position + whole, source[whole:num])
                elif whole < num:
                    tails.append((shard, whole))
                    num = whole
            else:  # keep_order, shifted within chunks: decompressed and written again
                row_bytes = max(1, int(np.prod(source.shape[1:])))
                block = max(step, COPY_BYTES // row_bytes // step * step)
                for start in range(0, num, block):
                    carry.add(position + start, source[start : min(num, start + block)])
        position += num
        step_done(num)
    for shard, whole in tails:
        num = shard.meta.num_samples
        with fmt.open_h5(shard.path) as handle, fmt.reading(str(shard.path), "the images"):
            carry.add(position, handle[fmt.IMAGES][whole:num])
        position += num - whole
        step_done(num - whole)
    carry.finish()
