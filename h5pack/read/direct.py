"""Direct chunk reads: a chunk's bytes from its byte source, decompressed outside HDF5."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from h5pack.core.description import PackIndex
from h5pack.core.layout import FILTER_BLOSC, FILTER_DEFLATE, FILTER_LZ4, FILTER_SHUFFLE, FILTER_ZSTD
from h5pack.core.source import ByteSource

# NOTE [ Direct chunk path ]
# h5py serialises every call behind one lock. So a chunk's offset and size come once from
# the pack's description, and the chunk is read into a per-thread buffer and decompressed
# into a caller-owned buffer by a codec that releases the GIL (the system's zlib, liblz4,
# libzstd through ctypes; else the Python packages, a copy more; blosc's decompress_ptr):
# threads decompress in parallel. Output buffers are allocated and recycled in the calling
# thread (fresh ones from pool threads cost more page faults than LZ4 itself: decision
# 0011). What this path does not understand (lzf, bitshuffle, two filters, a chunk that
# splits a sample, an unallocated chunk) is read by h5py; tests compare both paths' pixels.

# decompress(src, out): fill ``out`` (uint8, exactly the decompressed size) from ``src``.
Decompressor = Callable[[np.ndarray, np.ndarray], None]

_local = threading.local()


def _address(array: np.ndarray, offset: int = 0) -> int:
    return int(array.ctypes.data) + offset


@cache
def _library(name: str) -> Any:
    """Return the system library ``name`` through ctypes (calls release the GIL), or None."""
    found = ctypes.util.find_library(name)
    if found is None:
        return None
    try:
        return ctypes.CDLL(found)
    except OSError:
        return None


def _function(library: str, name: str, restype: Any, *argtypes: Any) -> Any:
    """Return the function ``name`` of the system ``library``, typed for ctypes, or None."""
    lib = _library(library)
    if lib is None:
        return None
    function = getattr(lib, name)
    function.argtypes, function.restype = list(argtypes), restype
    return function


@cache
def _zlib_uncompress() -> Any:
    pointer, size = ctypes.c_void_p, ctypes.c_ulong
    return _function("z", "uncompress", ctypes.c_int, pointer, ctypes.POINTER(size), pointer, size)


@cache
def _lz4_decompress_safe() -> Any:
    pointer, size = ctypes.c_void_p, ctypes.c_int
    return _function("lz4", "LZ4_decompress_safe", size, pointer, pointer, size, size)


@cache
def _zstd_functions() -> tuple[Any, Any] | None:
    pointer, size = ctypes.c_void_p, ctypes.c_size_t
    decompress = _function("zstd", "ZSTD_decompress", size, pointer, size, pointer, size)
    is_error = _function("zstd", "ZSTD_isError", ctypes.c_uint, size)
    return None if decompress is None or is_error is None else (decompress, is_error)


def _check(produced: int, out: np.ndarray, codec: str) -> None:
    if produced != out.size:
        raise OSError(f"{codec}: a chunk decompressed to {produced} bytes, expected {out.size}")


def _inflate(src: np.ndarray, out: np.ndarray) -> None:
    uncompress = _zlib_uncompress()
    if uncompress is None:
        data = zlib.decompress(src.data, bufsize=max(out.size, 1))
        _check(len(data), out, "gzip")
        out[:] = np.frombuffer(data, dtype=np.uint8)
        return
    size = ctypes.c_ulong(out.size)
    status = uncompress(_address(out), ctypes.byref(size), _address(src), src.size)
    if status != 0:
        raise OSError(f"gzip: zlib error {status} while decompressing a chunk")
    _check(size.value, out, "gzip")


def _lz4(src: np.ndarray, out: np.ndarray) -> None:
    # HDF5 LZ4 filter (id 32004) framing: total size (int64 BE), block size (int32 BE), then
    # per block: compressed size (int32 BE) and data, stored raw when it did not shrink.
    total, block = struct.unpack_from(">qi", src.data, 0)
    _check(total, out, "lz4")
    decompress_safe = _lz4_decompress_safe()
    block_codec = None if decompress_safe else importlib.import_module("lz4.block")
    pos, produced = 12, 0
    while produced < total:
        (length,) = struct.unpack_from(">i", src.data, pos)
        pos += 4
        want = min(block, total - produced)
        if length == want:
            out[produced : produced + want] = src[pos : pos + length]
        elif decompress_safe is not None:
            got = decompress_safe(_address(src, pos), _address(out, produced), length, want)
            if got != want:
                raise OSError(f"lz4: a block decompressed to {got} bytes, expected {want}")
        else:
            assert block_codec is not None
            data = block_codec.decompress(src[pos : pos + length].data, want)
            out[produced : produced + want] = np.frombuffer(data, dtype=np.uint8)
        pos += length
        produced += want


def _zstd(src: np.ndarray, out: np.ndarray) -> None:
    functions = _zstd_functions()
    if functions is not None:
        decompress, is_error = functions
        produced = decompress(_address(out), out.size, _address(src), src.size)
        if is_error(produced):
            raise OSError("zstd: a chunk failed to decompress")
        _check(int(produced), out, "zstd")
        return
    decompressor = getattr(_local, "zstd", None)
    if decompressor is None:  # ZstdDecompressor is not thread-safe: one per thread
        decompressor = _local.zstd = importlib.import_module("zstandard").ZstdDecompressor()
    data = decompressor.decompress(src.data, max_output_size=max(out.size, 1))
    _check(len(data), out, "zstd")
    out[:] = np.frombuffer(data, dtype=np.uint8)


def _blosc(src: np.ndarray, out: np.ndarray) -> None:
    blosc = importlib.import_module("blosc")
    nbytes, _, _ = blosc.get_cbuffer_sizes(src[:16].tobytes())
    _check(int(nbytes), out, "blosc")
    produced = blosc.decompress_ptr(src.data.toreadonly(), _address(out))
    _check(int(produced), out, "blosc")


def _available(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def decompressors() -> dict[int, Decompressor]:
    """Return the HDF5 filter ids this process can decompress outside HDF5."""
    found: dict[int, Decompressor] = {FILTER_DEFLATE: _inflate}
    if _lz4_decompress_safe() is not None or _available("lz4.block"):
        found[FILTER_LZ4] = _lz4
    if _zstd_functions() is not None or _available("zstandard"):
        found[FILTER_ZSTD] = _zstd
    if _available("blosc"):
        found[FILTER_BLOSC] = _blosc
    return found


@dataclass(frozen=True)
class ChunkTable:
    """Where each chunk of a dataset lies in the file, and how to undo its filter."""

    offsets: np.ndarray
    sizes: np.ndarray
    masks: np.ndarray
    codec: tuple[int, Decompressor] | None
    chunk_nbytes: int

    def decompress_into(self, chunk: int, src: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (``chunk_nbytes`` uint8) with chunk ``chunk`` from its stored ``src``."""
        if self.codec is None or int(self.masks[chunk]) & (1 << self.codec[0]):
            if src.size != out.size:
                raise OSError(f"chunk {chunk}: {src.size} stored bytes, expected {out.size}")
            out[:] = src
            return
        self.codec[1](src, out)


