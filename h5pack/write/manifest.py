"""A manifest: a CSV or JSONL file that names a folder's images and gives their fields.

A record names an image relative to the folder (``path`` or ``file_name``; a CSV without
a header is ``path,label``); ``label`` is a class (ids when all are integers, else sorted
names), ``labels`` a multi-label set (``a|b`` or a JSON list), every other column a field
(docs/converting.md). A record that cannot be a sample is a problem naming the manifest
and its line; an unreadable manifest, a bad column name or no record is an error.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core.fieldkinds import check_name
from h5pack.core.fields import JSONField, MultiLabelField, ScalarField, StoredField, TextField
from h5pack.core.format import SkippedFile
from h5pack.core.store import is_url
from h5pack.errors import OptionsError, SourceError
from h5pack.write.scan import (
    IMAGE_EXTENSIONS,
    ScanResult,
    SourceFile,
    check_root,
    has_image_extension,
    path_sort_key,
    walk,
)
from h5pack.write.sources.objects import read_text

PATH_COLUMNS = ("path", "file_name")
LABEL, LABELS, SEPARATOR = "label", "labels", "|"
# Numbers as a CSV writes them; "007" stays text (an identifier, its zeros kept).
_INT = re.compile(r"[+-]?(0|[1-9]\d*)")
_FLOAT = re.compile(r"[+-]?((0|[1-9]\d*)(\.\d*)?|\.\d+)([eE][+-]?\d+)?")

# A record: its line, its image's path as written, and its other cells by column.
Record = tuple[int, str, dict[str, Any]]
_MISSING = object()  # a JSONL key a record lacks


class _Problems(list[tuple[int, SkippedFile]]):
    """The manifest's problems, each naming the manifest and the record's line."""

    def __init__(self, manifest: StrPath) -> None:
        super().__init__()
        self.manifest = manifest

    def add(self, line: int, path: str, message: str) -> None:
        where = f"{self.manifest}, line {line}"
        self.append((line, SkippedFile(path or f"line {line}", f"{where}: {message}")))


def read_manifest(
    root: StrPath, manifest: StrPath, objects: Any = None, store: Any = None
) -> ScanResult:
    """Return the images ``manifest`` names under ``root``, sorted, with fields.

    ``objects``: a bucket's files' modes by path, with its ``store`` (NOTE [ Sources in a
    bucket ]). ``unlisted`` are the images that no record names.
    """
    path = manifest if is_url(manifest) else Path(manifest)
    if objects is None:
        check_root(Path(root))
    try:
        text = read_text(os.fspath(manifest), store)
    except OSError as err:
        raise SourceError(f"cannot read {describe(path)}: {err.strerror}") from err
    problems = _Problems(path)
    jsonl = describe(path).startswith("labels JSONL")
    records = (_jsonl_records if jsonl else _csv_records)(path, text, problems)
    named = {"/".join(PurePosixPath(p).parts) for _, p, _ in records}
    records = _existing(root, records, problems, objects)
    fields, columns, labels, classes, kept = _columns(records, problems, typed=jsonl)
    found = [problem for _, problem in sorted(problems, key=lambda item: item[0])]
    if not kept:
        first = f" (e.g. {found[0].reason})" if found else ""
        raise SourceError(f"{describe(path)} lists no images{first}")
    order = sorted(range(len(kept)), key=lambda i: path_sort_key(kept[i][1]))
    files = tuple(SourceFile(Path(root, kept[i][1]), kept[i][1], labels[i]) for i in order)
    positions = np.asarray(order, dtype=np.int64)
    every = [r for r, _ in walk(Path(root))[0]] if objects is None else list(objects)
    unlisted = tuple(sorted((r for r in every if r not in named), key=path_sort_key))
    return ScanResult(
        root=Path(root),
        files=files,
        classes=classes,
        problems=tuple(found),
        unlisted=unlisted,
        fields=fields,
        columns={f.name: f.take(columns[f.name], positions) for f in fields},
    )


def describe(manifest: StrPath) -> str:
    """Return how messages name a manifest: ``labels CSV PATH`` or ``labels JSONL PATH``."""
    jsonl = Path(manifest).suffix.lower() in (".jsonl", ".ndjson")
    return f"labels {'JSONL' if jsonl else 'CSV'} {manifest}"


def _csv_records(path: StrPath, text: str, problems: _Problems) -> list[Record]:
    """Return the records of a CSV (``path,label`` without a header)."""
    reader = csv.reader(io.StringIO(text))
    rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    header = [cell.strip() for cell in rows[0][1]] if rows else []
    if not {h.lower() for h in header} & set(PATH_COLUMNS):
        header = ["path", LABEL]
    else:
        rows = rows[1:]
    names = _column_names(path, header)
    records: list[Record] = []
    for line, row in rows:
        cells = [cell.strip() for cell in row]
        if len(cells) != len(names):
            expected = ",".join(header)
            problems.add(line, cells[0], f"expected {len(names)} columns '{expected}', but got "
                         f"{len(cells)}")  # fmt: skip
            continue
        values = dict(zip(names, cells, strict=True))
        records.append((line, values.pop("path"), values))
    return records


def _jsonl_records(path: StrPath, text: str, problems: _Problems) -> list[Record]:
    """Return the records of a JSONL file (one object per line)."""
    objects: list[tuple[int, dict[str, Any]]] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError as err:
            problems.add(line, "", f"not a JSON object ({err})")
            continue
        if not isinstance(value, dict):
            problems.add(line, "", f"not a JSON object, but {type(value).__name__}")
            continue
        objects.append((line, value))
    if not objects:
        return []
    keys = list(dict.fromkeys(key for _, value in objects for key in value))
    names = _column_names(path, keys)
    records: list[Record] = []
    for line, value in objects:
        cells = {names[keys.index(k)]: v for k, v in value.items()}
        where = cells.pop("path", None)
        if not isinstance(where, str) or not where:
            problems.add(line, "", "names no image (a non-empty 'path' or 'file_name')")
            continue
        records.append((line, where, {n: cells.get(n, _MISSING) for n in names if n != "path"}))
    return records


def _column_names(path: StrPath, header: list[str]) -> list[str]:
    """Return the columns' names (``path``, ``label``, ``labels`` or field names), or refuse."""
    names = [h.lower() if h.lower() in (*PATH_COLUMNS, LABEL, LABELS) else h for h in header]
    found = [n for n in names if n in PATH_COLUMNS]
    if len(found) != 1:
        raise SourceError(
            f"{path}: a manifest should name each image in one column 'path' or 'file_name', "
            f"but its columns are {header}"
        )
    names = ["path" if n in PATH_COLUMNS else n for n in names]
    for name in names:
        if names.count(name) > 1:
            raise SourceError(f"{path}: the column {name!r} is given twice")
        if name not in ("path", LABEL, LABELS):
            try:
                check_name(name)
            except OptionsError as err:
                raise SourceError(f"{path}: the column {name!r} cannot be a field: {err}") from err
    return names


