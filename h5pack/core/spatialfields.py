"""The fields that follow their image's geometry: a crop, resize and flip apply to them.

One pixel rule (``grid``, nearest neighbour at each output pixel's centre, as Pillow and
OpenCV) and one box scale, so masks, boxes and the image agree.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import h5py
import numpy as np

from h5pack.core import integrity
from h5pack.core.fieldblocks import blocks_of
from h5pack.core.fieldkinds import (
    ArrayField,
    BytesField,
    LazyColumn,
    MultiLabelField,
    RaggedField,
    write_column,
)
from h5pack.errors import OptionsError

# Bytes of one chunk of a mask field when its first chunk's samples hold none, and the most.
MASK_CHUNK_BYTES, MAX_MASK_CHUNK_BYTES = 1 << 20, 1 << 30
MASK_ZSTD_LEVEL = 3  # decision 0055


def grid(box: Sequence[int], size: tuple[int, int], flip: bool) -> tuple[np.ndarray, np.ndarray]:
    """Return the source rows and columns of ``box`` (top, left, height, width) at ``size``."""
    top, left, height, width = (int(v) for v in box)
    rows = top + ((np.arange(size[0]) + 0.5) * (height / size[0])).astype(np.int64)
    cols = left + ((np.arange(size[1]) + 0.5) * (width / size[1])).astype(np.int64)
    return rows, cols[::-1] if flip else cols


def nearest(
    source: np.ndarray, box: Sequence[int], size: tuple[int, int], flip: bool = False
) -> np.ndarray:
    """Return the ``box`` (top, left, height, width) of ``source`` resized to ``size``."""
    rows, cols = grid(box, size, flip)
    return np.ascontiguousarray(source.take(rows, axis=-2).take(cols, axis=-1))


@dataclass(frozen=True)
class MaskField(BytesField):
    """An H x W uint8 mask per sample that follows its image's geometry, Zstandard-compressed."""

    kind: ClassVar[str] = "mask"
    spatial: ClassVar[bool] = True
    axes: ClassVar[str] = "H x W"  # a value's dimensions, as messages name them

    def _value(self, value: Any) -> np.ndarray:
        mask = np.asarray(value)
        if mask.ndim != len(self.axes.split(" x ")) or mask.dtype != np.uint8:
            raise OptionsError(
                f"field {self.name!r} holds {self.axes} uint8 masks, but got shape {mask.shape} "
                f"and dtype {mask.dtype}"
            )
        return np.ascontiguousarray(mask).reshape(-1)

    def column(self, values: Any, num: int) -> Any:  # noqa: D102
        self._count(values, num)
        if isinstance(values, LazyColumn):
            return values
        for value in values:
            self._value(value)
        return [np.asarray(v) for v in values]

    def write(self, handle: h5py.File, column: Any, *, rows_per_chunk: int) -> dict[str, str]:  # noqa: D102
        (name, offsets), ends, crc, pending = self.datasets(), [0], 0, []
        dataset: h5py.Dataset | None = None
        lazy = isinstance(column, LazyColumn)
        for i, value in enumerate(column.values(self._value) if lazy else map(self._value, column)):
            pending.append(value)
            ends.append(ends[-1] + pending[-1].size)
            if len(pending) < rows_per_chunk and i + 1 < len(column):
                continue
            block = np.concatenate(pending)
            pending, crc = [], zlib.crc32(block.data, crc)
            if dataset is None:  # a chunk: the first rows_per_chunk samples' bytes
                dataset = _mask_dataset(handle, name, block.size)
            dataset.resize((ends[-1],))
            dataset[ends[-1] - block.size : ends[-1]] = block
        if dataset is None:
            _mask_dataset(handle, name, 0)
        digest = write_column(handle, offsets, np.asarray(ends, dtype=np.int64), rows_per_chunk)
        return {name: integrity.hex32(crc), offsets: digest}

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return value.reshape(int(shape[0]), int(shape[1]))

    def transform(
        self, mask: np.ndarray, box: Any, flip: bool, size: tuple[int, int]
    ) -> np.ndarray:
        """Return ``mask`` cut to ``box`` (top, left, height, width), resized and flipped."""
        return nearest(mask, box, size, flip)

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        if values and all(v.shape == values[0].shape for v in values):
            return torch.from_numpy(np.stack(values))
        return [torch.from_numpy(np.ascontiguousarray(v)) for v in values]


