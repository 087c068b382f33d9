"""A sample is a record of fields: one small class per kind of value a pack stores.

Each ``Field`` knows its datasets (``core.format`` spells their names), how to check and
write a column of values (one per sample, in pack order), how to read the values of some
samples back, how to collate a batch of them and, for a spatial field, how the image's
crop and flip apply to it. The pack lists its fields in the root attribute
``format.FIELDS_KEY`` (JSON, covered by ``metadata_crc32``); a pack written before the
listing holds the three fields ``LEGACY_FIELDS``: ``image``, ``label`` and ``key``.

NOTE [ Stored fields ]: the image, the label and the key keep the root datasets of format
1.0 (the images pipeline writes and reads them). Every other field lives under the group
``/fields``: a fixed-size value per sample as one ``(N, *shape)`` dataset, a variable one
as its values back to back plus ``NAME.offsets`` (int64, N + 1), like an encoded image
blob. Their chunks hold the samples of about one image chunk, so the samples of a group are
read in one or two chunk reads per dataset. Each dataset's CRC32 is in ``metadata_crc32``
(``h5pack verify`` checks it).
"""

from __future__ import annotations

import functools
import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import h5py
import numpy as np

from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.errors import FormatError, OptionsError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Field:
    """One named value of every sample: the base of every kind.

    Attributes:
        name: The field's name (a Python identifier): the key of its batch entry.
    """

    name: str
    kind: ClassVar[str] = ""
    spatial: ClassVar[bool] = False  # transformed with the image's crop and flip

    def to_dict(self) -> dict[str, Any]:
        """Return the field's entry of the pack's listing (JSON-ready)."""
        return {"name": self.name, "kind": self.kind}

    def datasets(self) -> tuple[str, ...]:
        """Return the names of the datasets that hold this field."""
        return (fmt.field_dataset(self.name),)

    def collate(self, values: Sequence[Any]) -> Any:
        """Return a batch of values as the loader delivers it (a list unless overridden)."""
        return list(values)


@dataclass(frozen=True)
class ImageField(Field):
    """The image: encoded bytes or raw pixels in ``/images`` (``core.format``'s storages)."""

    kind: ClassVar[str] = "image"
    spatial: ClassVar[bool] = True

    def datasets(self) -> tuple[str, ...]:  # noqa: D102
        return (fmt.IMAGES, fmt.OFFSETS, fmt.SIZES, fmt.SHAPES, fmt.CHECKSUMS, fmt.SAMPLE_XXH3)


@dataclass(frozen=True)
class LabelField(Field):
    """The class label: int64 in ``/labels`` (-1 unlabelled), its names in ``/classes``."""

    kind: ClassVar[str] = "label"

    def datasets(self) -> tuple[str, ...]:  # noqa: D102
        return (fmt.LABELS, fmt.CLASSES)

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        return torch.as_tensor(np.asarray(values, dtype=np.int64))


@dataclass(frozen=True)
class KeyField(Field):
    """The sample's name in its source (its relative path) in ``/paths``."""

    kind: ClassVar[str] = "key"

    def datasets(self) -> tuple[str, ...]:  # noqa: D102
        return (fmt.PATHS,)


