"""A ``.tar`` of an image folder as a source, read in place: never extracted.

One pass over the member headers (``tarfile`` seeks past the data) lists the images with
the offset and size of their bytes; workers then read each image with one ``pread``, in any
order, so shuffling, ``--shards`` and ``--dask`` work as for a folder. What the archive may
hold, and which members are problems: ``sources.archive``. Compressed archives are the
``tgz`` kind (``sources.tgz``).
"""

from __future__ import annotations

import contextlib
import tarfile
from pathlib import Path

from h5pack.core.format import SkippedFile
from h5pack.errors import H5PackError, SourceError
from h5pack.write.sources.archive import (
    Found,
    archive_listing,
    take_tar_member,
    tar_members,
    unread_tail,
)
from h5pack.write.sources.base import Listing, PathSource
from h5pack.write.sources.objects import ObjectFile, located, member_range


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
        path = located(self.store, self.root)
        found: Found = []
        problems: list[SkippedFile] = []
        try:
            with contextlib.closing(self.store.source(path)) as source:
                end = source.size()
                with tarfile.open(fileobj=ObjectFile(source), mode="r:") as archive:
                    for member in tar_members(archive):
                        where = member_range(self.store, path, member.offset_data, member.size)
                        take_tar_member(member, where, end, found, problems)
                    tail = unread_tail(archive, end)
        except (OSError, H5PackError, tarfile.TarError) as err:
            raise SourceError(f"cannot read the tar archive {self.root}: {err}") from err
        whole = [SkippedFile(Path(self.root).name, tail)] if tail else []
        return archive_listing(self.root, found, problems, whole)

    def files(self) -> tuple[Path, ...]:
        """Return the archive: the one local file the samples are read from."""
        return () if self.store.remote else (Path(self.root),)
