"""Parquet's rows: what the columns hold, where a row's image lies, how the rows are read.

A Hugging Face file's schema metadata (key ``huggingface``) holds the dataset's features as
JSON: ``{"info": {"features": {"image": {"_type": "Image"}, "label": {"names": [...],
"_type": "ClassLabel"}, "tags": {"feature": {"names": [...], "_type": "ClassLabel"},
"_type": "Sequence"}}}}`` (``"List"`` in datasets 4).

NOTE [ Parquet runs ]: a row group's column is stored in compressed pages (most values in
one dictionary page), so a row group is read whole, never per image. A Parquet source's
write order is a seeded random interleaving of runs of consecutive row groups (as a gzip
tar's runs), each read front to back, so that chunks mix rows of every part of the files
while only each run's current group is held: ``runs_for`` gives as many runs as
``CACHE_BYTES`` holds, at most ``RUNS``. Its images are ``ParquetRow``s with
``in_parent``: the converting process reads them in write order (``ship``), each group
once, dropped after its last sample. A read out of that order (``verify --source``) reads
a group again if it was dropped.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from h5pack.core.fieldkinds import check_name
from h5pack.core.fields import (
    ArrayField,
    MultiLabelField,
    RaggedField,
    ScalarField,
    StoredField,
    TextField,
)
from h5pack.core.store import Store
from h5pack.errors import DecodeError, H5PackError, SourceError, install_line
from h5pack.write.sources.base import FileRange, opened
from h5pack.write.sources.objects import ObjectFile

RUNS = 64
CACHE_BYTES = 2**30  # the row groups held at once, by their images' bytes

# This process's open files, row groups and image lengths (reset in a forked child).
_STATE: dict[str, Any] = {}


def pyarrow_parquet() -> Any:
    """Return ``pyarrow.parquet`` (SourceError saying how to install it)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise SourceError(
            f"Parquet sources are read with pyarrow: {install_line('parquet')}"
        ) from err
    return pq


@dataclass(frozen=True, slots=True)
class ParquetRow(FileRange):
    """One row's image of a Parquet file (NOTE [ Parquet runs ]).

    ``column`` is the image column (a struct of ``bytes`` and ``path``); ``name`` the file
    and row as messages name them; ``last``: the last sample of its group (its read drops it).
    """

    row_group: int = 0
    row: int = 0
    column: str = "image"
    name: str = ""
    last: bool = False
    in_parent: ClassVar[bool] = True

    def read(self) -> bytes:
        """Return the image's bytes (DecodeError: none, or the file cannot be read)."""
        data = _take(self)
        if not data:
            raise DecodeError(f"{self.name}: no image bytes in its {self.column!r} column")
        return bytes(data)

    def nbytes(self) -> int:
        """Return how many bytes ``read`` gives (0 for none), reading the row group once."""
        return int(lengths(self)[self.row])