@dataclass(frozen=True)
class StoredField(Field):
    """A field of the group ``/fields``: checked, written and read by its own class."""

    def column(self, values: Any, num: int) -> Any:
        """Return ``values`` (one per sample) checked and in their stored form.

        Raises:
            OptionsError: not one value per sample, or a value of the wrong type or shape.
        """
        raise NotImplementedError

    def take(self, column: Any, positions: np.ndarray) -> Any:
        """Return the values at ``positions`` of a column (write order, skipped left out)."""
        if isinstance(column, np.ndarray):
            return column[positions]
        return [column[int(p)] for p in positions]

    def write(self, handle: h5py.File, column: Any, *, rows_per_chunk: int) -> dict[str, str]:
        """Write a column of every sample; return the digest of each dataset written."""
        raise NotImplementedError

    def read(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:
        """Return the values of samples ``indices`` (``shapes``: their images' (H, W, C)).

        ``source`` is the open pack, or a reader's ``FieldBlocks`` over it.
        """
        raise NotImplementedError

    def transform(
        self, value: Any, box: Any, flip: bool, size: tuple[int, int]
    ) -> Any:  # pragma: no cover - only spatial fields are transformed
        """Return ``value`` after its image's crop ``box``, resize to ``size`` and ``flip``."""
        raise NotImplementedError

    def digests(self, handle: Any) -> dict[str, str]:
        """Return the digest of each of this field's datasets as stored (``verify``)."""
        found = {}
        for name in self.datasets():
            data = handle[name][()]
            found[name] = integrity.array_digest(data, data.dtype.newbyteorder("<").str)
        return found

    def _count(self, values: Any, num: int) -> None:
        if len(values) != num:
            raise OptionsError(
                f"field {self.name!r} should have one value per sample ({num}), but got "
                f"{len(values)}"
            )


@dataclass(frozen=True)
class ScalarField(StoredField):
    """A number per sample (int or float): ``/fields/NAME``, shape (N,).

    Attributes:
        dtype: Its numpy dtype, little-endian (``"<f4"``, ``"<i8"``...).
    """

    dtype: str = "<i8"
    kind: ClassVar[str] = "scalar"

    def __post_init__(self) -> None:
        _check_name(self.name)
        object.__setattr__(self, "dtype", _numeric(self.dtype, self.name))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of one value."""
        return ()

    def to_dict(self) -> dict[str, Any]:  # noqa: D102
        return {**super().to_dict(), "dtype": self.dtype, "shape": list(self.shape)}

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
        return {self.datasets()[0]: _write(handle, self.datasets()[0], column, rows_per_chunk)}

    def read(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:  # noqa: D102
        return list(blocks_of(source).rows(self.datasets()[0], indices))

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        return torch.from_numpy(np.stack([np.asarray(v, dtype=self.dtype) for v in values]))


@dataclass(frozen=True)
class ArrayField(ScalarField):
    """A fixed-shape array per sample: ``/fields/NAME``, shape (N, *shape).

    Attributes:
        dims: The shape of one value.
    """

    dims: tuple[int, ...] = ()
    kind: ClassVar[str] = "array"

    @property
    def shape(self) -> tuple[int, ...]:  # noqa: D102
        return tuple(int(d) for d in self.dims)


@dataclass(frozen=True)
class RaggedField(StoredField):
    """A variable number of rows per sample (boxes: n x 4 float32): values and offsets.

    ``/fields/NAME`` holds every sample's rows back to back, shape (total, *dims);
    ``/fields/NAME.offsets`` (int64, N + 1) where each sample's rows start.

    Attributes:
        dtype: The values' numpy dtype, little-endian.
        dims: The shape of one row (``(4,)`` for boxes; ``()`` for a list of numbers).
    """

    dtype: str = "<f4"
    dims: tuple[int, ...] = ()
    kind: ClassVar[str] = "ragged"

    def __post_init__(self) -> None:
        _check_name(self.name)
        object.__setattr__(self, "dtype", _numeric(self.dtype, self.name))
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    def to_dict(self) -> dict[str, Any]:  # noqa: D102
        return {**super().to_dict(), "dtype": self.dtype, "shape": list(self.dims)}

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

    def _flat(self, column: Sequence[Any]) -> np.ndarray:
        if not column:
            return np.zeros((0, *self.dims), dtype=self.dtype)
        return np.concatenate([np.asarray(v).reshape(-1, *self.dims) for v in column])

    def write(self, handle: h5py.File, column: Any, *, rows_per_chunk: int) -> dict[str, str]:  # noqa: D102
        values, offsets = self.datasets()
        counts = [len(np.asarray(v).reshape(-1, *self.dims)) for v in column]
        ends = np.zeros(len(column) + 1, dtype=np.int64)
        np.cumsum(counts, out=ends[1:])
        per_sample = max(1, int(ends[-1]) // max(1, len(column)))
        return {
            values: _write(handle, values, self._flat(column), rows_per_chunk * per_sample),
            offsets: _write(handle, offsets, ends, rows_per_chunk),
        }

    def read(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:  # noqa: D102
        blocks = blocks_of(source)
        values, offsets = self.datasets()
        idx = np.asarray(indices, dtype=np.int64)
        bounds = blocks.rows(offsets, np.concatenate([idx, idx + 1])).tolist()
        step = blocks.step(values)
        return [
            self._shaped(blocks.span(values, start, stop, step), shapes[k])
            for k, (start, stop) in enumerate(
                zip(bounds[: idx.size], bounds[idx.size :], strict=True)
            )
        ]

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return value

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        return [torch.from_numpy(np.ascontiguousarray(v)) for v in values]


@dataclass(frozen=True)
class BytesField(RaggedField):
    """Bytes per sample: ``/fields/NAME`` (uint8) and its offsets."""

    dtype: str = "|u1"
    kind: ClassVar[str] = "bytes"

    def to_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"name": self.name, "kind": self.kind}

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
class MaskField(BytesField):
    """An H x W uint8 mask per sample that follows its image's geometry.

    Stored like a raw image blob (each mask's H * W bytes, with offsets); its shape is its
    image's, so a crop, resize and flip of the image apply to it (``transform``: nearest
    neighbour, values kept).
    """

    kind: ClassVar[str] = "mask"
    spatial: ClassVar[bool] = True

    def _value(self, value: Any) -> np.ndarray:
        mask = np.asarray(value)
        if mask.ndim != 2 or mask.dtype != np.uint8:
            raise OptionsError(
                f"field {self.name!r} holds H x W uint8 masks, but got shape {mask.shape} "
                f"and dtype {mask.dtype}"
            )
        return np.ascontiguousarray(mask).reshape(-1)

    def column(self, values: Any, num: int) -> Any:  # noqa: D102
        self._count(values, num)
        for value in values:
            self._value(value)
        return [np.asarray(v) for v in values]

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return value.reshape(int(shape[0]), int(shape[1]))

    def fit(self, mask: np.ndarray, height: int, width: int) -> np.ndarray:
        """Return ``mask`` at its image's stored size (the image may be resized at writing)."""
        if mask.shape == (height, width):
            return mask
        return nearest(mask, (0, 0, *mask.shape), (height, width))

    def transform(
        self, mask: np.ndarray, box: Any, flip: bool, size: tuple[int, int]
    ) -> np.ndarray:
        """Return ``mask`` cut to ``box`` (top, left, height, width), resized and flipped."""
        out = nearest(mask, tuple(int(v) for v in box), size)
        return out[:, ::-1] if flip else out

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        if values and all(v.shape == values[0].shape for v in values):
            return torch.from_numpy(np.stack(values))
        return [torch.from_numpy(np.ascontiguousarray(v)) for v in values]


@dataclass(frozen=True)
class BoxesField(RaggedField):
    """Boxes per sample, n x 4 float32 ``(x1, y1, x2, y2)`` in image pixels: spatial.

    Stored as a ragged field; a crop moves, scales and clips them, a flip mirrors them.
    Every box stays (a box outside the crop keeps zero area), so that per-box fields
    stored beside it stay aligned.
    """

    dims: tuple[int, ...] = (4,)
    kind: ClassVar[str] = "boxes"
    spatial: ClassVar[bool] = True

    def to_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype}

    def transform(
        self, boxes: np.ndarray, box: Any, flip: bool, size: tuple[int, int]
    ) -> np.ndarray:
        """Return ``boxes`` in the pixels of the image cut to ``box`` and resized to ``size``."""
        top, left, height, width = (float(v) for v in box)
        out_h, out_w = size
        scale = np.array([out_w / width, out_h / height] * 2, dtype=np.float64)
        shift = np.array([left, top] * 2, dtype=np.float64)
        moved = (np.asarray(boxes, dtype=np.float64).reshape(-1, 4) - shift) * scale
        moved = np.clip(moved, 0, [out_w, out_h, out_w, out_h])
        if flip:
            moved[:, [0, 2]] = out_w - moved[:, [2, 0]]
        return moved.astype(self.dtype)