def chunk_table(index: PackIndex) -> ChunkTable | None:
    """Return the direct-read table of a chunked uint8 images dataset, or None if unsupported."""
    images = index.images()
    if images.chunks is None or images.dtype != np.uint8:
        return None
    if tuple(images.chunks[1:]) != tuple(images.shape[1:]):
        return None
    available = decompressors()
    codec: tuple[int, Decompressor] | None = None
    for position, (filter_id, values) in enumerate(images.filters):
        if filter_id == FILTER_SHUFFLE and (not values or values[0] == 1):
            continue
        if filter_id not in available or codec is not None:
            return None
        codec = (position, available[filter_id])
    step = int(images.chunks[0])
    count = -(-int(images.shape[0]) // step) if images.shape[0] else 0
    offsets = np.full(count, -1, dtype=np.int64)
    sizes = np.zeros(count, dtype=np.int64)
    masks = np.zeros(count, dtype=np.int64)
    stored = index.chunk_index()
    at = stored.positions[:, 0] // step if stored.positions.size else stored.offsets
    offsets[at], sizes[at], masks[at] = stored.offsets, stored.sizes, stored.masks
    return ChunkTable(
        offsets=offsets,
        sizes=sizes,
        masks=masks,
        codec=codec,
        chunk_nbytes=int(np.prod(images.chunks)),
    )


def contiguous_offset(index: PackIndex) -> int | None:
    """Return the file offset of a contiguous, unfiltered images dataset's data, or None."""
    images = index.images()
    return None if images.chunks is not None or images.filters else images.offset


def read_scratch(source: ByteSource, size: int, offset: int) -> np.ndarray:
    """Return ``size`` bytes of ``source`` at ``offset`` in this thread's reusable buffer."""
    scratch: np.ndarray | None = getattr(_local, "scratch", None)
    if scratch is None or scratch.size < size:
        scratch = _local.scratch = np.empty(
            max(size, 2 * (0 if scratch is None else scratch.size)), dtype=np.uint8
        )
    view = scratch[:size]
    source.read_into(view, offset)
    return view
