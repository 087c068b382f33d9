"""A sample is a record of fields: the pack's listing of them and the selection read.

Every kind is importable from here; a pack without a listing holds ``LEGACY_FIELDS``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from h5pack.core import format as fmt
from h5pack.core.fieldblocks import FieldBlocks as FieldBlocks
from h5pack.core.fieldblocks import blocks_of as blocks_of
from h5pack.core.fieldkinds import IMAGE as IMAGE
from h5pack.core.fieldkinds import KEY as KEY
from h5pack.core.fieldkinds import LABEL as LABEL
from h5pack.core.fieldkinds import ArrayField as ArrayField
from h5pack.core.fieldkinds import BytesField as BytesField
from h5pack.core.fieldkinds import CategoryField as CategoryField
from h5pack.core.fieldkinds import Field as Field
from h5pack.core.fieldkinds import ImageField as ImageField
from h5pack.core.fieldkinds import JSONField as JSONField
from h5pack.core.fieldkinds import KeyField as KeyField
from h5pack.core.fieldkinds import LabelField as LabelField
from h5pack.core.fieldkinds import LazyColumn as LazyColumn
from h5pack.core.fieldkinds import MultiLabelField as MultiLabelField
from h5pack.core.fieldkinds import RaggedField as RaggedField
from h5pack.core.fieldkinds import ScalarField as ScalarField
from h5pack.core.fieldkinds import StoredField as StoredField
from h5pack.core.fieldkinds import TextField as TextField
from h5pack.core.fieldkinds import check_name
from h5pack.core.spatialfields import BoxesField as BoxesField
from h5pack.core.spatialfields import InstanceMasksField as InstanceMasksField
from h5pack.core.spatialfields import MaskField as MaskField
from h5pack.core.spatialfields import check_per_box
from h5pack.core.spatialfields import nearest as nearest
from h5pack.errors import FormatError, OptionsError

KINDS: dict[str, type[Field]] = {
    cls.kind: cls
    for cls in (
        ImageField,
        LabelField,
        KeyField,
        ScalarField,
        ArrayField,
        RaggedField,
        BytesField,
        TextField,
        MaskField,
        BoxesField,
        InstanceMasksField,
        CategoryField,
        MultiLabelField,
        JSONField,
    )
}
# What a pack written before the listing holds (every format 1.0 and 1.1 pack until now).
LEGACY_FIELDS: tuple[Field, ...] = (ImageField(IMAGE), LabelField(LABEL), KeyField(KEY))
# How a listing entry's keys become a kind's attributes (those it has).
_FROM_LISTING: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "dtype": ("dtype", str),
    "shape": ("dims", lambda v: tuple(int(d) for d in v)),
    "per_box": ("per_box", lambda v: tuple(str(n) for n in v)),
    "categories": ("categories", lambda v: tuple((int(i), str(n)) for i, n in v)),
    "classes": ("classes", tuple),
}


def field_from_dict(data: Mapping[str, Any]) -> Field:
    """Return the field of one entry of a pack's listing (``FormatError`` for an unknown kind)."""
    kind, name = data.get("kind"), str(data.get("name"))
    cls = KINDS.get(str(kind))
    if cls is None:
        raise FormatError(
            f"field {name!r} is of kind {kind!r}, which this h5pack does not read (it reads "
            f"{', '.join(KINDS)}); upgrade h5pack"
        )
    has = {f.name for f in dataclasses.fields(cls)}
    found = {a: make(data[k]) for k, (a, make) in _FROM_LISTING.items() if k in data and a in has}
    return cls(name, **found)


def kind_text(entry: Mapping[str, Any]) -> str:
    """Return a listing entry's kind, dtype and shape: ``ragged <f4 x 4``, ``text``..."""
    detail = " ".join(str(v) for v in (entry["kind"], entry.get("dtype")) if v)
    shape = " x ".join(str(d) for d in entry.get("shape", ()))
    return f"{detail}{' x ' + shape if shape else ''}"


def field_text(entry: Mapping[str, Any]) -> str:
    """Return a listing entry as ``info`` shows it: ``boxes (boxes <f4)``, ``image``..."""
    if entry["kind"] == entry["name"] and "dtype" not in entry:
        return str(entry["kind"])
    return f"{entry['name']} ({kind_text(entry)})"


def field_difference(
    mine: Sequence[Field], theirs: Sequence[Field], here: str, there: str
) -> str | None:
    """Return how two listings differ (joined by name), naming the first field that does."""
    a, b = {f.name: f for f in mine}, {f.name: f for f in theirs}
    for name in dict.fromkeys([*a, *b]):
        if name not in b or name not in a:
            held, holder, lacking = (a, here, there) if name in a else (b, there, here)
            text = kind_text(held[name].to_dict())
            return f"field {name!r} ({text}) is in {holder}, not in {lacking}"
        if a[name] != b[name]:
            mine_text, theirs_text = kind_text(a[name].to_dict()), kind_text(b[name].to_dict())
            return f"field {name!r} is {mine_text} in {here} but {theirs_text} in {there}"
    return None


