"""Parquet in Hugging Face datasets' layout as a source: a file, a folder or a glob of them.

The image column is the one the schema metadata types ``Image`` (``image`` when several
are), else the one struct of ``bytes`` and ``path``. ``label`` is the class: a
``ClassLabel``'s names are the classes (-1: unlabelled), other integers are ids (classes
``"0" .. max``), strings are names (sorted). A list of a ``ClassLabel`` is a multi-label
field; other columns are fields under their names: numbers as scalars, strings as text,
lists of numbers as arrays; columns of other types are left out, and a note says so. A
sample's key is its image's ``path``, else ``FILE:ROW``. Listing reads all but the image
bytes, a row group at a time; the images are streamed in write order (NOTE [ Parquet
runs ]). A row whose key an earlier row has, whose label is no class or whose field is null
is a problem naming its file and row, as is a row without image bytes when read. Files of
several splits (``train-*``, ``test-*``) or folders are refused: name one.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from h5pack.core.fields import StoredField
from h5pack.core.format import SkippedFile
from h5pack.core.store import Store
from h5pack.errors import H5PackError, SourceError
from h5pack.write.scan import has_image_extension, is_ignored_name
from h5pack.write.sources.base import Listing, PathSource, Sample, interleave, label_fields
from h5pack.write.sources.objects import folder_url, listed, under
from h5pack.write.sources.parquetrows import (
    ParquetRow,
    features_of,
    field_for,
    image_bytes,
    image_column,
    is_label,
    parquet_file,
    runs_for,
    values_of,
)

_SHARD = re.compile(r"^(?P<split>.+)-\d{5}-of-\d{5}\.parquet$")


class ParquetSource(PathSource):
    """The rows of Parquet files in Hugging Face datasets' layout (the module docstring)."""

    kind = "parquet"
    detect_first = True  # a folder of Parquet files is a folder too

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is a ``.parquet`` file, a glob of them, or a folder of them."""
        return bool(_parquet_files(path, detect=True))

    def find(self) -> Listing:
        """List the rows of every file (SourceError: no files, no image column, unreadable)."""
        remote = self.store.remote
        files = (
            _parquet_objects(self.store, self.root)
            if remote
            else _parquet_files(Path(self.root), detect=False)
        )
        if not files:
            raise SourceError(f"no Parquet files under {self.root}")
        _check_one_split(self.root, [rel for _, rel in files])
        self._files = [] if remote else [Path(path) for path, _ in files]
        table = _Table(self.root, self.store if remote else None)
        for path, rel in files:
            table.add(path, rel)
        self._groups = table.groups
        return table.listing()

    def files(self) -> list[Path]:
        """Return the Parquet files (a target must be none of them)."""
        self.listing  # noqa: B018 - lists the files
        return list(self._files)

    def write_order(self, seed: int, shuffle: bool) -> np.ndarray:
        """Return the interleaved runs of row groups (NOTE [ Parquet runs ])."""
        orders: dict[tuple[int, bool], np.ndarray] = self.__dict__.setdefault("_orders", {})
        if (seed, shuffle) not in orders:
            rows = [count for count, _ in self._groups]
            order = np.arange(sum(rows), dtype=np.int64)
            if shuffle and len(order):
                runs = runs_for(max(n for _, n in self._groups))
                order = interleave(rows, runs, seed)
            orders[(seed, shuffle)] = order
        return orders[(seed, shuffle)]


def _parquet_files(path: Path, *, detect: bool) -> list[tuple[str, str]]:
    """Return ``(absolute, relative)`` of the Parquet files ``path`` names, sorted.

    With ``detect``, a folder that holds an image file names none (an image folder).
    """
    text = os.fspath(path)
    magic = re.search(r"[*?\[]", text)
    if magic and not path.exists():
        base = os.path.dirname(text[: magic.start()])
        matched = [p for p in glob.glob(text, recursive=True) if p.endswith(".parquet")]
        return sorted((os.path.abspath(p), os.path.relpath(p, base or ".")) for p in matched)
    if path.suffix.lower() == ".parquet" and path.is_file():
        return [(os.path.abspath(path), path.name)]
    if not path.is_dir():
        return []
    found: list[tuple[str, str]] = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not is_ignored_name(d))
        for name in names:
            if detect and has_image_extension(name):
                return []
            if name.endswith(".parquet") and not is_ignored_name(name):
                full = os.path.join(folder, name)
                found.append((os.path.abspath(full), os.path.relpath(full, path)))
    return sorted(found)


def _check_one_split(root: str, relatives: list[str]) -> None:
    """Refuse files of several splits or folders, naming them (SourceError)."""
    folders = sorted({os.path.dirname(rel) for rel in relatives})
    splits = sorted({m["split"] for rel in relatives if (m := _SHARD.match(os.path.basename(rel)))})
    if len(folders) > 1 or len(splits) > 1:
        kinds = f"the splits {splits}" if len(splits) > 1 else f"the folders {folders}"
        example = os.path.join(root, folders[0], f"{splits[0]}-*.parquet" if splits else "")
        raise SourceError(f"{root} holds Parquet files of {kinds}: convert one, e.g. {example!r}")


def _parquet_objects(store: Store, url: str) -> list[tuple[str, str]]:
    """Return ``(URL, relative)`` of the Parquet objects a URL names: one, a glob, a prefix."""
    magic = re.search(r"[*?\[]", url)
    if magic is None and url.lower().endswith(".parquet"):
        return [(url, url.rsplit("/", 1)[1])]
    base = url[: magic.start()].rsplit("/", 1)[0] + "/" if magic else folder_url(url)
    found = [o.url for o in listed(store, base) if o.url.lower().endswith(".parquet")]
    if magic:
        found = [u for u in found if fnmatch.fnmatchcase(u, url)]
    return [(u, under(base, u)) for u in found]


class _Table:
    """The rows of a source's Parquet files as they are listed, file by file."""

    def __init__(self, root: str, store: Store | None) -> None:
        self.root, self.store = root, store
        self.schema: Any = None
        self.samples: list[Sample] = []
        self.labels: list[Any] = []
        self.values: dict[str, list[Any]] = {}
        self.problems: list[SkippedFile] = []
        self.notes: list[str] = []
        self.groups: list[tuple[int, int]] = []  # rows and image bytes of each row group
        self.seen: dict[str, str] = {}

    def add(self, path: str, rel: str) -> None:
        """List the rows of one file (SourceError: unreadable, or not the first file's schema)."""
        try:
            handle = parquet_file(path, self.store)
        except (OSError, ValueError, H5PackError) as err:  # pyarrow's ArrowIOError and ArrowInvalid
            raise SourceError(f"cannot read the Parquet file {path}: {err}") from err
        with handle:
            if self.schema is None:
                self._plan(handle.schema_arrow, rel)
            elif not handle.schema_arrow.equals(self.schema, check_metadata=True):
                raise SourceError(
                    f"{path}: its columns differ from those of the first file "
                    f"({self.schema.names}); convert the files of one dataset together"
                )
            start = 0
            for group in range(handle.metadata.num_row_groups):
                try:
                    table = handle.read_row_group(group, columns=self.columns)
                except (OSError, ValueError) as err:
                    raise SourceError(f"{path}: cannot read row group {group}: {err}") from err
                self._add_group(path, rel, group, start, table, handle.metadata.row_group(group))
                start += table.num_rows

    def _plan(self, schema: Any, rel: str) -> None:
        """Choose the image column, the label and the fields from the first file's schema."""
        self.schema = schema
        features = features_of(schema)
        self.image = image_column(schema, features, os.path.join(self.root, rel))
        self.label_names: tuple[str, ...] | None = None
        self.labelled = "label" in schema.names and is_label(schema.field("label").type)
        if self.labelled:
            names = features.get("label", {}).get("names")
            self.label_names = tuple(str(n) for n in names) if names is not None else None
        elif "label" in schema.names:
            self.notes.append(
                f"the column 'label' of {self.root} holds neither class ids nor names "
                f"({schema.field('label').type}): it is left out"
            )
        self.fields: dict[str, StoredField] = {}
        for column in schema:
            if column.name in (self.image, "label"):
                continue
            found = field_for(column.name, column.type, features.get(column.name, {}))
            if found is None:
                self.notes.append(
                    f"the column {column.name!r} ({column.type}) of {self.root} is left out: "
                    "h5pack keeps numbers, strings, lists of numbers and class labels"
                )
            else:
                self.fields[column.name] = found
                self.values[column.name] = []
        self.columns = [f"{self.image}.path", *(["label"] if self.labelled else []), *self.fields]

    def _add_group(
        self, path: str, rel: str, group: int, start: int, table: Any, meta: Any
    ) -> None:
        images = table.column(0).combine_chunks().flatten()[0].to_pylist()
        bad = np.zeros(table.num_rows, dtype=bool)
        for name in self.fields:
            nulls = table.column(name).is_null().to_numpy(zero_copy_only=False)
            for row in np.flatnonzero(nulls & ~bad).tolist():
                self._problem(images[row], rel, start + row, f"the column {name!r} is null")
            bad |= nulls
        labels = table.column("label").to_pylist() if self.labelled else [None] * len(bad)
        first = len(self.samples)
        for row, (name, label) in enumerate(zip(images, labels, strict=True)):
            if bad[row]:
                continue
            key = name or f"{rel}:{start + row}"
            where = f"{rel}, row {start + row}"
            if key in self.seen:
                bad[row] = self._problem(key, rel, start + row, f"the key {key!r} is already "
                                         f"that of {self.seen[key]}")  # fmt: skip
            elif not self._label_fits(label):
                bad[row] = self._problem(key, rel, start + row, f"the label {label!r} is no "
                                         f"class of {self.label_names}")  # fmt: skip
            else:
                self.seen[key] = where
                image = ParquetRow(
                    path, store=self.store, row_group=group, row=row, column=self.image, name=where
                )
                self.samples.append(Sample(key, image))
                self.labels.append(label)
        keep = np.flatnonzero(~bad)
        for name in self.fields:
            self.values[name].append(table.column(name).take(keep))
        last = self.samples[-1] if len(self.samples) > first else None
        if last is not None and isinstance(last.image, ParquetRow):  # its read drops the group
            self.samples[-1] = Sample(last.key, replace(last.image, last=True))
        self.groups.append((len(self.samples) - first, image_bytes(meta, self.image)))

    def _problem(self, key: str | None, rel: str, row: int, reason: str) -> bool:
        self.problems.append(SkippedFile(key or f"{rel}:{row}", f"{rel}, row {row}: {reason}"))
        return True

    def _label_fits(self, label: Any) -> bool:
        if label is None or isinstance(label, str):
            return True  # unlabelled, or a class name
        if self.label_names is not None:
            return bool(-1 <= label < len(self.label_names))
        return bool(label >= -1)

    def listing(self) -> Listing:
        """Return the listing of the rows added (SourceError: none, or a column unfit)."""
        if not self.samples:
            first = f" (e.g. {self.problems[0].reason})" if self.problems else ""
            raise SourceError(f"no rows with images in {self.root}{first}")
        labels, classes = self._classes()
        samples = [
            Sample(s.key, s.image, fields)
            for s, fields in zip(self.samples, label_fields(labels), strict=True)
        ]
        columns = {}
        try:
            for name, found in self.fields.items():
                columns[name] = found.column(values_of(found, self.values[name]), len(samples))
        except H5PackError as err:
            raise SourceError(f"{self.root}: the column {name!r} cannot be kept: {err}") from err
        return Listing(
            samples,
            classes,
            tuple(self.problems),
            notes=tuple(self.notes),
            fields=tuple(self.fields.values()),
            columns=columns,
        )

    def _classes(self) -> tuple[list[int], tuple[str, ...]]:
        """Return each sample's class id and the classes (the module docstring)."""
        given = [-1 if label is None else label for label in self.labels]
        if self.label_names is not None:
            return [int(label) for label in given], self.label_names
        if any(isinstance(label, str) for label in given):
            names = tuple(sorted({str(label) for label in given if label != -1}))
            index = {name: i for i, name in enumerate(names)}
            return [index.get(str(label), -1) for label in given], names
        top = max((int(label) for label in given), default=-1)
        return [int(label) for label in given], tuple(str(i) for i in range(top + 1))
