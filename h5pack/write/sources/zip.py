"""A ``.zip`` of an image folder as a source, read in place: never extracted.

The central directory lists the members; each one's local header gives where its bytes
start, so a worker reads a member at random with one ``pread`` or ranged GET (inflating it
when deflated) and checks its CRC-32. What the archive may hold: ``sources.archive``.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from h5pack.core.format import SkippedFile
from h5pack.errors import DecodeError
from h5pack.write.sources.archive import (
    CUT_SHORT,
    ArchiveSource,
    Found,
    archive_listing,
    image_member,
    opened_archive,
)
from h5pack.write.sources.base import FileRange, Listing
from h5pack.write.sources.objects import ObjectFile

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name and extra lengths
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


@dataclass(frozen=True, slots=True)
class ZipMember(FileRange):
    """A zip member's ``size`` stored bytes at ``offset``: ``length`` bytes once inflated."""

    length: int = 0
    crc: int = 0
    deflated: bool = False

    def read(self) -> bytes:
        """Return the member's bytes, inflated and checked against its CRC-32 (DecodeError)."""
        data = FileRange.read(self)
        try:
            if self.deflated:
                data = zlib.decompressobj(-15).decompress(data, self.length)
        except zlib.error as err:
            raise DecodeError(f"{self.path}: a corrupt member: {err}") from err
        if len(data) != self.length or zlib.crc32(data) != self.crc:
            raise DecodeError(f"{self.path}: a corrupt member: its CRC-32 does not match")
        return data

    def nbytes(self) -> int:
        """Return the member's size once inflated."""
        return self.length


class ZipSource(ArchiveSource):
    """The images of a zip archive of an image folder."""

    kind = "zip"

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is a file named ``*.zip``."""
        return path.suffix.lower() == ".zip" and path.is_file()

    def find(self) -> Listing:
        """List the images from the central directory (SourceError: unreadable, no images)."""
        found: Found = []
        problems: list[SkippedFile] = []
        with opened_archive(self.store, self.root, "the zip archive") as (path, source):
            end = source.size()
            with zipfile.ZipFile(ObjectFile(source, readahead=0)) as archive:
                raw = ObjectFile(source)  # the local headers, read ahead in their order
                for info in sorted(archive.infolist(), key=lambda info: info.header_offset):
                    relative = None if info.is_dir() else image_member(info.filename, problems)
                    if relative is None:
                        continue
                    header = bytes(raw.pread(info.header_offset, _LOCAL_HEADER.size))
                    if len(header) < _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
                        reason = "its local header is missing or corrupt"
                    elif info.flag_bits & 1:
                        reason = "encrypted in the archive"
                    elif info.compress_type not in _METHODS:
                        reason = f"compressed with zip method {info.compress_type}"
                    else:
                        name_length, extra_length = _LOCAL_HEADER.unpack(header)[1:]
                        offset = info.header_offset + _LOCAL_HEADER.size
                        offset += name_length + extra_length
                        reason = CUT_SHORT if offset + info.compress_size > end else ""
                    if reason:
                        problems.append(SkippedFile(relative, reason))
                        continue
                    member = ZipMember(
                        path,
                        offset,
                        info.compress_size,
                        self.store if self.store.remote else None,
                        length=info.file_size,
                        crc=info.CRC,
                        deflated=info.compress_type == zipfile.ZIP_DEFLATED,
                    )
                    found.append((relative, member))
        return archive_listing(self.root, found, problems)
