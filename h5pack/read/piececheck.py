"""A remote pack's downloaded pieces checked against the pack's digests before any use.

NOTE [ Checked downloads ]

A piece (a chunk, or a contiguous pack's group: ``read.planned``) fetched from a store is
decompressed and each sample wholly inside it is checked against its recorded digest
before the piece enters the disk cache or reaches the reader (``ReadAhead``): a body that
changed on the way is fetched again, never kept. A sample larger than a chunk (it owns
several) is checked by the reader when the sample is read (``verify_checksums``). The
cache itself records a digest of each file it writes and checks it at every hit, so that
damage on the cache's disk is told apart from damage in the pack (``read.diskcache``).
"""

from __future__ import annotations

import threading

import numpy as np

from h5pack.core import format as fmt
from h5pack.core.layout import ChunkMap
from h5pack.read.checks import SampleChecks
from h5pack.read.direct import ChunkTable

__all__ = ["PieceCheck"]

_local = threading.local()


class PieceCheck:
    """Check a piece's stored bytes: ``check(piece, data)`` is None, or what is wrong.

    Args:
        meta: The pack's metadata (its storage, and the samples' slots of a blob pack).
        chunk_map: Its sample groups.
        table: The images' chunk table (pieces are chunks), or None (pieces are groups of
            a contiguous, unfiltered dataset).
        checks: The recorded digests.
    """

    def __init__(
        self,
        meta: fmt.PackMeta,
        chunk_map: ChunkMap,
        table: ChunkTable | None,
        checks: SampleChecks,
    ) -> None:
        self.table, self.checks = table, checks
        self.starts = np.asarray(chunk_map.starts, dtype=np.int64)
        self.sample_bytes = int(np.prod(meta.images_shape[1:]))
        self.blob = meta.storage != "array"
        if self.blob:
            slots, sizes = meta.blob_slots()  # N + 1 slot boundaries, N sizes
            self.offsets = np.asarray(slots, dtype=np.int64)[: len(sizes)]
            self.ends = self.offsets + np.asarray(sizes, dtype=np.int64)

    def samples(self, piece: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the samples wholly inside ``piece``, with their starts and ends in it."""
        if self.table is None or not self.blob:  # a group: its samples
            index = np.arange(self.starts[piece], self.starts[piece + 1])
            if not self.blob:
                starts = (index - index[:1]) * self.sample_bytes
                return index, starts, starts + self.sample_bytes
            base = self.offsets[index[:1]]
            return index, self.offsets[index] - base, self.ends[index] - base
        step = self.table.chunk_nbytes
        low, high = piece * step, (piece + 1) * step
        first, last = np.searchsorted(self.offsets, [low, high])
        index = np.arange(first, last)
        index = index[self.ends[index] <= high]
        return index, self.offsets[index] - low, self.ends[index] - low

    def __call__(self, piece: int, data: np.ndarray) -> str | None:
        """Return None when every sample wholly inside ``piece`` is as recorded, else why not."""
        block, table = data, self.table
        codec = None if table is None else table.codec
        if table is not None and codec is not None and not int(table.masks[piece]) >> codec[0] & 1:
            size = table.chunk_nbytes
            scratch: np.ndarray | None = getattr(_local, "scratch", None)
            if scratch is None or scratch.size < size:
                scratch = _local.scratch = np.empty(size, dtype=np.uint8)
            block = scratch[:size]
            try:
                table.decompress_into(piece, data, block)
            except (OSError, RuntimeError, ValueError) as err:
                return f"does not decompress ({err})"
        digest, recorded = self.checks.contiguous_digest, self.checks.recorded
        index, starts, ends = self.samples(piece)
        for i, a, b in zip(index.tolist(), starts.tolist(), ends.tolist(), strict=True):
            if b > block.size or digest(block[a:b]) != int(recorded[i]):
                return f"holds sample {i}, which does not match its {self.checks.digest_name}"
        return None
