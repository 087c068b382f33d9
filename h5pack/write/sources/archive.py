"""Archives of images, read in place (never extracted): the ``tar``, ``zip`` and ``imagenet`` kinds.

An archive holds what a folder would (``write.scan``'s rules); one made of the folder itself
(``tar -cf images.tar images/``) is read as that folder's content. Members whose path leaves
the archive, that are no regular file, that share their path with another member, or that
the archive's end cuts, are problems named by their path. A plain tar is listed in one pass
over its member headers; workers then read each image with one ``pread`` (or ranged GET).
A zip's central directory lists its members; a worker inflates a deflated one and checks
its CRC-32. ImageNet's train tar holds one uncompressed tar per class, named by its synset
(``n01440764.tar``): its images lie at offsets of the outer file, read as a plain tar's.
Classes are the synsets, sorted; a key is ``SYNSET/MEMBER``.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import tarfile
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from h5pack.core.format import SkippedFile
from h5pack.core.source import ByteSource
from h5pack.core.store import Store, open_store
from h5pack.errors import DecodeError, H5PackError, SourceError
from h5pack.write.scan import has_image_extension, is_ignored_name
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields
from h5pack.write.sources.folder import folder_listing
from h5pack.write.sources.objects import ObjectFile, is_tar_of_tars, located, member_range

CUT_SHORT = "cut short: the archive ends inside it"

Found = list[tuple[str, FileRange]]


class ArchiveSource(PathSource):
    """A source read from one archive file (or object)."""

    def files(self) -> tuple[Path, ...]:
        """Return the archive: the one local file the samples are read from."""
        return () if self.store.remote else (Path(self.root),)


@contextlib.contextmanager
def opened_archive(store: Store, root: str, what: str) -> Iterator[tuple[str, ByteSource]]:
    """Yield where the archive ``root`` is read from and its bytes (SourceError naming it)."""
    path = located(store, root)
    try:
        with contextlib.closing(store.source(path)) as source:
            yield path, source
    except (OSError, H5PackError, tarfile.TarError, zipfile.BadZipFile, struct.error) as err:
        raise SourceError(f"cannot read {what} {root}: {err}") from err


def image_member(name: str, problems: list[SkippedFile], not_file: str | None = None) -> str | None:
    """Return the relative path of member ``name`` if it is an image to read, else None.

    A path that leaves the archive, or a member that is no regular file (``not_file`` says
    what it is), is added to ``problems``.
    """
    pure = PurePosixPath(name)
    parts = [part for part in pure.parts if part != "."]
    if not parts or any(is_ignored_name(part) for part in parts):
        return None
    if not has_image_extension(parts[-1]):
        return None
    relative = "/".join(parts)
    if pure.is_absolute() or ".." in parts:
        problems.append(SkippedFile(relative, "a path that leaves the archive"))
    elif not_file is not None:
        problems.append(SkippedFile(relative, f"{not_file} in the archive, not an image file"))
    else:
        return relative
    return None


def _not_a_file(member: tarfile.TarInfo) -> str | None:
    if member.issparse():
        return "a sparse file"
    if member.issym() or member.islnk():
        return "a link"
    return None if member.isfile() else "a special file"


def take_tar_member(
    member: tarfile.TarInfo,
    where: FileRange,
    end: int,
    found: Found,
    problems: list[SkippedFile],
    prefix: str = "",
) -> None:
    """Add a tar member (its bytes at ``where``) to ``found``, to ``problems``, or to neither.

    A member beyond ``end`` is cut short; ``prefix`` goes before its path (an inner tar's).
    """
    if member.isdir():
        return
    relative = image_member(member.name, problems, _not_a_file(member))
    if relative is None:
        return
    if where.offset + max(where.size, 0) > end:
        problems.append(SkippedFile(prefix + relative, CUT_SHORT))
    else:
        found.append((prefix + relative, where))


def archive_listing(
    root: str, found: Found, problems: list[SkippedFile], whole: Sequence[SkippedFile] = ()
) -> Listing:
    """Return the listing of the images ``found`` in ``root``, labelled as a folder's.

    ``whole`` are problems of the archive itself (named by its file name, not a member).
    """
    counts = Counter(rel for rel, _ in found)
    twice = sorted(rel for rel, count in counts.items() if count > 1)
    if twice:  # appended again (tar -r): which one was meant cannot be told
        problems.extend(
            SkippedFile(rel, f"{counts[rel]} members of the archive have this path")
            for rel in twice
        )
        found = [item for item in found if counts[item[0]] == 1]
    return folder_listing(root, *_strip_top_folder(found, problems), whole)


def _strip_top_folder(found: Found, problems: list[SkippedFile]) -> tuple[Found, list[SkippedFile]]:
    """Drop the one folder that every path starts with (an archive made of a folder)."""
    paths = [rel for rel, _ in found] + [p.path for p in problems]
    tops = {rel.split("/", 1)[0] for rel in paths}
    if len(tops) != 1 or not all("/" in rel for rel in paths):
        return found, problems
    cut = len(tops.pop()) + 1
    return (
        [(rel[cut:], where) for rel, where in found],
        [SkippedFile(p.path[cut:], p.reason) for p in problems],
    )


def tar_members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Yield a tar's members, up to where a cut archive ends, holding none of them."""
    try:
        while (member := archive.next()) is not None:
            yield member
            del vars(archive)["members"][:-1]  # the last kept, not a million
    except tarfile.ReadError as err:
        if str(err) != "unexpected end of data":
            raise


def tar_walk(
    fileobj: io.RawIOBase, end: int, tails: list[SkippedFile], name: str
) -> Iterator[tarfile.TarInfo]:
    """Yield the members of the tar ``fileobj`` whose bytes end at ``end``.

    ``tarfile`` stops at a bad header as at the end: if something other than the end
    follows the last member, why goes to ``tails``, named ``name``.
    """
    with tarfile.open(fileobj=fileobj, mode="r:") as archive:
        yield from tar_members(archive)
        offset = archive.offset
        if offset + tarfile.BLOCKSIZE > end:
            return
        assert archive.fileobj is not None
        archive.fileobj.seek(offset)
        if archive.fileobj.read(tarfile.BLOCKSIZE).strip(b"\0"):
            members = archive.getmembers()  # loaded already: no second pass
            last = members[-1].name if members else "its start"
            reason = f"unreadable after {last}: a corrupt member header at byte {offset}"
            tails.append(SkippedFile(name, reason))


class TarSource(ArchiveSource):
    """The images of an uncompressed tar archive of an image folder (``tgz``: compressed)."""

    kind = "tar"
    suffixes = (".tar",)

    def find(self) -> Listing:
        """List the archive's images from its member headers (SourceError: none, unreadable)."""
        found: Found = []
        problems: list[SkippedFile] = []
        whole: list[SkippedFile] = []
        with opened_archive(self.store, self.root, "the tar archive") as (path, source):
            end = source.size()
            for member in tar_walk(ObjectFile(source), end, whole, Path(self.root).name):
                where = member_range(self.store, path, member.offset_data, member.size)
                take_tar_member(member, where, end, found, problems)
        return archive_listing(self.root, found, problems, whole)


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
    suffixes = (".zip",)

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


class ImageNetTarSource(ArchiveSource):
    """The images of a tar of per-class tars (ImageNet's train tar)."""

    kind = "imagenet"
    detect_first = True

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is a ``*.tar`` whose first file is a tar."""
        return TarSource.matches(path) and is_tar_of_tars(open_store(path), os.path.abspath(path))

    def find(self) -> Listing:
        """List every inner tar's images (SourceError: unreadable, or no images)."""
        found: dict[str, Found] = {}
        problems: list[SkippedFile] = []
        with opened_archive(self.store, self.root, "the tar of tars") as (path, source):
            end = source.size()
            for member in tar_walk(ObjectFile(source), end, problems, Path(self.root).name):
                name = PurePosixPath(member.name).name
                if not member.isfile() or not name.lower().endswith(".tar"):
                    if not member.isdir():
                        problems.append(SkippedFile(member.name, "not a class's tar"))
                    continue
                synset = name[: -len(".tar")]
                size = min(member.size, end - member.offset_data)
                inner = ObjectFile(source, member.offset_data, size)
                found[synset] = []
                tar_name = f"{synset}.tar"
                try:
                    for image in tar_walk(inner, inner.end - inner.start, problems, tar_name):
                        at = inner.start + image.offset_data
                        where = member_range(self.store, path, at, image.size)
                        limit = min(end, inner.end)
                        take_tar_member(image, where, limit, found[synset], problems, synset + "/")
                except tarfile.TarError as err:
                    problems.append(
                        SkippedFile(tar_name, f"a class tar that cannot be read: {err}")
                    )
        classes = tuple(sorted(synset for synset, images in found.items() if images))
        if not classes:
            raise SourceError(f"no images in the class tars of {self.root}")
        labels: list[int] = []
        samples: list[tuple[str, FileRange]] = []
        for label, synset in enumerate(classes):
            images = sorted(found[synset], key=lambda item: item[0])
            samples.extend(images)
            labels.extend([label] * len(images))
        fields = label_fields(labels)
        return Listing(
            [Sample(key, where, fields[i]) for i, (key, where) in enumerate(samples)],
            classes,
            tuple(sorted(problems, key=lambda p: p.path)),
        )
