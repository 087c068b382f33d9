"""ImageNet's train tar as a source: a tar of per-class tars, read in place.

``ILSVRC2012_img_train.tar`` holds one uncompressed tar per class, named by its synset
(``n01440764.tar``), of that class's images. Inner tars are uncompressed inside an
uncompressed tar, so each image's bytes lie at an absolute offset of the outer file: one
pass over the outer and inner member headers lists them as ``FileRange``s, and workers
read them with one ``pread`` (in a bucket, a ranged GET) each, at random (shuffling,
``--shards``, ``--dask``), as for a plain tar. Classes are the synsets, sorted; a key is
``SYNSET/MEMBER``.
"""

from __future__ import annotations

import contextlib
import tarfile
from pathlib import Path, PurePosixPath

from h5pack.core.format import SkippedFile
from h5pack.core.store import Store
from h5pack.errors import H5PackError, SourceError
from h5pack.write.sources.archive import Found, take_tar_member, tar_members, unread_tail
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields
from h5pack.write.sources.objects import ObjectFile, located, member_range


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
        path = located(self.store, self.root)
        found: dict[str, Found] = {}
        problems: list[SkippedFile] = []
        try:
            with contextlib.closing(self.store.source(path)) as source:
                end = source.size()
                with tarfile.open(fileobj=ObjectFile(source), mode="r:") as archive:
                    for member in tar_members(archive):
                        name = PurePosixPath(member.name).name
                        if not member.isfile() or not name.lower().endswith(".tar"):
                            if not member.isdir():
                                problems.append(SkippedFile(member.name, "not a class's tar"))
                            continue
                        synset = name[: -len(".tar")]
                        size = min(member.size, end - member.offset_data)
                        inner = ObjectFile(source, member.offset_data, size)
                        found[synset] = _inner_images(
                            self.store, path, synset, inner, end, problems
                        )
                    tail = unread_tail(archive, end)
        except (OSError, H5PackError, tarfile.TarError) as err:
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
        return () if self.store.remote else (Path(self.root),)


def _inner_images(
    store: Store, path: str, synset: str, inner: ObjectFile, end: int, problems: list[SkippedFile]
) -> Found:
    """Return the images of one class's tar (absolute ranges of the outer file)."""
    found: Found = []
    try:
        with tarfile.open(fileobj=inner, mode="r:") as archive:
            for member in tar_members(archive):
                where = member_range(store, path, inner.start + member.offset_data, member.size)
                take_tar_member(member, where, min(end, inner.end), found, problems, synset + "/")
            tail = unread_tail(archive, inner.end - inner.start)
    except tarfile.TarError as err:
        tail = f"a class tar that cannot be read: {err}"
    if tail:
        problems.append(SkippedFile(f"{synset}.tar", tail))
    return found
