"""The bytes of one pack: ``ByteSource``, and ``LocalSource`` for a local file.

NOTE [ Byte sources ]

Everything that reads a pack's bytes outside HDF5 (the direct chunk path, the compact index,
the read-ahead file object that HDF5 reads old packs through) goes through a ``ByteSource``:
the local file of today (``LocalSource``: ``os.preadv``, the inode is its identity) or an
object in a bucket (``h5pack.core.s3.S3Source``: ranged GETs, its identity is its size and
ETag). A source comes from its store (``core.store.Store.source``: NOTE [ Stores ]).

The methods a source must have are the few a reader needs:

- ``size()`` and ``identity()``: what the source is, fixed when it was opened (a source
  refuses to read another object or file than the one it opened: ``SourceChangedError``);
- ``read_ranges(ranges)``: the bytes of several ``[start, end)`` ranges, one request each,
  issued concurrently where the backend can. This is the one place a read-ahead or a disk
  cache plugs in (issue 17 items 4-5): a wrapper with the same method;
- ``read_into(buffer, offset)``: one range into a caller's buffer (no copy where possible);
- ``read_tail(nbytes)``: the last ``nbytes`` (one request on S3, which needs no size first).

A source is picklable and opens its descriptor or client lazily once per process (a handle
never crosses ``fork``: NOTE [ h5py handles and fork ]).
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

    ``poll``, not ``select``: select refuses descriptors past 1023, which a long-lived
    process with many files open reaches.
    """
    poller = select.poll()
    poller.register(stream, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


class SourceChangedError(FormatError):
    """The object or file behind a source is not the one it opened (replaced meanwhile)."""


@dataclass(frozen=True)
class SourceIdentity:
    """What a source read: enough to tell that its path or URL now names something else.

    Attributes:
        size: Bytes.
        tag: The object's ETag or version (remote), or ``"device:inode:mtime_ns"`` (local).
    """

    size: int
    tag: str


class ByteSource(ABC):
    """The bytes of one pack: a local file or a remote object (NOTE [ Byte sources ]).

    Attributes:
        url: Its path or URL, for messages.
    """

    url: str

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
# (``LocalSource.mapped``, once per process) rather than preadv'd, and the crop path needs
# no copy at all (docs/decisions/0023-mapped-raw-reads.md); every view is checked with its
# digest before use, as every read is. The cost is a file truncated under a reader: a page
# past the new end raises SIGBUS. ``mapped`` compares the file's size with what the batch
# needs at every call, so a truncation before a batch is a short-read error as with preadv;
# only one while a batch is being cut remains a SIGBUS. A pack replaced by rename keeps the
# mapped inode alive and is refused at open (the inode check). Remote and compressed packs
# are not mapped.


class LocalSource(ByteSource):
    """A local file read with ``os.preadv``; a descriptor opened lazily once per process.

    ``preadv`` carries its own offset, so threads share the descriptor safely; after a fork
    the child opens its own. With an ``identity`` (``(st_dev, st_ino)`` of the file HDF5
    opened), a descriptor that names another file (the path was replaced meanwhile) is
    refused: the direct path never reads bytes of a file other than the metadata's.

    Raises:
        PackNotFoundError: (``open``) the file does not exist.
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
        """Return this process's descriptor.

        Raises:
            PackNotFoundError: the file does not exist.
            SourceChangedError: the path now names another file than ``inode``.
        """
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

        One mapping per process, made on first use. See ``NOTE [ Mapped raw reads ]``: the
        size is checked at every call, so a file that shrank below ``end`` is a short read
        (``OSError``) rather than a SIGBUS; views of the mapping must not be kept past the
        batch that asked for them.

        Raises:
            OSError: the file is shorter than ``end`` (truncated), or cannot be mapped.
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
