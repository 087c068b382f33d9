"""A folder of images (ImageFolder, flat, or any layout with a manifest) as a source."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from h5pack.core.format import SkippedFile
from h5pack.write.manifest import describe, read_manifest
from h5pack.write.scan import label_by_folder, name_paths, scan
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields
from h5pack.write.sources.objects import prefix_images


class FolderSource(PathSource):
    """The images under a local folder, labelled by ``write.scan``'s rules (or a manifest).

    A manifest (``--labels``, ``labels_csv=``: a CSV or JSONL file, ``write.manifest``)
    picks the images, labels them and gives their other fields.
    """

    kind = "folder"
    takes_labels = True

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is this kind of source: a folder."""
        return path.is_dir()

    def find(self) -> Listing:
        """Scan the folder (``write.scan.scan``), or read its manifest."""
        objects = prefix_images(self.store, self.root) if self.store.remote else None
        if objects is not None and self.labels_csv is None:
            return self._objects(objects)
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

    def _objects(self, objects: dict[str, FileRange]) -> Listing:
        """List the images under a prefix of a bucket (NOTE [ Sources in a bucket ])."""
        problems: list[SkippedFile] = []
        found = list(objects.items())
        labelled, classes = label_by_folder(self.root, found, problems, "auto")
        fields = label_fields([label for _, _, label in labelled])
        samples = [Sample(rel, where, fields[i]) for i, (rel, where, _) in enumerate(labelled)]
        nbytes = sum(where.size for _, where, _ in labelled)
        return Listing(samples, classes, tuple(problems), nbytes=nbytes)
