"""The fields that follow their image's geometry: a crop, resize and flip apply to them."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import h5py
import numpy as np

from h5pack.core import integrity
from h5pack.core.fieldkinds import BytesField, LazyColumn, RaggedField, _write
from h5pack.errors import OptionsError

# Bytes of one chunk of a mask field when its first chunk's samples hold none, and the most.
MASK_CHUNK_BYTES, MAX_MASK_CHUNK_BYTES = 1 << 20, 1 << 30
MASK_ZSTD_LEVEL = 3  # decision 0055


@dataclass(frozen=True)
class MaskField(BytesField):
    """An H x W uint8 mask per sample that follows its image's geometry.

    Stored like a raw image blob (each mask's H * W bytes, with offsets); its shape is its
    image's, so a crop, resize and flip of the image apply to it (``transform``: nearest
    neighbour, values kept). The bytes are Zstandard-compressed (``hdf5plugin``'s filter,
    as ``--compression zstd`` packs), in chunks of about one image chunk's samples,
    written a chunk at a time (a ``LazyColumn``'s masks are made as they are written).
    """

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
        name, offsets = self.datasets()
        ends, crc, pending = [0], 0, []
        dataset: h5py.Dataset | None = None
        for i in range(len(column)):
            pending.append(self._value(column[i]))
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
        digest = _write(handle, offsets, np.asarray(ends, dtype=np.int64), rows_per_chunk)
        return {name: integrity.hex32(crc), offsets: digest}

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
class InstanceMasksField(MaskField):
    """An n x H x W uint8 stack of instance masks per sample (n may be 0), spatial.

    Stored as a mask field (each sample's n * H * W bytes); row ``k`` is the mask of the
    sample's ``k``-th box, so a crop, resize and flip apply to each.
    """

    kind: ClassVar[str] = "masks"
    axes: ClassVar[str] = "n x H x W"

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return value.reshape(-1, int(shape[0]), int(shape[1]))

    def fit(self, mask: np.ndarray, height: int, width: int) -> np.ndarray:  # noqa: D102
        if mask.shape[1:] == (height, width):
            return mask
        out = np.empty((len(mask), height, width), dtype=np.uint8)
        for k, one in enumerate(mask):
            out[k] = nearest(one, (0, 0, *one.shape), (height, width))
        return out

    def transform(
        self, mask: np.ndarray, box: Any, flip: bool, size: tuple[int, int]
    ) -> np.ndarray:
        """Return each of ``mask`` cut to ``box`` (top, left, height, width), resized, flipped."""
        out = np.empty((len(mask), *size), dtype=np.uint8)
        for k, one in enumerate(mask):
            out[k] = MaskField.transform(self, one, box, flip, size)
        return out

    def collate(self, values: Sequence[Any]) -> Any:  # noqa: D102
        import torch

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


def nearest(source: np.ndarray, box: tuple[int, ...], size: tuple[int, int]) -> np.ndarray:
    """Return the ``box`` (top, left, height, width) of ``source`` resized to ``size``.

    Nearest neighbour by pixel centres (OpenCV's exact mode, Pillow's rule): values kept.
    """
    import cv2  # here: h5pack info and convert start without OpenCV

    top, left, height, width = box
    cut = source[top : top + height, left : left + width]
    return np.asarray(cv2.resize(cut, (size[1], size[0]), interpolation=cv2.INTER_NEAREST_EXACT))
