"""Write the images dataset: blocks of whole chunks (``write.blocks``), in order, each once.

Compressed blocks arrive as stored chunks (``pipeline.compress_block``), written with
``write_direct_chunk``: no compressed chunk is written twice or in part.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import h5py
import numpy as np

from h5pack._types import StrPath
from h5pack.core.format import Storage
from h5pack.core.layout import Compression
from h5pack.write.blocks import Block

COPY_BYTES = 64 * 2**20  # copied at once between datasets (a staging file, a merge)
WRITE_THREADS = 2  # threads writing uncompressed chunks (NOTE [ Parallel chunk writes ])


def _pwrite_all(fd: int, data: memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less than asked)."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)
    return done


def _allocated_unfilled() -> dict[str, Any]:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    return {"dcpl": dcpl, "fill_time": "never"}


@dataclass(frozen=True)
class ImagesSpec:
    """How the images dataset is created (also the workers' in-memory one, ``compress_block``).

    ``blob_bytes``: a contiguous blob's length when known before writing (written in place).
    """

    storage: Storage
    sample_shape: tuple[int, int, int] | None
    chunks: tuple[int, ...] | None
    compression: Compression = field(default_factory=Compression)
    blob_bytes: int | None = None

    @property
    def compressed(self) -> bool:
        """Whether chunks pass through a filter."""
        return self.compression.codec != "none"

    def create(self, handle: h5py.File | h5py.Group, name: str, length: int) -> h5py.Dataset:
        """Create the dataset ``name`` with ``length`` rows (resizable when chunked)."""
        rest = self.sample_shape if self.storage == "array" else ()
        assert rest is not None  # array storage always has a sample shape
        shape = (length, *rest)
        if self.chunks is None:
            return handle.create_dataset(name, shape=shape, dtype=np.uint8)
        # NOTE [ Parallel chunk writes ]: uncompressed chunks get their file space when the
        # dataset grows, never filled by HDF5: ImagesWriter pwrites them in threads.
        extra = {} if self.compressed else _allocated_unfilled()
        return handle.create_dataset(
            name,
            shape=shape,
            maxshape=(None, *rest),
            chunks=self.chunks,
            dtype=np.uint8,
            **self.compression.h5py_kwargs(),
            **extra,
        )


class ImagesWriter:
    """Write blocks of the images dataset of an open pack, in order, each once.

    Chunked datasets grow block by block. A contiguous array is allocated for every
    sample (too long when some were skipped: ``needs_rebuild``). A contiguous blob of known
    length is written in place (skipped files leave unused bytes at its end), else, or when
    outgrown, staged in the side file ``staging`` and copied in at the end. A blob that
    fits one chunk gets a chunk of exactly its size.
    """

    def __init__(
        self,
        handle: h5py.File,
        name: str,
        spec: ImagesSpec,
        *,
        allocate: int = 0,
        staging: Path | None = None,
    ) -> None:
        self.handle = handle
        self.name = name
        self.spec = spec
        self.allocated = allocate
        self.staging = staging
        self._dataset: h5py.Dataset | None = None
        self._stage_file: IO[bytes] | None = None
        self._length = 0
        self._raw_fd: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._blob_offset: int | None = None  # file offset of a blob written in place
        if spec.chunks is None and spec.storage == "array":
            self._dataset = spec.create(handle, name, allocate)
        elif spec.chunks is None and staging is not None:
            if spec.blob_bytes:
                self._dataset = self._create_contiguous_blob(spec.blob_bytes)
                self._blob_offset = int(self._dataset.id.get_offset())
            else:
                self._stage_file = staging.open("wb")

    @property
    def needs_rebuild(self) -> bool:
        """Whether a contiguous array was allocated longer than what was written."""
        return (
            self.spec.chunks is None
            and self.spec.storage == "array"
            and (self._length < self.allocated)
        )

    def spec_for(self, block: Block) -> ImagesSpec:
        """Return the spec the block is written with, creating the dataset on first use."""
        if self._dataset is None and self.spec.chunks is not None:
            if self.spec.storage == "blob" and block.start == 0:
                self.spec = replace(self.spec, chunks=(min(self.spec.chunks[0], block.data.size),))
            self._dataset = self.spec.create(self.handle, self.name, 0)
        return self.spec

    def write_block(self, block: Block) -> None:
        """Write an uncompressed block."""
        self.spec_for(block)
        stop = block.start + len(block.data)
        if self._blob_offset is not None:
            assert self._dataset is not None
            if stop <= self._dataset.shape[0]:
                flat = memoryview(np.ascontiguousarray(block.data).data).cast("B")
                self._pwrite_split([(self._blob_offset + block.start, flat)])
                self._length = max(self._length, stop)
                return
            self._spill()
        if self._stage_file is not None:
            if self._stage_file.tell() != block.start:
                self._stage_file.seek(block.start)
            self._stage_file.write(np.ascontiguousarray(block.data).data)
        else:
            assert self._dataset is not None
            if self.spec.chunks is not None and self._dataset.shape[0] < stop:
                self._dataset.resize(stop, axis=0)
            if not self._write_whole_chunks(block):
                self._dataset[block.start : stop] = block.data
        self._length = max(self._length, stop)

    def _write_whole_chunks(self, block: Block) -> bool:
        """Pwrite a block starting on a chunk of whole samples to its chunks; False if not so.

        NOTE [ Parallel chunk writes ]; the last chunk is zero-padded, as HDF5 stores it.
        """
        chunks = self.spec.chunks
        dataset = self._dataset
        assert dataset is not None
        if chunks is None or self.spec.compressed or tuple(chunks[1:]) != dataset.shape[1:]:
            return False
        rows = chunks[0]
        if block.start % rows:
            return False
        data = np.ascontiguousarray(block.data)
        writes: list[tuple[int, memoryview]] = []
        for first in range(0, len(data), rows):
            piece = data[first : first + rows]
            if len(piece) < rows:
                padded = np.zeros((rows, *piece.shape[1:]), dtype=piece.dtype)
                padded[: len(piece)] = piece
                piece = padded
            coord = (block.start + first, *[0] * (data.ndim - 1))
            offset = dataset.id.get_chunk_info_by_coord(coord).byte_offset
            if offset is None:  # no file space allocated (not our dataset creation)
                dataset.id.write_direct_chunk(coord, piece)
                continue
            writes.append((offset, memoryview(piece.data).cast("B")))
        self._pwrite_split(writes)
        return True

    def _pwrite_split(self, writes: list[tuple[int, memoryview]]) -> None:
        """``os.pwrite`` each ``(file offset, bytes)``, each split across the write threads."""
        pieces: list[tuple[int, memoryview]] = []
        for offset, flat in writes:
            step = max(1, -(-len(flat) // WRITE_THREADS))
            pieces.extend((offset + lo, flat[lo : lo + step]) for lo in range(0, len(flat), step))
        if not pieces:
            return
        if self._raw_fd is None:
            self._raw_fd = os.open(self.handle.filename, os.O_WRONLY)
            self._pool = ThreadPoolExecutor(WRITE_THREADS)
        fd = self._raw_fd
        assert self._pool is not None
        list(self._pool.map(lambda item: _pwrite_all(fd, item[1], item[0]), pieces))

    def _create_contiguous_blob(self, length: int) -> h5py.Dataset:
        extra = _allocated_unfilled()  # its file space allocated now, never filled
        return self.handle.create_dataset(self.name, shape=(length,), dtype=np.uint8, **extra)

    def _spill(self) -> None:
        """Move a blob written in place that outgrew its length to the staging file."""
        assert self.staging is not None
        assert self._blob_offset is not None
        self.close_raw()
        self.staging.touch()
        _copy_range(self.handle.filename, self._blob_offset, self.staging, 0, self._length)
        del self.handle[self.name]
        self._dataset = None
        self._blob_offset = None
        self._stage_file = self.staging.open("r+b")
        self._stage_file.seek(self._length)

    def close_raw(self) -> None:
        """Close the descriptor and threads of the direct chunk writes, if any."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._raw_fd is not None:
            os.close(self._raw_fd)
            self._raw_fd = None

    def grow_to(self, stop: int) -> None:
        """Extend a chunked dataset to ``stop`` rows before its chunks are written directly."""
        assert self._dataset is not None  # spec_for() created it
        if self._dataset.shape[0] < stop:
            self._dataset.resize(stop, axis=0)
        self._length = max(self._length, stop)

    def write_chunk(self, offset: tuple[int, ...], data: Any, mask: int) -> None:
        """Write one stored (already filtered) chunk at ``offset``."""
        assert self._dataset is not None
        self._dataset.id.write_direct_chunk(offset, data, mask)

    def finish(self) -> None:
        """Complete the dataset (a staged blob is copied in by the kernel)."""
        self.close_raw()
        if self._stage_file is not None:
            assert self.staging is not None
            self._stage_file.close()
            self._stage_file = None
            dataset = self._create_contiguous_blob(self._length)
            if self._length:
                at = int(dataset.id.get_offset())
                _copy_range(self.staging, 0, self.handle.filename, at, self._length)
            self.staging.unlink()
        elif self._dataset is None:
            self._dataset = self.spec.create(self.handle, self.name, 0)

    def abort(self) -> None:
        """Close the direct writes and the staging file, and remove the latter, if any."""
        self.close_raw()
        if self._stage_file is not None:
            self._stage_file.close()
            self._stage_file = None
        if self.staging is not None and self.staging.exists():
            os.unlink(self.staging)


def _copy_range(source: StrPath, source_at: int, target: StrPath, at: int, length: int) -> None:
    """Copy ``length`` bytes from ``source_at`` in ``source`` to ``at`` in ``target``."""
    done = 0
    copy_file_range = getattr(os, "copy_file_range", None)  # Linux, Python >= 3.8
    with open(source, "rb", buffering=0) as src, open(target, "r+b", buffering=0) as out:
        while copy_file_range is not None and done < length:
            try:
                count = copy_file_range(
                    src.fileno(), out.fileno(), length - done, source_at + done, at + done
                )
            except OSError:  # not across these file systems: copy through a buffer
                break
            if count == 0:
                break
            done += count
        while done < length:
            piece = os.pread(src.fileno(), min(COPY_BYTES, length - done), source_at + done)
            if not piece:
                raise OSError(f"copy source ended {length - done} bytes early")
            done += _pwrite_all(out.fileno(), memoryview(piece), at + done)


def copy_array_rows(source: h5py.Dataset, target: h5py.Dataset, rows: int, *, at: int = 0) -> None:
    """Copy the first ``rows`` rows of ``source`` to rows ``at ..`` of ``target``, in ~64 MiB."""
    row_bytes = max(1, int(np.prod(source.shape[1:])) * source.dtype.itemsize)
    step = max(1, COPY_BYTES // row_bytes)
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        target[at + lo : at + hi] = source[lo:hi]
