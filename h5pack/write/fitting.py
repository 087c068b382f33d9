"""Spatial fields follow their image when a conversion resizes it (``--size``, ``--max-side``).

Masks and boxes are in the decoded image's pixels (after EXIF orientation). The stored
image is resized and cut or padded (``core.resize``), and each field takes the same steps:
a mask by nearest neighbour (padding 0), boxes scaled, shifted and clipped, a box under
one pixel dropped with its ``per_box`` rows (``move_boxes``, the loader's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from h5pack.core.fields import BoxesField, Field, LazyColumn, MaskField
from h5pack.core.resize import fitted_size
from h5pack.core.spatialfields import move_boxes, nearest
from h5pack.core.vocabulary import ResizeMethod
from h5pack.errors import OptionsError


def placement(
    source: tuple[int, int], stored: tuple[int, int], method: ResizeMethod
) -> tuple[int, int, int, int]:
    """Return ``(new_h, new_w, top, left)``: the resized size and where it lies in ``stored``."""
    new_h, new_w = fitted_size(*source, *stored, method)
    top, left = (stored[0] - new_h) // 2, (stored[1] - new_w) // 2
    if method == "crop":
        top, left = -((new_h - stored[0]) // 2), -((new_w - stored[1]) // 2)
    return new_h, new_w, top, left


def fit_mask(
    mask: np.ndarray, source: tuple[int, int], stored: tuple[int, int], method: ResizeMethod
) -> np.ndarray:
    """Return an H x W (or n x H x W) mask of a ``source``-sized image at its ``stored`` size."""
    if mask.shape[-2:] == stored and source == stored:
        return mask
    new_h, new_w, top, left = placement(source, stored, method)
    resized = nearest(mask, (0, 0, *mask.shape[-2:]), (new_h, new_w))
    if top <= 0 and left <= 0:  # stretch or crop
        return np.ascontiguousarray(resized[..., -top : stored[0] - top, -left : stored[1] - left])
    out = np.zeros((*mask.shape[:-2], *stored), dtype=mask.dtype)
    out[..., top : top + new_h, left : left + new_w] = resized
    return out


def fit_boxes(
    boxes: np.ndarray, source: tuple[int, int], stored: tuple[int, int], method: ResizeMethod
) -> tuple[np.ndarray, np.ndarray | None]:
    """Return ``boxes`` (n x 4 xyxy) in the stored image's pixels, and which to keep (None: all)."""
    boxes = np.asarray(boxes)
    if source == stored:
        return boxes, None
    new_h, new_w, top, left = placement(source, stored, method)
    scale_y, scale_x = new_h / source[0], new_w / source[1]
    crop = [-top / scale_y, -left / scale_x, stored[0] / scale_y, stored[1] / scale_x]
    crops = np.tile(np.asarray(crop, dtype=np.float64), (len(boxes), 1))
    moved, keep = move_boxes(boxes.reshape(-1, 4), crops, np.zeros(len(boxes), bool), stored)
    return moved[keep].astype(boxes.dtype), keep


def checked_mask(
    make: Callable[[Any], Any], name: str, method: ResizeMethod, item: tuple[Any, ...]
) -> np.ndarray:
    """Make one sample's mask and fit it (``item``: what, stored, source, path, keep)."""
    what, stored, source, path, keep = item
    mask = np.asarray(make(what))
    if mask.shape[-2:] != source:
        raise OptionsError(
            f"{path}: its {name!r} mask is {mask.shape[-1]}x{mask.shape[-2]}, its image "
            f"{source[1]}x{source[0]} (W x H): a mask has its image's size"
        )
    fitted = fit_mask(mask, source, stored, method)
    return fitted if keep is None else fitted[keep]


def fitted_columns(
    fields: Sequence[Field],
    columns: dict[str, Any],
    shapes: np.ndarray,
    sources: np.ndarray,
    paths: Sequence[str],
    method: ResizeMethod,
) -> dict[str, Any]:
    """Return ``columns`` with the spatial ones in their images' stored sizes and frames."""
    stored = [(int(s[0]), int(s[1])) for s in shapes.tolist()]
    source = [(int(s[0]), int(s[1])) for s in sources.tolist()]
    keeps: dict[str, list[Any]] = {}
    for box in (f for f in fields if isinstance(f, BoxesField)):
        moved = [fit_boxes(*v, method) for v in zip(columns[box.name], source, stored, strict=True)]
        columns[box.name] = [b for b, _ in moved]
        keeps.update({name: [k for _, k in moved] for name in box.per_box or ()})
    for one in fields:
        keep = keeps.get(one.name, [None] * len(stored))
        column = columns[one.name]
        if isinstance(one, MaskField):
            lazy = isinstance(column, LazyColumn)
            whats = column.items if lazy else column
            items = list(zip(whats, stored, source, paths, keep, strict=True))
            fit = partial(checked_mask, column.make if lazy else _itself, one.name, method)
            columns[one.name] = LazyColumn(items, fit) if lazy else [fit(i) for i in items]
        elif one.name in keeps:
            rows = zip(column, keep, strict=True)
            columns[one.name] = [v if k is None else np.asarray(v)[k] for v, k in rows]
    return columns


def _itself(value: Any) -> Any:
    return value
