"""A gzip-compressed tar (``.tar.gz``, ``.tgz``) of an image folder, read as a stream.

NOTE [ Reading a gzip tar ]: gzip has no random access, so the archive is never read at
random nor extracted. Listing inflates it once, parsing the member headers and keeping a
copy of the inflater's state (``zlib``'s ``copy``) every ``_SPACING`` bytes of output, at
most ``_POINTS`` of them. The write order is a seeded random interleaving of ``RUNS``
consecutive runs of the archive, each read front to back by its own inflater started from
the checkpoint before it: the conversion inflates the archive once more, and every chunk
mixes samples of every run. Samples are ``GzipMember``s that this process reads in write
order (``ship``); a process that did not list the archive (a Dask worker, ``verify
--source``) makes its own checkpoints as it goes (decision 0051).
"""

from __future__ import annotations

import bisect
import io
import os
import sys
import tarfile
import threading
import zlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from h5pack.core.format import SkippedFile
from h5pack.core.source import ByteSource
from h5pack.core.store import Store
from h5pack.errors import DecodeError, H5PackError, SourceError
from h5pack.write.sources.archive import (
    CUT_SHORT,
    ArchiveSource,
    Found,
    archive_listing,
    take_tar_member,
    tar_members,
)
from h5pack.write.sources.base import FileRange, Listing, interleave
from h5pack.write.sources.objects import located

RUNS = 256  # runs of the archive that the write order interleaves
_READ = 1 << 14  # compressed bytes read at a time
_REMOTE_READ = 1 << 19  # from an object of a bucket: a ranged GET (NOTE [ Sources in a bucket ])
_OUT = 1 << 16  # the most uncompressed bytes one inflate call gives
_SPACING = 1 << 15  # uncompressed bytes between checkpoints, doubled when thinned
_POINTS = 1024  # the most checkpoints kept per archive (about 40 KiB each)
_CURSORS = RUNS + 16  # the most inflaters open per archive
_GZIP = 31  # zlib's wbits for a gzip header


@dataclass(frozen=True, slots=True)
class GzipMember(FileRange):
    """``size`` bytes at ``offset`` of the inflated stream of the gzip file ``path``."""

    in_parent: ClassVar[bool] = True

    def read(self) -> bytes:
        """Return the member's bytes (DecodeError: unreadable, corrupt or cut short)."""
        try:
            with _LOCK:  # one reader of the archive's inflaters at a time (Dask threads)
                return _archive(self.path, self.store).read(self.offset, self.size)
        except OSError as err:  # a bucket's errors too (RemoteError)
            raise DecodeError(f"{self.path}: cannot read: {err.strerror or err}") from err


@dataclass(frozen=True, slots=True)
class _Point:
    """Where inflating can resume: a state, its unread input, the file and output positions."""

    state: Any
    tail: bytes
    file_pos: int
    out_pos: int


class _Cursor:
    """One inflater moving forward: ``buffer[start:]``, its output not read yet, is at ``pos``."""

    def __init__(self, archive: _Archive, point: _Point) -> None:
        self.archive = archive
        self.file_pos, self.pos = point.file_pos, point.out_pos
        self.state, self.tail = point.state.copy(), point.tail
        self.buffer, self.start = b"", 0

    @property
    def end(self) -> int:
        """Where its inflated output ends."""
        return self.pos + len(self.buffer) - self.start

    def read(self, offset: int, size: int, *, exact: bool = True) -> bytes:
        """Return ``size`` bytes at ``offset`` (not before ``pos``); fewer only at the end.

        DecodeError when the archive is corrupt, or (``exact``) ends before their end.
        """
        pieces = []
        while self.pos < offset + size:
            if self.start == len(self.buffer) and not self._inflate():
                if exact:
                    raise DecodeError(
                        f"{self.archive.path}: cut short: the archive ends inside the member "
                        f"at {offset} of its inflated bytes"
                    )
                break
            skip = min(offset - self.pos, len(self.buffer) - self.start)
            take = 0 if skip > 0 else min(offset + size - self.pos, len(self.buffer) - self.start)
            if take:
                pieces.append(self.buffer[self.start : self.start + take])
            self.start += max(skip, 0) + take
            self.pos += max(skip, 0) + take
        return b"".join(pieces)

    def _inflate(self) -> bool:
        """Inflate more output into ``buffer``; return False at the end of the archive."""
        while True:
            if self.state.eof:  # one gzip member ends; another may follow (pigz, cat)
                rest = self.state.unused_data or self._read()
                if not rest.startswith(b"\x1f\x8b"):
                    return False  # the end, or padding after it
                self.state, self.tail = zlib.decompressobj(_GZIP), rest
            data = self.tail or self._read()
            if not data:
                return False
            try:
                out = self.state.decompress(data, _OUT)
            except zlib.error as err:
                raise DecodeError(f"{self.archive.path}: corrupt gzip data: {err}") from err
            self.tail = self.state.unconsumed_tail
            if out:
                self.buffer, self.start = out, 0
                self.archive.passed(self)
                return True

    def _read(self) -> bytes:
        data = self.archive.pread(self.file_pos)
        self.file_pos += len(data)
        return data

    def point(self) -> _Point:
        """Return where this inflater stands (after its buffer), to resume from later."""
        return _Point(self.state.copy(), self.tail, self.file_pos, self.end)