def _existing(
    root: StrPath, records: list[Record], problems: _Problems, objects: Any
) -> list[Record]:
    """Return the records whose path names an image under ``root``, once; the rest are problems."""
    kept: list[Record] = []
    seen: dict[str, int] = {}
    for line, given, values in records:
        relative, reason = _listed_file(root, given, objects)
        if reason is None and relative in seen:
            reason = f"{relative!r} is already listed on line {seen[relative]}"
        if reason is not None:
            problems.add(line, relative or given, reason)
            continue
        seen[relative] = line
        kept.append((line, relative, values))
    return kept


def _listed_file(root: StrPath, given: str, objects: Any) -> tuple[str, str | None]:
    """Return a record's normalised path, and why it is no image (None: it is one)."""
    pure = PurePosixPath(given)
    relative = "/".join(pure.parts)
    if pure.is_absolute() or ".." in pure.parts:
        return given, f"the path should be relative to {root} and stay inside it"
    if not relative or relative == ".":
        return given, "the path names no file"
    try:
        mode = os.stat(Path(root, relative)).st_mode if objects is None else objects[relative]
    except (FileNotFoundError, KeyError):
        return relative, f"{relative!r} does not exist under {root}"
    except OSError as err:
        return relative, f"cannot access {relative!r}: {err.strerror}"
    if not stat.S_ISREG(mode):
        return relative, f"{relative!r} is not a regular file"
    if not has_image_extension(relative):
        extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
        return relative, f"{relative!r} is not an image file ({extensions})"
    return relative, None


