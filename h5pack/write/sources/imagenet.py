"""ImageNet's train tar as a source: a tar of per-class tars, read in place.

``ILSVRC2012_img_train.tar`` holds one uncompressed tar per class, named by its synset
(``n01440764.tar``), of that class's images. Inner tars are uncompressed inside an
uncompressed tar, so each image's bytes lie at an absolute offset of the outer file: one
pass over the outer and inner member headers lists them as ``FileRange``s, and workers
read them with one ``pread`` each, at random (shuffling, ``--shards``, ``--dask``), as for a
plain tar. Classes are the synsets, sorted; a key is ``SYNSET/MEMBER``.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from h5pack.core.format import SkippedFile
from h5pack.errors import SourceError
from h5pack.write.sources.archive import Found, take_tar_member, tar_members, unread_tail
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


class ImageNetTarSource(PathSource):
    """The images of a tar of per-class tars (ImageNet's train tar)."""

    kind = "imagenet"
    detect_first = True

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is this kind of source: a ``*.tar`` whose first file is a tar."""
        if path.suffix.lower() != ".tar" or not path.is_file():
            return False
        try:
            with tarfile.open(path, "r:") as archive:
                first = archive.next()
                while first is not None and first.isdir():  # `tar -cf x.tar train/`
                    first = archive.next()
        except (OSError, tarfile.TarError):
            return False
        return first is not None and first.isfile() and first.name.lower().endswith(".tar")

    def find(self) -> Listing:
        """List every inner tar's images (see the module docstring).

        Raises:
            SourceError: The outer archive cannot be read, or holds no images.
        """
        path = os.path.abspath(self.root)
        found: dict[str, Found] = {}
        problems: list[SkippedFile] = []
        try:
            end = os.path.getsize(path)
            with tarfile.open(path, "r:") as archive, open(path, "rb") as raw:
                for member in tar_members(archive):
                    name = PurePosixPath(member.name).name
                    if not member.isfile() or not name.lower().endswith(".tar"):
                        if not member.isdir():
                            problems.append(SkippedFile(member.name, "not a class's tar"))
                        continue
                    synset = name[: -len(".tar")]
                    inner = _Window(
                        raw, member.offset_data, min(member.size, end - member.offset_data)
                    )
                    found[synset] = _inner_images(path, synset, inner, end, problems)
                tail = unread_tail(archive, end)
        except (OSError, tarfile.TarError) as err:
            raise SourceError(f"cannot read the tar of tars {self.root}: {err}") from err
        if tail:
            problems.append(SkippedFile(Path(self.root).name, tail))
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
            nbytes=sum(where.size for _, where in samples),
        )

    def files(self) -> tuple[Path, ...]:
        """Return the archive: the one local file the samples are read from."""
        return (Path(self.root),)


def _inner_images(
    path: str, synset: str, inner: _Window, end: int, problems: list[SkippedFile]
) -> Found:
    """Return the images of one class's tar (absolute ``FileRange``s of the outer file)."""
    found: Found = []
    try:
        with tarfile.open(fileobj=inner, mode="r:") as archive:
            for member in tar_members(archive):
                where = FileRange(path, inner.start + member.offset_data, member.size)
                take_tar_member(member, where, min(end, inner.end), found, problems, synset + "/")
            tail = unread_tail(archive, inner.end - inner.start)
    except tarfile.TarError as err:
        tail = f"a class tar that cannot be read: {err}"
    if tail:
        problems.append(SkippedFile(f"{synset}.tar", tail))
    return found


class _Window(io.RawIOBase):
    """``size`` bytes of an open file from ``start``: an inner tar, read as a file."""

    def __init__(self, raw: BinaryIO, start: int, size: int) -> None:
        self.raw, self.start, self.end, self.pos = raw, start, start + size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.end - self.start}
        self.pos = base[whence] + offset
        return self.pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        size = max(0, min(view.nbytes, self.end - self.start - self.pos))
        data = os.pread(self.raw.fileno(), size, self.start + self.pos)
        view[: len(data)] = data
        self.pos += len(data)
        return len(data)
