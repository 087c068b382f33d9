"""A ``.zip`` of an image folder as a source, read in place: never extracted.

The central directory lists the members; each image's local header gives where its bytes
start, so a worker reads a member at random with one ``pread`` or ranged GET (inflating it
when it is deflated) and checks its CRC-32. What the archive may hold: ``sources.archive``.
"""

from __future__ import annotations

import contextlib
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from h5pack.core.format import SkippedFile
from h5pack.core.store import Store
from h5pack.errors import DecodeError, H5PackError, SourceError
from h5pack.write.sources.archive import CUT_SHORT, Found, archive_listing, image_member
from h5pack.write.sources.base import FileRange, Listing, PathSource
from h5pack.write.sources.objects import ObjectFile, located

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name and extra lengths
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


@dataclass(frozen=True, slots=True)
class ZipMember(FileRange):
    """A zip member's ``size`` stored bytes at ``offset``: ``length`` bytes once inflated."""

    length: int = 0
    crc: int = 0
    deflated: bool = False

    def read(self) -> bytes:
        """Return the member's bytes, inflated and checked against its CRC-32.

        Raises:
            DecodeError: They cannot be read, do not inflate, or fail the check.
        """
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


class ZipSource(PathSource):
    """The images of a zip archive of an image folder."""

    kind = "zip"

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is this kind of source: a file named ``*.zip``."""
        return path.suffix.lower() == ".zip" and path.is_file()

    def find(self) -> Listing:
        """List the archive's images from its central directory and local headers.

        Raises:
            SourceError: The archive cannot be read or holds no images.
        """
        path = located(self.store, self.root)
        found: Found = []
        problems: list[SkippedFile] = []
        try:
            with contextlib.closing(self.store.source(path)) as source:
                end = source.size()
                with zipfile.ZipFile(ObjectFile(source, readahead=0)) as archive:
                    raw = ObjectFile(source)  # the local headers, read ahead in their order
                    infos = sorted(archive.infolist(), key=lambda info: info.header_offset)
                    for info in infos:
                        self._take(info, raw, self.store, path, end, found, problems)
        except (OSError, H5PackError, zipfile.BadZipFile, struct.error) as err:
            raise SourceError(f"cannot read the zip archive {self.root}: {err}") from err
        return archive_listing(self.root, found, problems)

    def files(self) -> tuple[Path, ...]:
        """Return the archive: the one local file the samples are read from."""
        return () if self.store.remote else (Path(self.root),)

    @staticmethod
    def _take(
        info: zipfile.ZipInfo,
        raw: ObjectFile,
        store: Store,
        path: str,
        end: int,
        found: Found,
        problems: list[SkippedFile],
    ) -> None:
        """Add ``info`` to the images ``found``, to the ``problems``, or to neither."""
        if info.is_dir():
            return
        relative = image_member(info.filename, problems)
        if relative is None:
            return
        header = bytes(raw.pread(info.header_offset, _LOCAL_HEADER.size))
        if len(header) < _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
            problems.append(SkippedFile(relative, "its local header is missing or corrupt"))
            return
        name_length, extra_length = _LOCAL_HEADER.unpack(header)[1:]
        offset = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        if info.flag_bits & 1:
            problems.append(SkippedFile(relative, "encrypted in the archive"))
        elif info.compress_type not in _METHODS:
            problems.append(
                SkippedFile(relative, f"compressed with zip method {info.compress_type}")
            )
        elif offset + info.compress_size > end:
            problems.append(SkippedFile(relative, CUT_SHORT))
        else:
            deflated = info.compress_type == zipfile.ZIP_DEFLATED
            member = ZipMember(
                path,
                offset,
                info.compress_size,
                store if store.remote else None,
                length=info.file_size,
                crc=info.CRC,
                deflated=deflated,
            )
            found.append((relative, member))
