"""The kinds of field: one small frozen class per kind of value a pack stores.

NOTE [ Stored fields ]: the image, the label and the key keep the root datasets of format
1.0; every other field lives under ``/fields`` (docs/format.md), a fixed-size value as one
``(N, *shape)`` dataset, a variable one as its values back to back plus ``NAME.offsets``,
chunked with about one image chunk's samples.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import h5py
import numpy as np

from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.fieldblocks import blocks_of
from h5pack.errors import OptionsError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE, LABEL, KEY = fmt.IMAGE_FIELD, fmt.LABEL_FIELD, fmt.KEY_FIELD


@dataclass(frozen=True)
class Field:
    """One named value of every sample (``name``: a Python identifier, its batch key)."""

    name: str
    kind: ClassVar[str] = ""
    spatial: ClassVar[bool] = False  # transformed with the image's crop and flip
    listed: ClassVar[tuple[str, ...]] = ()  # the attributes its listing entry holds
    roots: ClassVar[tuple[str, ...]] = ()  # the root datasets of image, label and key

    def to_dict(self) -> dict[str, Any]:
        """Return the field's entry of the pack's listing (JSON-ready)."""
        entry: dict[str, Any] = {"name": self.name, "kind": self.kind}
        for key in self.listed:
            value = getattr(self, key)
            entry[key] = list(value) if isinstance(value, tuple) else value
        return entry

    def datasets(self) -> tuple[str, ...]:
        """Return the names of the datasets that hold this field."""
        return self.roots or (fmt.field_dataset(self.name),)

    def collate(self, values: Sequence[Any]) -> Any:
        """Return a batch of values as the loader delivers it (a list unless overridden)."""
        return list(values)


@dataclass(frozen=True)
class ImageField(Field):
    """The image: encoded bytes or raw pixels in ``/images``."""

    kind: ClassVar[str] = "image"
    spatial: ClassVar[bool] = True
    roots = (fmt.IMAGES, fmt.OFFSETS, fmt.SIZES, fmt.SHAPES, fmt.CHECKSUMS, fmt.SAMPLE_XXH3)


@dataclass(frozen=True)
class LabelField(Field):
    """The class label: int64 in ``/labels`` (-1 unlabelled), its names in ``/classes``."""

    kind: ClassVar[str] = "label"
    roots = (fmt.LABELS, fmt.CLASSES)

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        return torch.as_tensor(np.asarray(values, dtype=np.int64))


@dataclass(frozen=True)
class KeyField(Field):
    """The sample's name in its source (its relative path) in ``/paths``."""

    kind: ClassVar[str] = "key"
    roots = (fmt.PATHS,)


class LazyColumn:
    """A column whose values are made as they are written (here, or by a pool's ``mapper``)."""

    def __init__(self, items: Sequence[Any], make: Callable[[Any], Any], mapper: Any = None):
        self.items, self.make, self.mapper = items, make, mapper

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.make(self.items[index])  # one value, made here (verify --source)

    def values(self, encode: Callable[[Any], Any]) -> Iterable[Any]:
        """Return ``encode(make(item))`` of each item, in order, made as they are taken."""
        if self.mapper is None:
            return (encode(self.make(item)) for item in self.items)
        return cast("Iterable[Any]", self.mapper(encode, self.make, self.items))


