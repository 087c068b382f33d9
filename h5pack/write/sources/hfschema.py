"""What the columns of a Hugging Face Parquet file hold: the image, the classes, the fields.

The schema metadata (key ``huggingface``) holds the dataset's features as JSON: ``{"info":
{"features": {"image": {"_type": "Image"}, "label": {"names": [...], "_type":
"ClassLabel"}, "tags": {"feature": {"names": [...], "_type": "ClassLabel"}, "_type":
"Sequence"}}}}`` (``"List"`` in datasets 4). ``parquet.ParquetSource`` reads them here.
"""

from __future__ import annotations

import json
from typing import Any

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
from h5pack.errors import H5PackError, SourceError


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
