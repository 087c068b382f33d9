"""ImageNet's train tar as a source: a tar of per-class tars, read in place.

``ILSVRC2012_img_train.tar`` holds one uncompressed tar per class, named by its synset
(``n01440764.tar``). Each image's bytes lie at an absolute offset of the outer file, so one
pass over the outer and inner headers lists them, and workers read them at random as for a
plain tar. Classes are the synsets, sorted; a key is ``SYNSET/MEMBER``.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath

from h5pack.core.format import SkippedFile
from h5pack.core.store import open_store
from h5pack.errors import SourceError
from h5pack.write.sources.archive import (
    ArchiveSource,
    Found,
    opened_archive,
    take_tar_member,
    tar_walk,
)
from h5pack.write.sources.base import FileRange, Listing, Sample, label_fields
from h5pack.write.sources.objects import ObjectFile, is_tar_of_tars, member_range


class ImageNetTarSource(ArchiveSource):
    """The images of a tar of per-class tars (ImageNet's train tar)."""

    kind = "imagenet"
    detect_first = True

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is a ``*.tar`` whose first file is a tar."""
        if path.suffix.lower() != ".tar" or not path.is_file():
            return False
        return is_tar_of_tars(open_store(path), os.path.abspath(path))

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