@dataclass(frozen=True)
class StoredField(Field):
    """A field of the group ``/fields``: checked, written and read by its own class."""

    def column(self, values: Any, num: int) -> Any:
        """Return ``values`` (one per sample) checked (``OptionsError``) and in stored form."""
        raise NotImplementedError

    def take(self, column: Any, positions: np.ndarray) -> Any:
        """Return the values at ``positions`` of a column (write order, skipped left out)."""
        if isinstance(column, np.ndarray):
            return column[positions]
        if isinstance(column, LazyColumn):  # still unmade
            return LazyColumn([column.items[int(p)] for p in positions], column.make)
        return [column[int(p)] for p in positions]

    def write(self, handle: h5py.File, column: Any, *, rows_per_chunk: int) -> dict[str, str]:
        """Write a column of every sample; return the digest of each dataset written."""
        raise NotImplementedError

    def read(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:
        """Return samples ``indices``'s values from the pack or its ``FieldBlocks`` ``source``."""
        raise NotImplementedError

    def transform(
        self, value: Any, box: Any, flip: bool, size: tuple[int, int]
    ) -> Any:  # pragma: no cover - only spatial fields are transformed
        """Return ``value`` after its image's crop ``box``, resize to ``size`` and ``flip``."""
        raise NotImplementedError

    def digests(self, handle: Any) -> dict[str, str]:
        """Return the digest of each of this field's datasets as stored, a chunk at a time."""
        found = {}
        for name in self.datasets():
            data, crc = handle[name], 0
            little = data.dtype.newbyteorder("<")
            step = int(data.chunks[0]) if data.chunks else max(1, len(data))
            for start in range(0, len(data), step):
                block = np.ascontiguousarray(data[start : start + step].astype(little))
                crc = zlib.crc32(block.data, crc)
            found[name] = integrity.hex32(crc)
        return found

    def _count(self, values: Any, num: int) -> None:
        if len(values) != num:
            raise OptionsError(
                f"field {self.name!r} should have one value per sample ({num}), but got "
                f"{len(values)}"
            )


@dataclass(frozen=True)
class ScalarField(StoredField):
    """A number per sample (``dtype``: ``"<f4"``, ``"<i8"``...): ``/fields/NAME``, (N,)."""

    dtype: str = "<i8"
    kind: ClassVar[str] = "scalar"
    listed: ClassVar[tuple[str, ...]] = ("dtype", "shape")

    def __post_init__(self) -> None:
        check_name(self.name)
        object.__setattr__(self, "dtype", _numeric(self.dtype, self.name))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of one value."""
        return ()

    def column(self, values: Any, num: int) -> Any:  # noqa: D102
        data = np.asarray(values)
        self._count(data, num)
        if data.shape[1:] != self.shape:
            raise OptionsError(
                f"field {self.name!r} should hold values of shape {self.shape}, but got "
                f"{data.shape[1:]}"
            )
        return np.ascontiguousarray(data.astype(np.dtype(self.dtype)))

    def write(self, handle: h5py.File, column: Any, *, rows_per_chunk: int) -> dict[str, str]:  # noqa: D102
        (name,) = self.datasets()
        return {name: write_column(handle, name, column, rows_per_chunk)}

    def read(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:  # noqa: D102
        return list(blocks_of(source).rows(self.datasets()[0], indices))

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        return torch.from_numpy(np.stack([np.asarray(v, dtype=self.dtype) for v in values]))


@dataclass(frozen=True)
class ArrayField(ScalarField):
    """A fixed-shape array per sample (``dims``: its shape): ``/fields/NAME``, (N, *dims)."""

    dims: tuple[int, ...] = ()
    kind: ClassVar[str] = "array"

    @property
    def shape(self) -> tuple[int, ...]:  # noqa: D102
        return tuple(int(d) for d in self.dims)


@dataclass(frozen=True)
class RaggedField(StoredField):
    """A variable number of rows per sample (``dims``: one row's shape), back to back."""

    dtype: str = "<f4"
    dims: tuple[int, ...] = ()
    kind: ClassVar[str] = "ragged"
    listed: ClassVar[tuple[str, ...]] = ("dtype", "shape")

    def __post_init__(self) -> None:
        check_name(self.name)
        object.__setattr__(self, "dtype", _numeric(self.dtype, self.name))
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of one row."""
        return self.dims

    def datasets(self) -> tuple[str, ...]:  # noqa: D102
        return (fmt.field_dataset(self.name), fmt.field_dataset(self.name, fmt.FIELD_OFFSETS))

    def column(self, values: Any, num: int) -> Any:  # noqa: D102
        self._count(values, num)
        found = []
        for i, value in enumerate(values):
            array = self._value(value)
            if array.shape[1:] != self.dims:
                raise OptionsError(
                    f"field {self.name!r}: sample {i} should hold rows of shape {self.dims}, "
                    f"but got an array of shape {array.shape}"
                )
            found.append(array)
        return found

    def _value(self, value: Any) -> np.ndarray:
        return np.asarray(value, dtype=np.dtype(self.dtype)).reshape(-1, *self.dims)

    def write(self, handle: h5py.File, column: Any, *, rows_per_chunk: int) -> dict[str, str]:  # noqa: D102
        values, offsets = self.datasets()
        rows = [np.asarray(v).reshape(-1, *self.dims) for v in column]
        ends = np.zeros(len(column) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=ends[1:])
        per_sample = max(1, int(ends[-1]) // max(1, len(column)))
        flat = np.concatenate(rows) if rows else np.zeros((0, *self.dims), dtype=self.dtype)
        return {
            values: write_column(handle, values, flat, rows_per_chunk * per_sample),
            offsets: write_column(handle, offsets, ends, rows_per_chunk),
        }

    def read(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:  # noqa: D102
        values, offsets = self.datasets()
        found = blocks_of(source).spans(values, offsets, indices)
        return [self._shaped(value, shapes[k]) for k, value in enumerate(found)]

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return value

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        return [torch.from_numpy(np.ascontiguousarray(v)) for v in values]


@dataclass(frozen=True)
class CategoryField(RaggedField):
    """A class id per row (a box's category, as the source numbers it), named by ``categories``."""

    dtype: str = "<i8"
    categories: tuple[tuple[int, str], ...] = ()
    kind: ClassVar[str] = "category"
    listed: ClassVar[tuple[str, ...]] = ("categories",)


@dataclass(frozen=True)
class MultiLabelField(RaggedField):
    """Several class ids per sample (int64, in ``0 .. len(classes) - 1``), named by ``classes``."""

    dtype: str = "<i8"
    classes: tuple[str, ...] = ()
    kind: ClassVar[str] = "multilabel"
    listed: ClassVar[tuple[str, ...]] = ("classes",)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        if np.dtype(self.dtype).kind not in "iu" or self.dims != ():
            raise OptionsError(
                f"field {self.name!r} holds class ids: dtype should be an integer and dims (), "
                f"but got dtype={self.dtype} and dims={self.dims}"
            )

    def _value(self, value: Any) -> np.ndarray:
        ids = super()._value(value)
        outside = ids[(ids < 0) | (ids >= len(self.classes))]
        if outside.size:
            raise OptionsError(
                f"field {self.name!r} holds ids of its {len(self.classes)} classes, but got "
                f"{int(outside[0])}"
            )
        return ids

    def names(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Return the class names of ``ids`` (one sample's value)."""
        return [self.classes[int(i)] for i in ids]


@dataclass(frozen=True)
class BytesField(RaggedField):
    """Bytes per sample: ``/fields/NAME`` (uint8) and its offsets."""

    dtype: str = "|u1"
    kind: ClassVar[str] = "bytes"
    listed: ClassVar[tuple[str, ...]] = ()

    def _value(self, value: Any) -> np.ndarray:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise OptionsError(f"field {self.name!r} holds bytes, but got {type(value).__name__}")
        return np.frombuffer(bytes(value), dtype=np.uint8)

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return value.tobytes()

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        return list(values)


@dataclass(frozen=True)
class TextField(BytesField):
    """UTF-8 text per sample (a caption): stored as its bytes."""

    kind: ClassVar[str] = "text"

    def _value(self, value: Any) -> np.ndarray:
        if not isinstance(value, str):
            raise OptionsError(f"field {self.name!r} holds text, but got {type(value).__name__}")
        return np.frombuffer(value.encode("utf-8"), dtype=np.uint8)

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return value.tobytes().decode("utf-8")


@dataclass(frozen=True)
class JSONField(TextField):
    """A JSON value per sample (an object, a list, a number...), stored as its UTF-8 text."""

    kind: ClassVar[str] = "json"

    def _value(self, value: Any) -> np.ndarray:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise OptionsError(f"field {self.name!r} holds JSON values: {err}") from err
        return super()._value(text)

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return json.loads(value.tobytes().decode("utf-8"))


def check_name(name: str) -> None:
    """Raise ``OptionsError`` unless ``name`` is an identifier other than image, label, key."""
    if not _NAME.match(name) or name in (IMAGE, LABEL, KEY):
        raise OptionsError(
            f"a field's name should be a Python identifier other than {IMAGE!r}, {LABEL!r} "
            f"and {KEY!r}, but got {name!r}"
        )


def _numeric(dtype: str, name: str) -> str:
    found = np.dtype(dtype)
    if found.kind not in "biuf":
        raise OptionsError(f"field {name!r} should hold numbers, but got dtype {found}")
    return found.newbyteorder("<").str if found.itemsize > 1 else found.str


def write_column(handle: h5py.File, name: str, data: np.ndarray, rows: int) -> str:
    """Write ``data`` as the dataset ``name`` in chunks of ``rows``; return its digest."""
    data = np.ascontiguousarray(data)
    chunks = (max(1, min(rows, len(data))), *data.shape[1:]) if len(data) else None
    handle.create_dataset(name, data=data, chunks=chunks)
    return integrity.array_digest(data, data.dtype.newbyteorder("<").str)