def _columns(
    records: list[Record], problems: _Problems, *, typed: bool
) -> tuple[tuple[StoredField, ...], dict[str, Any], list[int], tuple[str, ...], list[Record]]:
    """Type each column and check each cell; return fields, columns, labels, classes, records."""
    names = list(dict.fromkeys(name for _, _, values in records for name in values))
    kinds = {
        name: LABELS if name == LABELS else _kind([v[name] for _, _, v in records], typed)
        for name in names
        if name != LABEL
    }
    rows: list[tuple[Record, str | None, dict[str, Any]]] = []
    for record in records:
        line, relative, values = record
        try:
            cells = {name: _cell(kind, name, values[name]) for name, kind in kinds.items()}
            label = _label_text(values[LABEL]) if LABEL in names else None
        except ValueError as err:
            problems.add(line, relative, str(err))
            continue
        rows.append((record, label, cells))
    labels, classes = _labels(rows, problems) if LABEL in names else ([-1] * len(rows), ())
    kept = [(row, label) for row, label in zip(rows, labels, strict=True) if label is not None]
    fields: list[StoredField] = []
    columns: dict[str, Any] = {}
    for name, kind in kinds.items():
        column = [row[2][name] for row, _ in kept]
        field: StoredField
        if kind == LABELS:
            union = sorted({c for names_ in column for c in names_}, key=path_sort_key)
            field = MultiLabelField(name, classes=tuple(union))
            ids = {c: i for i, c in enumerate(field.classes)}
            column = [[ids[c] for c in names_] for names_ in column]
        elif kind in _DTYPES:
            field = ScalarField(name, _DTYPES[kind])
        else:
            field = TextField(name) if kind == "text" else JSONField(name)
        fields.append(field)
        columns[name] = field.column(column, len(column))
    found = [label for _, label in kept]
    return tuple(fields), columns, found, classes, [row[0] for row, _ in kept]


_DTYPES = {"int": "<i8", "float": "<f8", "bool": "|b1"}
_WHAT = {
    "int": "integers",
    "float": "numbers",
    "bool": "true or false",
    "text": "text",
    LABELS: f"class names separated by {SEPARATOR!r} (or a JSON list of names)",
}


def _is_int(value: Any, typed: bool) -> bool:
    if typed:
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    return isinstance(value, str) and bool(_INT.fullmatch(value)) and -(2**63) <= int(value) < 2**63


def _is_number(value: Any, typed: bool) -> bool:
    if typed:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str) and bool(_INT.fullmatch(value) or _FLOAT.fullmatch(value))


def _kind(values: list[Any], typed: bool) -> str:
    """Return what a column holds: int, float, bool, text or (JSONL) json."""
    if typed:
        present = [v for v in values if v is not _MISSING and v is not None]
    else:
        present = [v for v in values if v != ""]
    if not present:
        return "json" if typed else "text"
    if all(_is_int(v, typed) for v in present):
        return "int"
    if all(_is_number(v, typed) for v in present):
        return "float"
    if typed and all(isinstance(v, bool) for v in present):
        return "bool"
    return "text" if all(isinstance(v, str) for v in present) else "json"


def _cell(kind: str, name: str, value: Any) -> Any:
    """Return one cell's value of a column of ``kind`` (``ValueError`` naming the column)."""
    if kind == "json":
        return None if value is _MISSING else value
    typed = not isinstance(value, str)
    if kind == LABELS:
        names = value.split(SEPARATOR) if isinstance(value, str) else value
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            names = [n.strip() for n in names] if names != [""] else []
            if all(names):
                return names
    elif (kind == "text" and isinstance(value, str)) or (
        kind == "bool" and isinstance(value, bool)
    ):
        return value
    elif kind == "int" and _is_int(value, typed):
        return int(value)
    elif kind == "float" and _is_number(value, typed):
        return float(value)
    shown = "no value" if value is _MISSING or value is None or value == "" else repr(value)
    raise ValueError(f"the column {name!r} holds {_WHAT[kind]}, but this record has {shown}")


def _label_text(value: Any) -> str:
    """Return a record's label as text (a class name, or an id's digits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("the path and the label should both be non-empty")
    return value.strip()


def _labels(
    rows: list[tuple[Record, str | None, dict[str, Any]]], problems: _Problems
) -> tuple[list[int | None], tuple[str, ...]]:
    """Return each row's class id (None: a problem) and the classes: ids if all are integers."""
    texts = [str(label) for _, label, _ in rows]
    try:
        ids = [int(text) for text in texts]
    except ValueError:
        names = tuple(sorted(set(texts), key=path_sort_key))
        index = {name: i for i, name in enumerate(names)}
        return [index[text] for text in texts], names
    found: list[int | None] = []
    for (record, _, _), label in zip(rows, ids, strict=True):
        if label < 0:
            problems.add(record[0], record[1], f"a class id should be >= 0, but got label={label}")
        found.append(label if label >= 0 else None)
    top = max((i for i in found if i is not None), default=-1)
    return found, tuple(str(i) for i in range(top + 1))