# NOTE [ Instance masks on disk ]
# A sample's n masks are one blob: ``n``, each mask's window (the smallest box holding its
# ones) and each window's rows bit-packed (docs/format.md). An object covers a small part
# of its image, so a blob is a small fraction of n x H x W bytes, and a crop unpacks only
# the rows of the windows it keeps, never the image's n x H x W.


@dataclass(frozen=True)
class InstanceMasksField(MaskField):
    """n x H x W masks of 0 and 1 per sample, row ``k`` the ``k``-th box's (bit-packed)."""

    kind: ClassVar[str] = "masks"
    axes: ClassVar[str] = "n x H x W"

    def _value(self, value: Any) -> np.ndarray:
        masks = np.asarray(value)
        if masks.ndim != 3 or masks.dtype not in (np.uint8, np.bool_) or masks.max(initial=0) > 1:
            raise OptionsError(
                f"field {self.name!r} holds n x H x W masks of 0 and 1 (uint8 or bool), but "
                f"got shape {masks.shape} and dtype {masks.dtype}"
            )
        return pack_masks(masks.astype(np.uint8, copy=False))

    def read_packed(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:
        """Return each sample's blob as stored (``transform`` takes it)."""
        values, offsets = self.datasets()
        return blocks_of(source).spans(values, offsets, indices)

    def count(self, value: np.ndarray) -> int:
        """Return the masks of ``value`` (n x H x W, or a blob as ``read_packed`` gives it)."""
        if value.ndim == 1:
            return int(value[:4].view("<i4")[0])
        return int(value.shape[0])

    def read(self, source: Any, indices: np.ndarray, shapes: np.ndarray) -> list[Any]:  # noqa: D102
        blobs = self.read_packed(source, indices, shapes)
        return [unpack_masks(b, (int(s[0]), int(s[1]))) for b, s in zip(blobs, shapes, strict=True)]

    def transform(
        self, value: np.ndarray, box: Any, flip: bool, size: tuple[int, int]
    ) -> np.ndarray:
        """Return the masks of ``value`` (n x H x W, or a blob) cut to ``box``, resized, flipped."""
        blob = value if value.ndim == 1 else pack_masks(value)
        return cut_masks([blob], np.asarray([box]), np.asarray([flip]), size)[0]

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

        return [v if torch.is_tensor(v) else torch.from_numpy(v) for v in values]


def pack_masks(masks: np.ndarray) -> np.ndarray:
    """Return n x H x W masks of 0 and 1 as one blob (NOTE [ Instance masks on disk ])."""
    header, pieces = [masks.shape[0]], []
    for mask in masks:
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        if rows.size == 0:
            header += [0, 0, 0, 0]
            continue
        top, left, bottom, right = rows[0], cols[0], rows[-1] + 1, cols[-1] + 1
        header += [top, left, bottom - top, right - left]
        pieces.append(np.packbits(mask[top:bottom, left:right], axis=1).reshape(-1))
    head = np.asarray(header, dtype="<i4").view(np.uint8)
    return np.concatenate([head, *pieces]) if pieces else head


def _windows(blob: np.ndarray) -> tuple[np.ndarray, Any]:
    """A blob's windows (n x 4) and a function giving mask ``k``'s packed rows."""
    count = int(blob[:4].view("<i4")[0])
    windows = blob[4 : 4 + 16 * count].view("<i4").reshape(count, 4).astype(np.int64)
    widths = (windows[:, 3] + 7) // 8
    starts = (4 + 16 * count + np.concatenate([[0], np.cumsum(windows[:, 2] * widths)])).tolist()
    heights, widths = windows[:, 2].tolist(), widths.tolist()

    def rows_of(k: int) -> np.ndarray:
        return blob[starts[k] : starts[k + 1]].reshape(heights[k], widths[k])

    return windows, rows_of


def cut_masks(
    blobs: Sequence[np.ndarray],
    crops: np.ndarray,
    flips: np.ndarray,
    size: tuple[int, int],
    alloc: Any = None,
    keep: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Cut a batch's mask blobs to their crops, resized and flipped, into one array."""
    parsed = [_windows(blob) for blob in blobs]
    if keep is not None:
        starts = np.cumsum([0] + [len(windows) for windows, _ in parsed])
        chosen = [np.flatnonzero(keep[a:b]) for a, b in itertools.pairwise(starts)]
        parsed = [
            (w[c], _picked(rows_of, c)) for (w, rows_of), c in zip(parsed, chosen, strict=True)
        ]
    ends = np.cumsum([len(windows) for windows, _ in parsed], dtype=np.int64)
    shape = (int(ends[-1]) if ends.size else 0, *size)
    out = np.zeros(shape, np.uint8) if alloc is None else alloc(shape)
    if alloc is not None:
        out.fill(0)
    width = size[1]
    for (windows, rows_of), crop, flip, end in zip(
        parsed, crops, flips, ends.tolist(), strict=True
    ):
        if not len(windows):
            continue
        rows, cols = grid(crop, size, False)
        tops, lefts = windows[:, 0], windows[:, 1]
        n = len(windows)
        r0 = np.searchsorted(rows, np.concatenate([tops, tops + windows[:, 2]])).tolist()
        c0 = np.searchsorted(cols, np.concatenate([lefts, lefts + windows[:, 3]])).tolist()
        r1, c1 = r0[n:], c0[n:]
        top, left, _, wide = windows.T.tolist()
        for k, mask in enumerate(out[end - n : end]):
            if r0[k] == r1[k] or c0[k] == c1[k]:
                continue
            packed = rows_of(k).take(rows[r0[k] : r1[k]] - top[k], axis=0)
            bits = np.unpackbits(packed, axis=1, count=wide[k])
            picked = cols[c0[k] : c1[k]] - left[k]
            if flip:  # the columns taken right to left, into the mirrored place
                target = mask[r0[k] : r1[k], width - c1[k] : width - c0[k]]
                picked = picked[::-1]
            else:
                target = mask[r0[k] : r1[k], c0[k] : c1[k]]
            bits.take(picked, axis=1, out=target, mode="clip")  # in place: no copy
    return np.split(out, ends[:-1])


def _picked(rows_of: Any, chosen: np.ndarray) -> Any:
    """``rows_of`` of the masks ``chosen``, numbered from 0."""
    return lambda k: rows_of(int(chosen[k]))


def unpack_masks(blob: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Return the n x H x W masks of a blob (``size``: its image's (H, W))."""
    windows, rows_of = _windows(blob)
    out = np.zeros((len(windows), *size), dtype=np.uint8)
    for k, (top, left, height, width) in enumerate(windows.tolist()):
        if height:
            window = np.unpackbits(rows_of(k), axis=1, count=width)
            out[k, top : top + height, left : left + width] = window
    return out


def _mask_dataset(handle: h5py.File, name: str, chunk: int) -> h5py.Dataset:
    """Create the growing, Zstandard-compressed uint8 dataset of a mask field."""
    import hdf5plugin

    chunk = min(chunk or MASK_CHUNK_BYTES, MAX_MASK_CHUNK_BYTES)
    return handle.create_dataset(
        name,
        shape=(0,),
        maxshape=(None,),
        dtype=np.uint8,
        chunks=(chunk,),
        **hdf5plugin.Zstd(clevel=MASK_ZSTD_LEVEL),
    )


@dataclass(frozen=True)
class BoxesField(RaggedField):
    """Boxes per sample, n x 4 float32 ``(x1, y1, x2, y2)``: a crop drops one under a pixel wide.

    The rows of the fields named in ``per_box`` go with it (None: found at write).
    """

    dims: tuple[int, ...] = (4,)
    per_box: tuple[str, ...] | None = None
    kind: ClassVar[str] = "boxes"
    spatial: ClassVar[bool] = True

    def to_dict(self) -> dict[str, Any]:  # noqa: D102
        entry = {"name": self.name, "kind": self.kind, "dtype": self.dtype}
        return {**entry, "per_box": list(self.per_box)} if self.per_box else entry


def move_boxes(
    boxes: np.ndarray, crops: np.ndarray, flips: np.ndarray, size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Move a batch's boxes into their crops, resized and flipped; return them and which stay."""
    out_h, out_w = size
    scale = np.stack([out_w / crops[:, 3], out_h / crops[:, 2]] * 2, axis=1)
    shift = crops[:, [1, 0, 1, 0]].astype(np.float64)
    moved = np.clip((boxes.astype(np.float64) - shift) * scale, 0, [out_w, out_h, out_w, out_h])
    moved[flips] = moved[flips][:, [2, 1, 0, 3]] * [-1, 1, -1, 1] + [out_w, 0, out_w, 0]
    keep = (moved[:, 2] - moved[:, 0] >= 1) & (moved[:, 3] - moved[:, 1] >= 1)
    return moved, keep


def check_per_box(fields: Sequence[Any], columns: dict[str, Any], num: int) -> tuple[Any, ...]:
    """Return ``fields`` with each ``BoxesField``'s ``per_box`` found or checked.

    Found: the ragged fields and instance masks with a row per box in every sample (an
    array field that has one becomes ragged).
    """
    boxes = [f for f in fields if isinstance(f, BoxesField)]
    if not boxes:
        return tuple(fields)
    counts = [len(b) for b in columns[boxes[0].name]]
    fields = [_ragged(f, columns, counts) if isinstance(f, ArrayField) else f for f in fields]
    lazy = {n for n, column in columns.items() if isinstance(column, LazyColumn)}
    rowed = [  # a lazy column's masks are made as they are written: not counted here
        f.name
        for f in fields
        if isinstance(f, InstanceMasksField)
        or (
            isinstance(f, RaggedField)
            and not isinstance(f, BoxesField | BytesField | MultiLabelField)
        )  # a multi-label is a set of the image's classes, never a box's
    ]
    found = []
    for field in fields:
        if isinstance(field, BoxesField):
            counts = [len(b) for b in columns[field.name]]
            if field.per_box is None:
                names = [
                    n for n in rowed if n not in lazy and [len(v) for v in columns[n]] == counts
                ]
                field = BoxesField(field.name, field.dtype, field.dims, tuple(names))
            for name in set(field.per_box or ()) - lazy:
                if name not in rowed:
                    raise OptionsError(
                        f"field {field.name!r}: per_box names {name!r}, which is no ragged "
                        f"field or instance masks of this pack ({rowed})"
                    )
                wrong = next((i for i in range(num) if len(columns[name][i]) != counts[i]), None)
                if wrong is not None:
                    raise OptionsError(
                        f"field {name!r} of sample {wrong} holds {len(columns[name][wrong])} "
                        f"rows, but its {counts[wrong]} boxes in {field.name!r} (per_box)"
                    )
        found.append(field)
    return tuple(found)


def _ragged(field: ArrayField, columns: dict[str, Any], counts: list[int]) -> Any:
    """An array field with a row per box in every sample, as a ragged field (``columns`` too)."""
    if not field.shape or any(c != field.shape[0] for c in counts):
        return field
    columns[field.name] = list(columns[field.name])
    return RaggedField(field.name, field.dtype, field.shape[1:])