def nearest(source: np.ndarray, box: tuple[int, ...], size: tuple[int, int]) -> np.ndarray:
    """Return the ``box`` (top, left, height, width) of ``source`` resized to ``size``.

    Nearest neighbour by pixel centres (OpenCV's exact mode, Pillow's rule): values kept.
    """
    import cv2  # here: h5pack info and convert start without OpenCV

    top, left, height, width = box
    cut = source[top : top + height, left : left + width]
    return np.asarray(cv2.resize(cut, (size[1], size[0]), interpolation=cv2.INTER_NEAREST_EXACT))


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
    )
}
IMAGE, LABEL, KEY = fmt.IMAGE_FIELD, fmt.LABEL_FIELD, fmt.KEY_FIELD
# What a pack written before the listing holds (every format 1.0 and 1.1 pack until now).
LEGACY_FIELDS: tuple[Field, ...] = (ImageField(IMAGE), LabelField(LABEL), KeyField(KEY))


def field_from_dict(data: Mapping[str, Any]) -> Field:
    """Return the field of one entry of a pack's listing.

    Raises:
        FormatError: an unknown kind (a pack written by a newer h5pack) or a bad entry.
    """
    kind, name = data.get("kind"), str(data.get("name"))
    cls = KINDS.get(str(kind))
    if cls is None:
        raise FormatError(
            f"field {name!r} is of kind {kind!r}, which this h5pack does not read (it reads "
            f"{', '.join(KINDS)}); upgrade h5pack"
        )
    if cls in (ImageField, LabelField, KeyField, BytesField, TextField, MaskField):
        return cls(name)
    shape = tuple(int(d) for d in data.get("shape", ()))
    if cls is ScalarField:
        return ScalarField(name, str(data["dtype"]))
    if cls is ArrayField:
        return ArrayField(name, str(data["dtype"]), shape)
    if cls is BoxesField:
        return BoxesField(name, str(data["dtype"]))
    return RaggedField(name, str(data["dtype"]), shape)


