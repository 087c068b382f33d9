"""Direct chunk reads: a chunk's bytes via ``os.pread``, decompressed outside HDF5."""

from __future__ import annotations

import importlib
import os
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

# NOTE [ Direct chunk path ]
#
# h5py serialises every call behind one global lock, so threads cannot read or decompress
# two chunks at once through it. A chunk's file offset and size are looked up once
# (``chunk_iter``); afterwards a chunk is ``os.pread`` at that offset and decompressed by
# Python codecs that release the GIL (zlib for gzip; lz4, zstandard and blosc when
# installed), so several threads decompress in parallel and no HDF5 call is made per chunk.
# Uncompressed samples are read with ``os.preadv`` straight into the caller's buffer.
# Anything this path does not understand (lzf, bitshuffle, a chunk shape that splits a
# sample, an unallocated chunk, a filter mask it cannot honour) is read through h5py
# instead; tests check that both paths give identical pixels for every codec.

FILTER_DEFLATE = 1
FILTER_SHUFFLE = 2
FILTER_BLOSC = 32001
FILTER_LZ4 = 32004
FILTER_ZSTD = 32015

Decompressor = Callable[[bytes, int], bytes]

_local = threading.local()


def _inflate(data: bytes, size: int) -> bytes:
    return zlib.decompress(data, bufsize=max(size, 1))


def _lz4(data: bytes, size: int) -> bytes:
    # HDF5 LZ4 filter (id 32004) framing: total size (int64 BE), block size (int32 BE), then
    # per block: compressed size (int32 BE) and data, stored raw when it did not shrink.
    block_codec = importlib.import_module("lz4.block")
    total, block = struct.unpack_from(">qi", data, 0)
    pos, produced, parts = 12, 0, []
    while produced < total:
        (length,) = struct.unpack_from(">i", data, pos)
        pos += 4
        want = min(block, total - produced)
        piece = data[pos : pos + length]
        pos += length
        if length != want:
            piece = block_codec.decompress(piece, uncompressed_size=want)
        parts.append(piece)
        produced += want
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _zstd(data: bytes, size: int) -> bytes:
    decompressor = getattr(_local, "zstd", None)
    if decompressor is None:  # ZstdDecompressor is not thread-safe: one per thread
        decompressor = _local.zstd = importlib.import_module("zstandard").ZstdDecompressor()
    result: bytes = decompressor.decompress(data, max_output_size=max(size, 1))
    return result


def _blosc(data: bytes, size: int) -> bytes:
    result: bytes = importlib.import_module("blosc").decompress(data)
    return result


def _available(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def decompressors() -> dict[int, Decompressor]:
    """Return the HDF5 filter ids this process can decompress outside HDF5."""
    found: dict[int, Decompressor] = {FILTER_DEFLATE: _inflate}
    if _available("lz4.block"):
        found[FILTER_LZ4] = _lz4
    if _available("zstandard"):
        found[FILTER_ZSTD] = _zstd
    if _available("blosc"):
        found[FILTER_BLOSC] = _blosc
    return found


@dataclass(frozen=True)
class ChunkTable:
    """Where each chunk of a dataset lies in the file, and how to undo its filters.

    Attributes:
        offsets: File offset of chunk ``c`` along the first axis (-1 when unallocated).
        sizes: Stored bytes of chunk ``c``.
        masks: HDF5 filter mask of chunk ``c`` (bit i set: filter i was skipped).
        pipeline: ``(filter id, decompressor or None for a no-op)`` in write order.
        chunk_nbytes: Decompressed bytes of one chunk.
    """

    offsets: np.ndarray
    sizes: np.ndarray
    masks: np.ndarray
    pipeline: tuple[tuple[int, Decompressor | None], ...]
    chunk_nbytes: int

    def decompress(self, chunk: int, data: bytes) -> bytes:
        """Undo the filters of ``chunk`` on its stored ``data``."""
        mask = int(self.masks[chunk])
        for position in range(len(self.pipeline) - 1, -1, -1):
            if mask & (1 << position):
                continue
            function = self.pipeline[position][1]
            if function is not None:
                data = function(data, self.chunk_nbytes)
        return data


def chunk_table(dataset: h5py.Dataset) -> ChunkTable | None:
    """Return the direct-read table of a chunked uint8 dataset, or None if unsupported.

    Supported: chunks that span every axis but the first, uint8, and a filter pipeline of
    deflate, byte shuffle (a no-op on 1-byte items), and lz4, zstd or blosc when their
    Python packages are installed.
    """
    if dataset.chunks is None or dataset.dtype != np.uint8:
        return None
    if tuple(dataset.chunks[1:]) != tuple(dataset.shape[1:]):
        return None
    available = decompressors()
    plist = dataset.id.get_create_plist()
    pipeline: list[tuple[int, Decompressor | None]] = []
    for i in range(plist.get_nfilters()):
        filter_id, _flags, values, _name = plist.get_filter(i)
        if filter_id == FILTER_SHUFFLE and (not values or values[0] == 1):
            pipeline.append((filter_id, None))
        elif filter_id in available:
            pipeline.append((filter_id, available[filter_id]))
        else:
            return None
    step = int(dataset.chunks[0])
    count = -(-int(dataset.shape[0]) // step) if dataset.shape[0] else 0
    offsets = np.full(count, -1, dtype=np.int64)
    sizes = np.zeros(count, dtype=np.int64)
    masks = np.zeros(count, dtype=np.int64)

    def visit(info: Any) -> None:
        c = int(info.chunk_offset[0]) // step
        offsets[c], sizes[c], masks[c] = info.byte_offset, info.size, info.filter_mask

    dataset.id.chunk_iter(visit)
    return ChunkTable(
        offsets=offsets,
        sizes=sizes,
        masks=masks,
        pipeline=tuple(pipeline),
        chunk_nbytes=int(np.prod(dataset.chunks)),
    )


def contiguous_offset(dataset: h5py.Dataset) -> int | None:
    """Return the file offset of a contiguous, unfiltered dataset's data, or None."""
    if dataset.chunks is not None or dataset.compression is not None:
        return None
    offset = dataset.id.get_offset()
    return None if offset is None else int(offset)


class DirectFile:
    """A read-only file descriptor for ``os.pread``/``os.preadv``, opened lazily per process.

    # NOTE: a descriptor inherited through fork shares nothing but the open file; pread
    # carries its own offset, so concurrent readers in threads and processes do not clash.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = -1

    def fd(self) -> int:
        """Return this process's descriptor."""
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDONLY)
            self._pid = os.getpid()
        return self._fd

    def pread(self, size: int, offset: int) -> bytes:
        """Return ``size`` bytes at ``offset``."""
        data = os.pread(self.fd(), size, offset)
        if len(data) != size:
            raise OSError(f"{self.path}: short read at byte {offset} ({len(data)} of {size})")
        return data

    def read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill the contiguous uint8 ``buffer`` from ``offset``."""
        view = buffer.data.cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self.fd(), [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{self.path}: short read at byte {offset + done}")
            done += got

    def close(self) -> None:
        """Close the descriptor (if this process opened it)."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fd": None, "_pid": -1}
