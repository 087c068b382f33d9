"""Opening a pack from a URL: its compact index in one or two GETs, else HDF5 over a file object.

``open_remote`` (``format.open_index`` of a URL, NOTE [ Compact index ]) returns a
``CompactIndex`` for a pack that ends with an index, else an ``HDF5Index`` over
``SourceFile`` (packs written before the index).
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

import h5py

from h5pack.core.description import HDF5Index, PackIndex
from h5pack.core.index import (
    FOOTER_BYTES,
    TAIL_BYTES,
    CompactIndex,
    UnknownIndexError,
    parse_footer,
)
from h5pack.core.source import ByteSource
from h5pack.errors import FormatError

# Blocks the file object reads HDF5's small scattered metadata reads in, and how many it keeps.
BLOCK_BYTES = 256 * 1024
BLOCKS_KEPT = 64


class SourceFile(io.RawIOBase):
    """A read-only, seekable file object over a byte source, for h5py's ``fileobj`` driver.

    HDF5's many small metadata reads become few block-sized ranged GETs; a read larger than
    a block is one GET of exactly its bytes. ``seed``: ``(offset, bytes)`` already read.
    """

    def __init__(self, source: ByteSource, seed: tuple[int, bytes | memoryview] | None = None):
        super().__init__()
        self.source = source
        self._size = source.size()
        self._pos = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._seed = (seed[0], bytes(seed[1])) if seed is not None else (self._size, b"")

    def readable(self) -> bool:  # noqa: D102
        return True

    def seekable(self) -> bool:  # noqa: D102
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` from ``whence``; return the position."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def _block(self, number: int) -> bytes:
        if number in self._blocks:
            self._blocks.move_to_end(number)
            return self._blocks[number]
        start = number * BLOCK_BYTES
        end = min(self._size, start + BLOCK_BYTES)
        seed_at, seed = self._seed
        if start >= seed_at:
            data = seed[start - seed_at : end - seed_at]
        else:
            data = bytes(self.source.read(start, min(end, seed_at))) + seed[: max(0, end - seed_at)]
        self._blocks[number] = data
        while len(self._blocks) > BLOCKS_KEPT:
            self._blocks.popitem(last=False)
        return data

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the position; return the bytes read (0 at the end)."""
        view = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(view))
        if end <= self._pos:
            return 0
        start = self._pos
        if end - start > BLOCK_BYTES and start < self._seed[0]:
            view[: end - start] = self.source.read(start, end)
        else:
            done = start
            while done < end:
                number = done // BLOCK_BYTES
                block = self._block(number)
                lo = done - number * BLOCK_BYTES
                take = min(end, (number + 1) * BLOCK_BYTES) - done
                view[done - start : done - start + take] = block[lo : lo + take]
                done += take
        self._pos = end
        return end - start


def open_remote(source: ByteSource, **kwargs: Any) -> PackIndex:
    """Describe the pack ``source``: its index (1-2 GETs), else HDF5 over a file object.

    ``kwargs`` go to ``h5py.File`` where HDF5 opens the pack; a damaged index or a file HDF5
    cannot read is ``FormatError``.
    """
    url = source.url
    tail, start = source.read_tail(TAIL_BYTES)
    size = source.size()
    seed = (start, tail)

    def opener() -> h5py.File:
        import hdf5plugin  # noqa: F401  (registers the LZ4/Zstd/Blosc/Bitshuffle filters)

        try:
            handle = h5py.File(SourceFile(source, seed), "r", **kwargs)
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            raise FormatError(f"{url} is not a readable HDF5 file ({err})") from err
        return handle

    footer = parse_footer(tail)
    if footer is None:
        return HDF5Index(opener(), url, source)
    main_end = footer.main_offset + footer.main_length
    if main_end + FOOTER_BYTES != size or footer.paths_offset + footer.paths_length > size:
        raise FormatError(f"{url}: its compact index's footer does not fit the object; damaged")
    if footer.main_offset >= start:
        main: bytes | memoryview = tail[footer.main_offset - start : main_end - start]
    else:
        main = bytes(source.read(footer.main_offset, start)) + bytes(tail[: main_end - start])
    paths = None
    if footer.paths_offset >= start:
        paths = tail[
            footer.paths_offset - start : footer.paths_offset - start + footer.paths_length
        ]
    try:
        return CompactIndex(source, footer, main, opener, paths)
    except UnknownIndexError:  # a newer writer's index: HDF5's own metadata, slower
        return HDF5Index(opener(), url, source)
