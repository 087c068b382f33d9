"""A ``.tar`` of an image folder as a source, read in place: never extracted.

The archive holds what a folder would (``write.scan``'s rules: ImageFolder classes from the
first folder of each path, or a flat folder); an archive made of the folder itself
(``tar -cf images.tar images/``), whose every path starts with one folder, is read as
that folder's content. One pass over the member headers (``tarfile`` seeks past the
data) lists the images with the offset and size of their bytes; workers then read each
image with one ``pread``, in any order, so shuffling, ``--shards`` and ``--dask`` work as
for a folder. Members that are links, special or sparse files, that share their path with
another member, or whose path leaves the archive, are problems named by their path.
Compressed archives (``.tar.gz``) cannot be read in place and are not taken.
"""

from __future__ import annotations

import os
import tarfile
from collections import Counter
from pathlib import Path, PurePosixPath

from h5pack.core.format import SkippedFile
from h5pack.errors import SourceError
from h5pack.write.scan import label_by_folder
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields
from h5pack.write.walk import has_image_extension, is_ignored_name


class TarSource(PathSource):
    """The images of an uncompressed tar archive of an image folder."""

    kind = "tar"

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is this kind of source: a file named ``*.tar``."""
        return path.suffix.lower() == ".tar" and path.is_file()

    def find(self) -> Listing:
        """List the archive's images from its member headers (see the module docstring).

        Raises:
            SourceError: The archive cannot be read, is compressed, or holds no images.
        """
        path = os.path.abspath(self.root)
        found: list[tuple[str, FileRange]] = []
        problems: list[SkippedFile] = []
        try:
            with tarfile.open(path, "r:") as archive:
                for member in archive:
                    self._take(member, path, found, problems)
        except (OSError, tarfile.TarError) as err:
            raise SourceError(f"cannot read the tar archive {self.root}: {err}") from err
        counts = Counter(rel for rel, _ in found)
        twice = sorted(rel for rel, count in counts.items() if count > 1)
        if twice:  # appended again (tar -r): which one was meant cannot be told
            problems.extend(
                SkippedFile(rel, f"{counts[rel]} members of the archive have this path")
                for rel in twice
            )
            found = [item for item in found if counts[item[0]] == 1]
        found, problems = _strip_top_folder(found, problems)
        found_labels, classes = label_by_folder(self.root, found, problems, "auto")
        fields = label_fields([label for _, _, label in found_labels])
        samples = [Sample(rel, where, fields[i]) for i, (rel, where, _) in enumerate(found_labels)]
        total = sum(where.size for _, where, _ in found_labels)
        return Listing(samples, classes, tuple(problems), nbytes=total)

    def files(self) -> tuple[Path, ...]:
        """Return the archive: the one local file the samples are read from."""
        return (Path(self.root),)

    @staticmethod
    def _take(
        member: tarfile.TarInfo,
        path: str,
        found: list[tuple[str, FileRange]],
        problems: list[SkippedFile],
    ) -> None:
        """Add ``member`` to the images ``found``, to the ``problems``, or to neither."""
        pure = PurePosixPath(member.name)
        parts = [part for part in pure.parts if part != "."]
        if member.isdir() or not parts or any(is_ignored_name(part) for part in parts):
            return
        if not has_image_extension(parts[-1]):
            return
        relative = "/".join(parts)
        if pure.is_absolute() or ".." in parts:
            problems.append(SkippedFile(relative, "a path that leaves the archive"))
        elif not member.isfile() or member.issparse():
            kind = "a link" if member.issym() or member.islnk() else "a special file"
            kind = "a sparse file" if member.issparse() else kind
            problems.append(SkippedFile(relative, f"{kind} in the archive, not an image file"))
        else:
            found.append((relative, FileRange(path, member.offset_data, member.size)))


def _strip_top_folder(
    found: list[tuple[str, FileRange]], problems: list[SkippedFile]
) -> tuple[list[tuple[str, FileRange]], list[SkippedFile]]:
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
