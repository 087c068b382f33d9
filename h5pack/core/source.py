"""The bytes of one pack: ``ByteSource``, and ``LocalSource`` for a local file.

NOTE [ Byte sources ]

Everything that reads a pack's bytes outside HDF5 (the direct chunk path, the compact index,
the file object HDF5 reads remote packs through) goes through a ``ByteSource``: a local
file (``LocalSource``: ``os.preadv``, its inode its identity) or a remote object
(``core.ranged.RangedSource``: ranged GETs, its ETag its identity), given by its store
(NOTE [ Stores ]). A source is fixed to what it opened (``identity``; another object or
file under its name is ``SourceChangedError``), reads several ranges at once where its
backend can (``read_ranges``: where read-ahead and the disk cache plug in, as wrappers), is
picklable, and opens its descriptor or client lazily once per process (a handle never
crosses ``fork``: NOTE [ h5py handles and fork ]).
"""

from __future__ import annotations

import mmap
import os
import select
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack.errors import FormatError, PackNotFoundError


def readable(stream: Any, timeout_s: float = 0.0) -> bool:
    """Return whether ``stream`` (a socket, a pipe) has something to read, or its end.

    ``poll``: ``select`` refuses descriptors past 1023, which a long-lived process reaches.
    """
    poller = select.poll()
    poller.register(stream, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


class SourceChangedError(FormatError):
    """The object or file behind a source is not the one it opened (replaced meanwhile)."""


@dataclass(frozen=True)
class SourceIdentity:
    """What a source read: its size, and its ETag or version (``device:inode:mtime_ns``)."""

    size: int
    tag: str


class ByteSource(ABC):
    """The bytes of one pack: a local file or a remote object (NOTE [ Byte sources ])."""

    url: str  # its path or URL, for messages

    @abstractmethod
    def size(self) -> int:
        """Return the source's size in bytes (as opened)."""

    @abstractmethod
    def identity(self) -> SourceIdentity:
        """Return what the source opened (size and ETag, or inode)."""

    @property
    def remote(self) -> bool:
        """Whether reads cross a network (each request has a latency worth saving)."""
        return False

    @abstractmethod
    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Return the bytes of each ``[start, end)`` range, one request each.

        Raises:
            SourceChangedError: the object or file was replaced since it was opened.
            OSError: the bytes cannot be read (a remote source: after its retries).
        """

    def read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill the contiguous uint8 ``buffer`` with the bytes at ``offset``."""
        (data,) = self.read_ranges([(offset, offset + buffer.nbytes)])
        buffer.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)

    def read(self, start: int, end: int) -> memoryview:
        """Return the bytes ``[start, end)``."""
        return self.read_ranges([(start, end)])[0]

    def read_all(self) -> bytes:
        """Return every byte (a small object: a manifest)."""
        return bytes(self.read(0, self.size()))

    def read_tail(self, nbytes: int) -> tuple[memoryview, int]:
        """Return the last ``nbytes`` bytes (all of a smaller source) and their offset."""
        start = max(0, self.size() - nbytes)
        return self.read(start, self.size()), start

    def close(self) -> None:  # noqa: B027  (most sources hold nothing)
        """Release what this process holds open."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# NOTE [ Mapped raw reads ]
# An uncompressed local pack's samples are copied out of a read-only mapping of the file
# (``LocalSource.mapped``, once per process), and the crop path needs no copy at all
# (docs/decisions/0023-mapped-raw-reads.md); every view is checked with its digest, as
# every read is. A file truncated under a reader would raise SIGBUS: ``mapped`` checks the
# size a batch needs at every call, so only a truncation while a batch is cut remains one.
# A pack replaced by rename keeps the mapped inode and is refused at open.


class LocalSource(ByteSource):
    """A local file read with ``os.preadv`` (threads share its descriptor, one per process).

    With an ``inode`` (``(st_dev, st_ino)`` of the file HDF5 opened), a descriptor of
    another file (the path replaced meanwhile) is refused: the direct path never reads bytes
    of a file other than the metadata's.
    """

    def __init__(self, path: str, *, inode: tuple[int, int] | None = None) -> None:
        self.url = self.path = path
        self.inode = inode
        self._fd: int | None = None
        self._pid = -1
        self._size: int | None = None
        self._lock = threading.Lock()
        self._map: np.ndarray | None = None  # this process's read-only mapping of the file
        self._map_pid = -1

    def fd(self) -> int:
        """Return this process's descriptor (``PackNotFoundError``, ``SourceChangedError``)."""
        if self._fd is None or self._pid != os.getpid():
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError as err:
                raise PackNotFoundError(f"{self.path}: no such pack") from err
            stat = os.fstat(fd)
            if self.inode is not None and (stat.st_dev, stat.st_ino) != self.inode:
                os.close(fd)
                raise SourceChangedError(
                    f"{self.path} was replaced since the dataset was created (file "
                    f"{self.inode[0]}:{self.inode[1]} then, {stat.st_dev}:"
                    f"{stat.st_ino} now); rebuild the loader"
                )
            self.inode = (stat.st_dev, stat.st_ino)
            self._size = stat.st_size
            self._fd = fd
            self._pid = os.getpid()
        return self._fd

    def size(self) -> int:
        """Return the file's size (as opened)."""
        self.fd()
        assert self._size is not None  # set by fd()
        return self._size

    def identity(self) -> SourceIdentity:
        """Return ``device:inode:mtime_ns`` and the size of the opened file."""
        stat = os.fstat(self.fd())
        return SourceIdentity(stat.st_size, f"{stat.st_dev}:{stat.st_ino}:{stat.st_mtime_ns}")

    def read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill the contiguous uint8 ``buffer`` from ``offset`` (no copy)."""
        view = buffer.data.cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self.fd(), [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{self.path}: short read at byte {offset + done}")
            done += got

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Return the bytes of each range, read in turn (the page cache needs no overlap)."""
        found = []
        for start, end in ranges:
            buffer = np.empty(end - start, dtype=np.uint8)
            self.read_into(buffer, start)
            found.append(buffer.data.cast("B"))
        return found

    def mapped(self, end: int) -> np.ndarray:
        """Return the file's bytes up to at least ``end``, mapped read-only (no copy).

        NOTE [ Mapped raw reads ]: a file shorter than ``end`` is ``OSError`` (a short
        read); views must not be kept past the batch that asked for them.
        """
        fd = self.fd()
        size = os.fstat(fd).st_size
        if size < end:
            raise OSError(f"{self.path}: short read: the file is {size} bytes, needs {end}")
        found = self._map
        if found is None or self._map_pid != os.getpid() or found.size < end:
            with self._lock:
                found = np.frombuffer(mmap.mmap(fd, size, prot=mmap.PROT_READ), dtype=np.uint8)
                self._map, self._map_pid = found, os.getpid()
        return found

    def close(self) -> None:
        """Close the descriptor (if this process opened it) and drop the mapping."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None
        self._map = None  # unmapped when the last view of it goes

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "path": self.path, "inode": self.inode}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["path"], inode=state["inode"])