class _Archive:
    """The checkpoints and open inflaters of one gzip file, in this process."""

    fd = -1  # what ``close`` finds when opening failed
    source: ByteSource | None = None

    def __init__(self, path: str, store: Store | None) -> None:
        self.path = path
        self.points = [_Point(zlib.decompressobj(_GZIP), b"", 0, 0)]
        self.starts = [0]  # each point's out_pos, for bisect
        self.spacing = _SPACING
        self.cursors: list[_Cursor] = []
        self.source = store.source(path) if store is not None else None  # an object's
        self.fd = os.open(path, os.O_RDONLY) if store is None else -1

    def pread(self, pos: int) -> bytes:
        """Return compressed bytes at ``pos`` (empty at the end)."""
        if self.source is None:
            return os.pread(self.fd, _READ, pos)
        size = self.source.size()
        return bytes(self.source.read(pos, min(size, pos + _REMOTE_READ))) if pos < size else b""

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.source is not None:
            self.source.close()

    __del__ = close

    def read(self, offset: int, size: int, *, exact: bool = True) -> bytes:
        """Return ``size`` inflated bytes at ``offset`` from the nearest inflater or point."""
        point = self.points[bisect.bisect_right(self.starts, offset) - 1]
        behind = [c for c in self.cursors if point.out_pos <= c.pos <= offset]
        cursor = max(behind, key=lambda c: c.pos) if behind else self.open(point)
        self.cursors.remove(cursor)
        self.cursors.append(cursor)  # the most recently used last
        return cursor.read(offset, size, exact=exact)

    def open(self, point: _Point) -> _Cursor:
        """Return a new inflater at ``point``, dropping the least recently used past the cap."""
        cursor = _Cursor(self, point)
        self.cursors.append(cursor)
        if len(self.cursors) > _CURSORS:
            self.cursors.pop(0)
        return cursor

    def passed(self, cursor: _Cursor) -> None:
        """Keep a checkpoint where ``cursor`` is, if it went a spacing past the last one."""
        if cursor.end < self.points[-1].out_pos + self.spacing:
            return
        self.points.append(cursor.point())
        if len(self.points) > _POINTS:
            self.points = self.points[::2]
            self.spacing *= 2
        self.starts = [p.out_pos for p in self.points]


_ARCHIVES: dict[str, _Archive] = {}
_LOCK = threading.Lock()


def _archive(path: str, store: Store | None, *, new: bool = False) -> _Archive:
    """Return this process's reader of the gzip file ``path`` (a fresh one if ``new``)."""
    found = _ARCHIVES.pop(path, None)
    if found is not None and new:
        found.close()
        found = None
    _ARCHIVES[path] = found or _Archive(path, store)
    while len(_ARCHIVES) > 4:  # the least recently used first
        _ARCHIVES.pop(next(iter(_ARCHIVES))).close()
    return _ARCHIVES[path]


class _Inflated(io.RawIOBase):
    """The inflated archive as a file that seeks forward only: member data is skipped."""

    def __init__(self, archive: _Archive) -> None:
        self.cursor = archive.open(archive.points[0])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.cursor.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET or offset < self.cursor.pos:
            raise io.UnsupportedOperation("a gzip stream seeks forward only")
        self.cursor.read(offset, 0, exact=False)
        return self.cursor.pos

    def readinto(self, buffer: Any) -> int:
        data = self.cursor.read(self.cursor.pos, len(buffer), exact=False)
        buffer[: len(data)] = data
        return len(data)


class GzipTarSource(ArchiveSource):
    """The images of a gzip-compressed tar of an image folder (NOTE [ Reading a gzip tar ])."""

    kind = "tgz"
    suffixes = (".tar.gz", ".tgz")

    def find(self) -> Listing:
        """Inflate the archive once, listing its images in archive order (SourceError)."""
        path = located(self.store, self.root)
        store = self.store if self.store.remote else None
        found: Found = []
        problems: list[SkippedFile] = []
        whole: list[SkippedFile] = []
        try:
            stream = _Inflated(_archive(path, store, new=True))  # the archive may have changed
            with tarfile.open(fileobj=stream, mode="r:") as archive:
                for member in tar_members(archive):
                    where = GzipMember(path, member.offset_data, member.size, store)
                    take_tar_member(member, where, sys.maxsize, found, problems)
            # tarfile ends at a bad header as at the end: what lies there?
            block = stream.cursor.archive.read(archive.offset, tarfile.BLOCKSIZE, exact=False)
            if block.strip(b"\0"):
                raise tarfile.HeaderError(f"a corrupt member header at byte {archive.offset}")
            stream.cursor.read(sys.maxsize, 0, exact=False)  # to the end: is the gzip whole?
            if not stream.cursor.state.eof:
                raise DecodeError("cut short: the gzip stream ends before its trailer")
        except (OSError, H5PackError, tarfile.TarError, DecodeError) as err:
            if not found:
                raise SourceError(f"cannot read the gzip tar archive {self.root}: {err}") from err
            whole.append(
                SkippedFile(Path(self.root).name, f"unreadable after {found[-1][0]}: {err}")
            )
        end = stream.cursor.end  # all that inflates
        problems.extend(SkippedFile(rel, CUT_SHORT) for rel, w in found if w.offset + w.size > end)
        found = [(rel, where) for rel, where in found if where.offset + where.size <= end]
        listing = archive_listing(self.root, found, problems, whole)
        offset = {id(where): where.offset for _, where in found}
        samples = sorted(listing.samples, key=lambda sample: offset[id(sample.image)])
        return replace(listing, samples=samples)

    def write_order(self, seed: int, shuffle: bool) -> np.ndarray:
        """Return the interleaved runs' order (NOTE [ Reading a gzip tar ])."""
        return interleaved(len(self.samples), seed, shuffle)


@lru_cache(maxsize=2)
def interleaved(num: int, seed: int, shuffle: bool) -> np.ndarray:
    """Return a seeded random interleaving of ``RUNS`` consecutive runs of ``0..num-1``."""
    if not shuffle:
        return np.arange(num, dtype=np.int64)
    return interleave(np.ones(num, dtype=np.int64), RUNS, seed)
