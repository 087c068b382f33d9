"""Where a pack's bytes come from: one small class per kind of storage, chosen by URL scheme.

NOTE [ Byte sources ]

Everything that reads a pack's bytes outside HDF5 (the direct chunk path, the compact index,
the read-ahead file object that HDF5 reads old packs through) goes through a ``ByteSource``:
the local file of today (``LocalSource``: ``os.preadv``, the inode is its identity) or an
object in a bucket (``h5pack.core.s3.S3Source``: ranged GETs, its identity is its size and
ETag). zarr v3's ``Store`` is the model: one abstract class, a few methods, one small class
per backend; a GCS, Azure or HTTP source is one more class registered in ``SCHEMES``.

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

import importlib
import mmap
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.errors import FormatError, H5PackError, PackNotFoundError

# scheme -> (module, class) of its source, imported on first use (the client is an extra)
SCHEMES: dict[str, tuple[str, str]] = {"s3": ("h5pack.core.s3", "S3Source")}
# The extra that brings each scheme's client.
EXTRAS: dict[str, str] = {"s3": "s3"}


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


def is_url(path: StrPath | str) -> bool:
    """Return whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    text = os.fspath(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1


def split_url(url: str) -> tuple[str, str, str]:
    """Return ``(scheme, bucket, key)`` of ``scheme://bucket/key``.

    Raises:
        FormatError: the URL names no bucket.
    """
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise FormatError(f"{url}: the URL names no bucket (expected {scheme}://BUCKET/KEY)")
    return scheme.lower(), bucket, key


def join_url(base: str, relative: str) -> str:
    """Return the URL of ``relative`` (``/``-separated) under the prefix ``base``."""
    return base.rstrip("/") + "/" + relative.lstrip("/")


def source_class(scheme: str) -> type[ByteSource]:
    """Return the source class of a URL scheme, importing its module.

    Raises:
        FormatError: no source reads this scheme.
        MissingExtraError: the scheme's client is not installed.
    """
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES))
        raise FormatError(f"h5pack reads {known} URLs and local paths, not {scheme}://")
    module_name, class_name = SCHEMES[scheme]
    module = importlib.import_module(module_name)
    found: type[ByteSource] = getattr(module, class_name)
    return found


def open_source(path: StrPath, *, storage_options: Mapping[str, Any] | None = None) -> ByteSource:
    """Return the byte source of a local path or a URL, checked to exist.

    Args:
        path: A local path, or a URL (``s3://bucket/key``).
        storage_options: Settings of the remote client beyond what the environment says
            (``h5pack.core.s3.S3Options`` for S3); ignored for local paths.

    Raises:
        PackNotFoundError: the file or object does not exist.
        FormatError: an unknown scheme, or a directory.
        MissingExtraError: the scheme's client is not installed.
        RemoteError: the object cannot be reached (credentials, network).
    """
    text = os.fspath(path)
    if not is_url(text):
        return LocalSource(text)
    scheme, _, _ = split_url(text)
    return source_class(scheme).open(text, storage_options or {})


class ByteSource(ABC):
    """The bytes of one pack: a local file or a remote object (NOTE [ Byte sources ]).

    Attributes:
        url: Its path or URL, for messages.
    """

    url: str

    @classmethod
    @abstractmethod
    def open(cls, url: str, storage_options: Mapping[str, Any]) -> ByteSource:
        """Return the source of ``url``, its identity taken now."""

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
# An uncompressed local pack's samples used to be copied into the batch with os.preadv:
# 40 us of CPU per 196 KB (256x256x3) image from the page cache, where a copy out of an
# mmap of the file costs 23-24 (bench_handoff.py --only kernels), and the crop path needs
# no copy at all, only the box. So LocalSource.mapped maps the file read-only once per
# process, PackReader.stored_views hands out views of the samples in it (checked with their
# XXH3 digest before use, as every read is), and read_into copies out of it. What this
# costs: a file truncated under a reader. preadv then returns a short read (an error);
# touching a mapped page past the new end raises SIGBUS, which kills the process. mapped
# compares the file's size with what the batch needs at every call, so a pack truncated
# before a batch gives the short-read error as before; only a truncation during the few
# milliseconds a batch is being cut remains a SIGBUS. Replacing a pack (a new file renamed
# over it, h5pack's own way of writing) leaves the mapped inode alive and is refused at open
# as before (the inode check). Remote and compressed packs are not mapped.


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

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any]) -> LocalSource:
        """Return the source of the local file ``url``."""
        return cls(url)

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
        self.__init__(state["path"], inode=state["inode"])  # type: ignore[misc]


class MissingExtraError(H5PackError, ImportError):
    """A URL's client library is not installed; the message names the extra to install."""


def missing_extra(scheme: str, err: ImportError) -> MissingExtraError:
    """Return the error for a ``scheme://`` URL read without its client installed."""
    extra = EXTRAS.get(scheme, scheme)
    return MissingExtraError(
        f"reading {scheme}:// URLs needs h5pack's {extra!r} extra: "
        f"pip install 'h5pack[{extra}]' ({err})"
    )