def runs_for(group_bytes: int) -> int:
    """Return how many runs to interleave when the largest row group holds ``group_bytes``."""
    return max(1, min(RUNS, CACHE_BYTES // max(1, group_bytes)))


def _take(image: ParquetRow) -> Any:
    """Return a row's image bytes (None when null), reading its row group if not held."""
    groups: OrderedDict[tuple[str, int, str], Any] = _state()["groups"]
    key = (image.path, image.row_group, image.column)
    images = groups.pop(key, None)
    if images is None:
        images = _read(image)
    if not image.last:  # the group's last sample drops it
        _hold(key, images)
    return images[image.row].as_py()


def _hold(key: tuple[str, int, str], images: Any) -> None:
    """Keep a row group's images, dropping the least recently used past ``CACHE_BYTES``."""
    groups: OrderedDict[tuple[str, int, str], Any] = _state()["groups"]
    groups[key] = images
    while len(groups) > 1 and sum(g.nbytes for g in groups.values()) > CACHE_BYTES:
        groups.popitem(last=False)


def _read(image: ParquetRow) -> Any:
    """Return the image bytes of a row's group (a pyarrow binary array)."""
    try:
        table = _open(image.path, image.store).read_row_group(
            image.row_group, columns=[f"{image.column}.bytes"], use_threads=False
        )
    except (OSError, ValueError, H5PackError) as err:  # pyarrow's ArrowIOError, ArrowInvalid
        message = f"{image.name or image.path}: cannot read row group {image.row_group}: {err}"
        raise DecodeError(message) from err
    return table.column(0).combine_chunks().flatten()[0]


def _state() -> dict[str, Any]:
    if _STATE.get("pid") != os.getpid():
        _STATE.clear()
        _STATE.update(pid=os.getpid(), files={}, groups=OrderedDict(), lengths={})
    return _STATE


def parquet_file(path: str, store: Store | None) -> Any:
    """Return a ``ParquetFile`` of a local file (mapped), or of an object read in exact ranges."""
    if store is None:
        return pyarrow_parquet().ParquetFile(path, memory_map=True)
    return pyarrow_parquet().ParquetFile(ObjectFile(opened(store, path), readahead=0))


def _open(path: str, store: Store | None) -> Any:
    files: dict[str, Any] = _state()["files"]
    if path not in files:
        files[path] = parquet_file(path, store)
    return files[path]


def lengths(image: ParquetRow) -> np.ndarray:
    """Return the byte length of each row's image in ``image``'s row group (0 where none)."""
    import pyarrow.compute as pc

    found: dict[tuple[str, int, str], np.ndarray] = _state()["lengths"]
    key = (image.path, image.row_group, image.column)
    if key not in found:
        images = _state()["groups"].get(key)
        if images is None:  # kept: the rows are read next (a remote group is not fetched twice)
            images = _read(image)
            _hold(key, images)
        found[key] = pc.binary_length(images).fill_null(0).to_numpy().astype(np.int64)
    return found[key]


def features_of(schema: Any) -> dict[str, Any]:
    """Return the Hugging Face features in a schema's metadata (empty when there are none)."""
    text = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(text)["info"]["features"] if text else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def image_column(schema: Any, features: dict[str, Any], path: str) -> str:
    """Return the name of the image column (SourceError: none, or several, can be told)."""
    typed = [n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "Image"]
    structs = [
        c.name
        for c in schema
        if c.type.num_fields
        and {c.type.field(i).name for i in range(c.type.num_fields)} >= {"bytes", "path"}
    ]
    found = [n for n in typed if n in structs] or structs
    if len(found) > 1 and "image" in found:
        return "image"
    if len(found) != 1:
        raise SourceError(
            f"{path}: the image should be one column of Hugging Face's Image feature (a struct "
            f"of bytes and path), but the columns {schema.names} hold {len(found)}"
        )
    return found[0]


def is_label(arrow_type: Any) -> bool:
    """Whether a column can be the class: integers (ids) or strings (names)."""
    import pyarrow as pa

    return bool(pa.types.is_integer(arrow_type) or pa.types.is_string(arrow_type))


def image_bytes(meta: Any, image: str) -> int:
    """Return the bytes of a row group's images, from the file's metadata."""
    for i in range(meta.num_columns):
        column = meta.column(i)
        if column.path_in_schema == f"{image}.bytes":
            return int(column.total_uncompressed_size)
    return 0


def field_for(name: str, arrow_type: Any, feature: Any) -> StoredField | None:
    """Return the field that keeps a column, or None (see the module docstring)."""
    import pyarrow as pa

    try:
        check_name(name)
    except H5PackError:
        return None
    types = pa.types
    if types.is_integer(arrow_type) or types.is_floating(arrow_type):
        return ScalarField(name, np.dtype(arrow_type.to_pandas_dtype()).str)
    if types.is_boolean(arrow_type):
        return ScalarField(name, "|b1")
    if types.is_string(arrow_type) or types.is_large_string(arrow_type):
        return TextField(name)
    if not (types.is_list(arrow_type) or types.is_large_list(arrow_type)
            or types.is_fixed_size_list(arrow_type)):  # fmt: skip
        return None
    value = arrow_type.value_type
    inner = feature.get("feature", {}) if isinstance(feature, dict) else {}
    names = inner.get("names") if isinstance(inner, dict) else None
    if names is not None and types.is_integer(value):
        return MultiLabelField(name, classes=tuple(str(n) for n in names))
    if not (types.is_integer(value) or types.is_floating(value)):
        return None
    dtype = np.dtype(value.to_pandas_dtype()).str
    if types.is_fixed_size_list(arrow_type):
        return ArrayField(name, dtype, (arrow_type.list_size,))
    return RaggedField(name, dtype)


def values_of(field: StoredField, chunks: list[Any]) -> Any:
    """Return a column's values (pyarrow arrays, one per row group) as the field takes them."""
    import pyarrow as pa

    if not chunks:
        return []
    column = pa.chunked_array(chunks).combine_chunks()
    if isinstance(field, ScalarField) and not isinstance(field, ArrayField):
        return column.to_numpy(zero_copy_only=False)
    return column.to_pylist()