def fields_text(fields: Sequence[Field]) -> str:
    """Return the listing attribute's text."""
    return json.dumps([f.to_dict() for f in fields])


@functools.lru_cache(maxsize=64)  # read at every batch of a dataset of fields
def parse_fields(text: str | None, path: str) -> tuple[Field, ...]:
    """Return a pack's fields from its listing; ``LEGACY_FIELDS`` when it has none.

    Raises:
        FormatError: the listing is not a JSON list of known fields.
    """
    if text is None:
        return LEGACY_FIELDS
    try:
        entries = json.loads(text)
        fields = tuple(field_from_dict(e) for e in entries)
    except FormatError as err:
        raise FormatError(f"{path}: {err}") from err
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise FormatError(
            f"{path}: the field listing cannot be read ({err}); {fmt.DAMAGED}"
        ) from err
    return fields


def fields_of(meta: fmt.PackMeta) -> tuple[Field, ...]:
    """Return the fields of the pack ``meta`` describes (``LEGACY_FIELDS`` for older packs).

    Raises:
        FormatError: the listing cannot be read, or names a kind this h5pack does not know.
    """
    return parse_fields(meta.field_listing, meta.path)


def stored_fields(fields: Sequence[Field]) -> tuple[StoredField, ...]:
    """Return the fields of the group ``/fields`` (every one but image, label and key)."""
    return tuple(f for f in fields if isinstance(f, StoredField))


def make_field(name: str, values: Any) -> StoredField:
    """Return the field that stores ``values`` (one per sample) as ``write_arrays`` infers it.

    Numbers: a scalar; equal-shape arrays: an array field; ``str``: text; ``bytes``:
    bytes; 2-D uint8 arrays of several shapes: raise (say ``MaskField`` or
    ``RaggedField``); arrays of several lengths: ragged. Pass a ``Field`` for anything
    else (a mask, whose shape always varies with its image's).

    Raises:
        OptionsError: the kind cannot be told from the values.
    """
    _check_name(name)
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


def _check_name(name: str) -> None:
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


def _write(handle: h5py.File, name: str, data: np.ndarray, rows: int) -> str:
    """Write ``data`` as the dataset ``name`` in chunks of ``rows``; return its digest."""
    data = np.ascontiguousarray(data)
    chunks = (max(1, min(rows, len(data))), *data.shape[1:]) if len(data) else None
    handle.create_dataset(name, data=data, chunks=chunks)
    return integrity.array_digest(data, data.dtype.newbyteorder("<").str)


