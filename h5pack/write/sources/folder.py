"""A folder of images (ImageFolder, flat, or any layout with a manifest) as a source."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from h5pack.core.format import SkippedFile
from h5pack.write.manifest import describe, read_manifest
from h5pack.write.scan import label_by_folder, name_paths, scan
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields
from h5pack.write.sources.objects import prefix_images


class FolderSource(PathSource):
    """The images under a folder, labelled by ``write.scan``'s rules (or a manifest).

    A manifest (``--labels``, ``labels_csv=``: a CSV or JSONL file, ``write.manifest``)
    picks the images, labels them and gives their other fields.
    """

    kind = "folder"
    takes_labels = True

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is a folder."""
        return path.is_dir()

    def find(self) -> Listing:
        """Scan the folder (``write.scan.scan``), or read its manifest."""
        objects = prefix_images(self.store, self.root) if self.store.remote else None
        if objects is not None and self.labels_csv is None:  # NOTE [ Sources in a bucket ]
            return folder_listing(self.root, list(objects.items()), [])
        if self.labels_csv is None:
            found = scan(self.root)
        else:
            modes = None if objects is None else dict.fromkeys(objects, stat.S_IFREG)
            found = read_manifest(self.root, self.labels_csv, modes, self.given)
        # Absolute, for workers started elsewhere (Dask) or in another directory.
        cwd = os.getcwd()
        fields = label_fields([f.label for f in found.files])
        samples = [
            Sample(
                f.relative,
                objects[f.relative] if objects else FileRange(os.path.join(cwd, f.path)),
                fields[i],
            )
            for i, f in enumerate(found.files)
        ]
        notes: tuple[str, ...] = ()
        if found.unlisted and self.labels_csv is not None:
            listed, left = len(samples), found.unlisted
            notes = (
                f"the {describe(self.labels_csv)} lists {listed} of the {listed + len(left)} "
                f"images under {self.root}: {len(left)} left out ({name_paths(left)}); "
                "only listed images are packed",
            )
        return Listing(
            samples,
            found.classes,
            found.problems,
            notes=notes,
            fields=found.fields,
            columns=found.columns,
        )


def folder_listing(
    root: str,
    found: list[tuple[str, FileRange]],
    problems: list[SkippedFile],
    whole: Sequence[SkippedFile] = (),
) -> Listing:
    """Return the listing of the images ``found`` (by relative path), labelled as a folder's.

    ``whole`` are problems named by the source's file (after those of its entries).
    """
    labelled, classes = label_by_folder(root, found, problems, "auto")
    fields = label_fields([label for _, _, label in labelled])
    samples = [Sample(rel, where, fields[i]) for i, (rel, where, _) in enumerate(labelled)]
    return Listing(samples, classes, (*problems, *whole))