def fields_text(fields: Sequence[Field]) -> str:
    """Return the listing attribute's text."""
    return json.dumps([f.to_dict() for f in fields])


@functools.lru_cache(maxsize=64)  # read at every batch of a dataset of fields
def parse_fields(text: str | None, path: str) -> tuple[Field, ...]:
    """Return a pack's fields from its listing (``LEGACY_FIELDS`` without one; ``FormatError``)."""
    if text is None:
        return LEGACY_FIELDS
    try:
        return tuple(field_from_dict(e) for e in json.loads(text))
    except FormatError as err:
        raise FormatError(f"{path}: {err}") from err
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise FormatError(
            f"{path}: the field listing cannot be read ({err}); {fmt.DAMAGED}"
        ) from err


def fields_of(meta: fmt.PackMeta) -> tuple[Field, ...]:
    """Return the fields of the pack ``meta`` describes (``LEGACY_FIELDS`` for older packs)."""
    return parse_fields(meta.field_listing, meta.path)


def stored_fields(fields: Sequence[Field]) -> tuple[StoredField, ...]:
    """Return the fields of the group ``/fields`` (every one but image, label and key)."""
    return tuple(f for f in fields if isinstance(f, StoredField))


def make_field(name: str, values: Any) -> StoredField:
    """Return the field that stores ``values``, its kind told from them."""
    check_name(name)
    if len(values) and isinstance(values[0], str):
        return TextField(name)
    if len(values) and isinstance(values[0], bytes | bytearray | memoryview):
        return BytesField(name)
    arrays = [np.asarray(v) for v in values]
    if arrays and all(a.shape == arrays[0].shape for a in arrays):
        dtype = np.stack(arrays).dtype.newbyteorder("<").str
        if arrays[0].ndim == 0:
            return ScalarField(name, dtype)
        return ArrayField(name, dtype, tuple(arrays[0].shape))
    if arrays and all(a.ndim >= 1 and a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        dtype = np.concatenate(arrays).dtype.newbyteorder("<").str
        return RaggedField(name, dtype, tuple(arrays[0].shape[1:]))
    raise OptionsError(
        f"field {name!r}: the kind of its values cannot be told; pass a field, e.g. "
        f"fields={{'{name}': (MaskField('{name}'), values)}}"
    )


def columns_of(
    given: Mapping[str | Field, Any], num: int
) -> tuple[tuple[StoredField, ...], dict[str, Any]]:
    """Return the fields and checked columns of ``write_arrays``'s ``fields=``."""
    fields: list[StoredField] = []
    columns: dict[str, Any] = {}
    for key, values in given.items():
        if isinstance(key, str):
            found = make_field(key, values)
        elif isinstance(key, StoredField):
            found = key
        else:
            raise OptionsError(
                f"fields should be keyed by a name or a field such as MaskField('mask'), but "
                f"got {key!r}"
            )
        if found.name in columns:
            raise OptionsError(f"field {found.name!r} is given twice")
        columns[found.name] = found.column(values, num)
        fields.append(found)
    return check_per_box(fields, columns, num), columns


def read_values(
    source: Any,
    meta: fmt.PackMeta,
    indices: np.ndarray,
    names: Sequence[str],
    *,
    packed: bool = False,
) -> dict[str, list[Any]]:
    """Return the stored fields ``names`` of samples ``indices`` (``packed``: masks as stored)."""
    listed = {f.name: f for f in stored_fields(fields_of(meta))}
    idx = np.asarray(indices, dtype=np.int64)
    shapes = meta.shapes[idx] if len(meta.shapes) else np.zeros((idx.size, 3), np.int32)
    found = {}
    for name in names:
        if name in listed:
            with fmt.reading(meta.path, f"field {name!r}"):
                field = listed[name]
                if packed and isinstance(field, InstanceMasksField):
                    found[name] = field.read_packed(source, idx, shapes)
                else:
                    found[name] = field.read(source, idx, shapes)
    return found


def selected(meta: fmt.PackMeta, names: Sequence[str] | None, *, key: bool) -> tuple[str, ...]:
    """Return the fields a dataset delivers: ``names`` (``OptionsError`` if unlisted), or all."""
    listed = [f.name for f in fields_of(meta)]
    if names is None:
        return tuple(n for n in listed if n != KEY or key)
    unknown = [n for n in names if n not in listed]
    if unknown or not names:
        raise OptionsError(
            f"fields should name some of {meta.path}'s fields {listed}, but got {list(names)}"
        )
    return tuple(dict.fromkeys(names))


def spatial(meta: fmt.PackMeta, names: Sequence[str]) -> tuple[StoredField, ...]:
    """Return the stored fields among ``names`` that follow the image's geometry."""
    return tuple(f for f in stored_fields(fields_of(meta)) if f.spatial and f.name in names)
