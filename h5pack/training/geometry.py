"""One geometry per sample: the image's crop, resize and flip applied to its spatial fields.

``crop_fields`` moves a batch's masks and boxes as ``plan_crops`` cut their images;
``collate_records`` batches what ``transform=`` returns; ``pad_batch`` is ``collate="padded"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from h5pack.core.fields import BoxesField, InstanceMasksField, fields_of, stored_fields
from h5pack.core.format import PackMeta
from h5pack.core.spatialfields import cut_masks, move_boxes
from h5pack.errors import FormatError
from h5pack.read.crop import CropSpec
from h5pack.read.cropplan import plan_crops
from h5pack.training.ring import BatchRing, batch_buffer

LENGTHS = "_lengths"
"""The suffix of a padded field's lengths: ``boxes`` beside ``boxes_lengths``."""


class Cropping(Protocol):
    """What ``crop_fields`` reads of a dataset: its pack, pipeline, seed, epoch and ring."""

    meta: PackMeta
    crop: CropSpec | None
    seed: int
    ring: BatchRing | None

    @property
    def epoch(self) -> int: ...  # noqa: D102


def crop_fields(found: dict[str, list[Any]], idx: np.ndarray, dataset: Cropping) -> None:
    """Cut, resize and flip each spatial field in ``found`` as its image was (``plan_crops``).

    Instance masks are cut a batch at once into one batch buffer (NOTE [ Batch ring ]); a box
    left under one pixel wide or high is dropped with the rows of its ``per_box`` fields.
    """
    meta, crop, ring = dataset.meta, dataset.crop, dataset.ring
    if crop is None:
        return
    listed = {f.name: f for f in stored_fields(fields_of(meta))}
    moved = [listed[n] for n in found if n in listed and listed[n].spatial]
    if not moved:
        return
    masks = {f.name for f in moved if isinstance(f, InstanceMasksField)}
    shapes = meta.shapes[idx]
    seed, epoch = dataset.seed, dataset.epoch
    plans = plan_crops(crop, shapes[:, 0], shapes[:, 1], seed=seed, epoch=epoch, indices=idx)
    crops = np.array([box for box, _ in plans], dtype=np.int64).reshape(-1, 4)
    flips = np.array([flip for _, flip in plans], dtype=bool)
    geometry = (crops, flips, crop.size)
    kept: dict[str, np.ndarray] = {}  # per_box fields: which of the batch's rows stay
    for field in moved:
        if isinstance(field, BoxesField):
            keep, counts = _move(found, field, geometry)
            for name in [n for n in field.per_box or () if n in found]:
                kind = listed[name]
                count = kind.count if isinstance(kind, InstanceMasksField) else len
                rows = [count(v) for v in found[name]]
                wrong = next((j for j, n in enumerate(rows) if n != counts[j]), None)
                if wrong is not None:
                    raise FormatError(
                        f"field {name!r} of sample {int(idx[wrong])} holds {rows[wrong]} rows, "
                        f"but {counts[wrong]} boxes in {field.name!r} (per_box): damaged"
                    )
                kept[name] = keep
    for field in moved:
        if isinstance(field, InstanceMasksField):  # a batch at once, in one buffer
            found[field.name] = _masks(found[field.name], geometry, ring, kept.get(field.name))
        elif not isinstance(field, BoxesField):
            found[field.name] = [
                field.transform(value, box, flip, crop.size)
                for value, (box, flip) in zip(found[field.name], plans, strict=True)
            ]
    for name, keep in kept.items():
        if name not in masks and not keep.all():
            found[name] = _rows(found[name], keep)


def _masks(
    blobs: list[Any],
    geometry: tuple[np.ndarray, np.ndarray, tuple[int, int]],
    ring: BatchRing | None,
    keep: np.ndarray | None,
) -> list[torch.Tensor]:
    """A batch's instance masks (those ``keep`` keeps) cut into one batch buffer: views of it."""
    held: list[torch.Tensor] = []

    def alloc(shape: tuple[int, ...]) -> np.ndarray:
        # a power of two of masks: a few sizes of buffer, each reused (NOTE [ Batch ring ])
        room = 1 << max(0, shape[0] - 1).bit_length()
        held.append(batch_buffer(ring, (room, *shape[1:]))[: shape[0]])
        return held[0].numpy()

    cut = cut_masks(blobs, *geometry, alloc, keep)
    return list(held[0].split([len(v) for v in cut]))


def _move(
    found: dict[str, list[Any]],
    boxes: BoxesField,
    geometry: tuple[np.ndarray, np.ndarray, tuple[int, int]],
) -> tuple[np.ndarray, list[int]]:
    """Move one boxes field's batch at once; return which boxes keep some area, and counts."""
    crops, flips, size = geometry
    values = found[boxes.name]
    counts = np.array([len(v) for v in values], dtype=np.int64)
    flat = np.concatenate(values) if int(counts.sum()) else np.zeros((0, 4), boxes.dtype)
    owner = np.repeat(np.arange(len(values)), counts)
    placed, keep = move_boxes(flat, crops[owner], flips[owner], size)
    moved = np.split(placed.astype(boxes.dtype), np.cumsum(counts)[:-1])
    found[boxes.name] = _rows(moved, keep)
    return keep, counts.tolist()


def _rows(values: list[Any], keep: np.ndarray) -> list[Any]:
    """Each sample's rows that ``keep`` (over the batch's rows back to back) keeps."""
    found, at = [], 0
    for value in values:
        chosen = keep[at : at + len(value)]
        found.append(value if chosen.all() else value[chosen])
        at += len(value)
    return found


def as_value(value: Any) -> Any:
    """A stored field's value as ``transform=`` gets it: arrays as tensors, numbers plain."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    return value


def collate_records(records: Sequence[Any]) -> Any:
    """Batch what ``transform=`` returned: dicts by key, other records as a list.

    Per key: tensors of one shape stacked, numbers as a tensor, anything else a list.
    """
    if not records or not all(isinstance(r, Mapping) for r in records):
        return list(records)
    return {key: _stacked([r[key] for r in records]) for key in records[0]}


def _stacked(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    ):
        return torch.stack(values)
    if all(isinstance(v, bool | int | float) for v in values):
        return torch.tensor(values)
    return values


def pad_batch(batch: Any) -> Any:
    """``collate="padded"``: each list of tensors in a dict batch as one zero-padded tensor.

    ``NAME_lengths`` (int64, (B,)) holds each sample's rows; anything else is left as it is.
    """
    if not isinstance(batch, dict):
        return batch
    out: dict[str, Any] = {}
    for name, values in batch.items():
        out[name] = values
        if not isinstance(values, list) or not values:
            continue
        if not all(isinstance(v, torch.Tensor) and v.ndim for v in values):
            continue
        if len({(v.ndim, v.dtype) for v in values}) != 1:
            continue
        shape = np.max([tuple(v.shape) for v in values], axis=0).tolist()
        padded = values[0].new_zeros((len(values), *shape))
        target = padded.numpy()  # NOTE [ numpy copies ] (training.loader)
        for j, value in enumerate(values):
            target[(j, *(slice(0, d) for d in value.shape))] = value.numpy()
        out[name] = padded
        out[name + LENGTHS] = torch.tensor([len(v) for v in values], dtype=torch.int64)
    return out
