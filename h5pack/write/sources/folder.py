"""A folder of images (ImageFolder, flat, or any layout with a manifest) as a source."""

from __future__ import annotations

import os
from pathlib import Path

from h5pack.core.format import SkippedFile
from h5pack.write.manifest import describe, read_manifest
from h5pack.write.scan import label_by_folder, name_paths, scan
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields
from h5pack.write.sources.objects import folder_url, listed, under
from h5pack.write.walk import has_image_extension, is_ignored_name


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
        if self.store.remote and self.labels_csv is None:
            return self._objects()
        if self.labels_csv is None:
            found = scan(self.root)
        else:
            found = read_manifest(self.root, self.labels_csv)
        # Absolute, for workers started elsewhere (Dask) or in another directory.
        cwd = os.getcwd()
        fields = label_fields([f.label for f in found.files])
        samples = [
            Sample(f.relative, FileRange(os.path.join(cwd, f.path)), fields[i])
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

    def _objects(self) -> Listing:
        """List the images under a prefix of a bucket (NOTE [ Sources in a bucket ])."""
        prefix = folder_url(self.root)
        found: list[tuple[str, FileRange]] = []
        for item in listed(self.store, prefix):
            relative = under(prefix, item.url)
            parts = relative.split("/")
            if has_image_extension(parts[-1]) and not any(is_ignored_name(p) for p in parts):
                found.append((relative, FileRange(item.url, 0, item.size, self.store)))
        problems: list[SkippedFile] = []
        labelled, classes = label_by_folder(self.root, found, problems, "auto")
        fields = label_fields([label for _, _, label in labelled])
        samples = [Sample(rel, where, fields[i]) for i, (rel, where, _) in enumerate(labelled)]
        nbytes = sum(where.size for _, where, _ in labelled)
        return Listing(samples, classes, tuple(problems), nbytes=nbytes)