class FieldBlocks:
    """Chunks of the stored fields' datasets read whole and kept (NOTE [ Stored fields ]).

    A batch's samples come from a few image chunks, each served over several batches: each
    chunk of a field is read once while its samples are served, not once per batch.

    Args:
        handle: The open pack (h5py, or a remote pack's index file).
        keep_bytes: Bytes of chunks kept, the least recently used dropped first.
    """

    def __init__(self, handle: Any, keep_bytes: int = 64 << 20) -> None:
        self.handle, self.keep_bytes = handle, keep_bytes
        self._held: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._bytes = 0

    def _block(self, name: str, chunk: int, step: int) -> np.ndarray:
        key = (name, chunk)
        block = self._held.get(key)
        if block is None:
            block = np.asarray(self.handle[name][chunk * step : (chunk + 1) * step])
            self._held[key] = block
            self._bytes += block.nbytes
            while self._bytes > self.keep_bytes and len(self._held) > 1:
                self._bytes -= self._held.popitem(last=False)[1].nbytes
        self._held.move_to_end(key)
        return block

    def step(self, name: str) -> int:
        """Return the rows of one chunk of the dataset ``name``."""
        dataset = self.handle[name]
        return int(dataset.chunks[0]) if dataset.chunks else max(1, int(dataset.shape[0]))

    def rows(self, name: str, indices: np.ndarray) -> np.ndarray:
        """Return rows ``indices`` of the dataset ``name``."""
        step = self.step(name)
        found = [self._block(name, int(i) // step, step)[int(i) % step] for i in indices]
        return np.stack(found) if found else np.zeros(0, dtype=np.int64)

    def span(self, name: str, start: int, stop: int, step: int) -> np.ndarray:
        """Return a copy of rows ``start:stop`` of the dataset ``name`` (``step``: ``step()``)."""
        pieces = [
            self._block(name, chunk, step)[
                max(start - chunk * step, 0) : min(stop - chunk * step, step)
            ]
            for chunk in range(start // step, max(start, stop - 1) // step + 1)
        ]
        return pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces)


def blocks_of(source: Any) -> FieldBlocks:
    """Return ``source`` as ``FieldBlocks``: a reader's own, or new ones over a handle."""
    return source if isinstance(source, FieldBlocks) else FieldBlocks(source)


def columns_of(
    given: Mapping[str | Field, Any], num: int
) -> tuple[tuple[StoredField, ...], dict[str, Any]]:
    """Return the fields and checked columns of ``write_arrays``'s ``fields=``.

    Args:
        given: Values per sample by field: the key a name (the kind told from the values,
            ``make_field``) or a ``StoredField``.
        num: Samples.

    Raises:
        OptionsError: a name given twice, a key that is no stored field, or values that do
            not fit their field.
    """
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
    return tuple(fields), columns


def read_values(
    source: Any, meta: fmt.PackMeta, indices: np.ndarray, names: Sequence[str]
) -> dict[str, list[Any]]:
    """Return the values of the stored fields ``names`` for samples ``indices``.

    ``source`` is the open pack (h5py, or a remote pack's index file) or a reader's
    ``FieldBlocks`` over it; the image, label and key are read by the reader
    (``PackReader``) and skipped here.

    Raises:
        FormatError: a field cannot be read (damage).
    """
    listed = {f.name: f for f in stored_fields(fields_of(meta))}
    idx = np.asarray(indices, dtype=np.int64)
    shapes = meta.shapes[idx] if len(meta.shapes) else np.zeros((idx.size, 3), np.int32)
    found = {}
    for name in names:
        if name in listed:
            with fmt.reading(meta.path, f"field {name!r}"):
                found[name] = listed[name].read(source, idx, shapes)
    return found


def selected(meta: fmt.PackMeta, names: Sequence[str] | None, *, key: bool) -> tuple[str, ...]:
    """Return the fields a dataset delivers: ``names``, or every listed one (``key`` if asked).

    Raises:
        OptionsError: a name the pack does not list.
    """
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
