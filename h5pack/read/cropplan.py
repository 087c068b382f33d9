"""Each sample's box and flip: :func:`plan_crop`, and :func:`plan_crops` for a whole batch.

Randomness is a pure function of ``(seed, epoch, index)`` (:func:`crop_uniforms`), so an
epoch gives the same boxes and flips in any process, with any number of workers, and a
resumed epoch continues identically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from h5pack.errors import OptionsError
from h5pack.read.boxes import (
    FLIP_PROBABILITY,
    RANDOM_ATTEMPTS,
    Box,
    CropSpec,
    center_box,
    check_image_size,
)

_CROP_TAG: Final[int] = 0x63726F70  # "crop": keeps these streams apart from other seeded ones

# NOTE [ Crop streams ]
# A sample's draws are a pure function of (seed, epoch, index): uniforms from SplitMix64's
# output function (Steele, Lea and Flood 2014) applied to a counter per draw, whose start is
# the function of a key (seed, epoch and a tag) and the index. Plain numpy on uint64 arrays,
# so a whole batch is planned in a few vectorised calls and nothing depends on how numpy's
# own generators are seeded. Draws per sample: an area and a ratio per attempt, the top,
# the left, the flip (_DRAWS).

_DRAWS: Final[int] = 2 * RANDOM_ATTEMPTS + 3
_GAMMA: Final = np.uint64(0x9E3779B97F4A7C15)
_TO_DOUBLE: Final[float] = 2.0**-53


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def crop_uniforms(
    seed: int, epoch: int, indices: Sequence[int] | np.ndarray, count: int = _DRAWS
) -> np.ndarray:
    """Return the first ``count`` uniforms in ``[0, 1)`` of each sample's crop stream."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if epoch < 0 or (idx.size and int(idx.min()) < 0):
        least = int(idx.min()) if idx.size else 0
        raise OptionsError(
            f"epoch and index should be non-negative, but got epoch={epoch}, index={least}"
        )
    key = _mix(np.array([(seed % 2**64) ^ _CROP_TAG], dtype=np.uint64))
    key = _mix(key + np.array([epoch], dtype=np.uint64) * _GAMMA)
    start = _mix(key + idx.astype(np.uint64) * _GAMMA)
    steps = np.arange(1, count + 1, dtype=np.uint64) * _GAMMA
    bits = _mix(start[:, None] + steps[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * _TO_DOUBLE


def plan_crops(
    spec: CropSpec,
    heights: Sequence[int] | np.ndarray,
    widths: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    indices: Sequence[int] | np.ndarray,
) -> list[tuple[Box, bool]]:
    """Choose the box and the flip of every sample of a batch, from their displayed sizes."""
    h = np.asarray(heights, dtype=np.int64).reshape(-1)
    w = np.asarray(widths, dtype=np.int64).reshape(-1)
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if not (h.size == w.size == idx.size):
        raise OptionsError(
            "heights, widths and indices should have one entry per sample, but got "
            f"{h.size}, {w.size} and {idx.size}"
        )
    draws = crop_uniforms(seed, epoch, idx)  # checks epoch and indices
    if idx.size == 0:
        return []
    if int(h.min()) < 1 or int(w.min()) < 1:
        raise OptionsError(
            f"the images should be at least 1x1, but got heights {h.min()}.., widths {w.min()}.."
        )
    if spec.crop == "random-resized":
        boxes = [Box(*box) for box in _random_boxes(h, w, spec.scale, spec.ratio, draws)]
    elif spec.crop == "center":
        boxes = [center_box(a, b, *spec.size) for a, b in zip(h.tolist(), w.tolist(), strict=True)]
    else:
        boxes = [Box(0, 0, a, b) for a, b in zip(h.tolist(), w.tolist(), strict=True)]
    flips = (draws[:, -1] < FLIP_PROBABILITY).tolist() if spec.flip else [False] * idx.size
    return list(zip(boxes, flips, strict=True))


# Plans made ahead for plan_crop (plan_ahead): one vectorised call for the samples a batch
# cuts one by one, instead of one small call each. Keyed by every argument, so a plan is only
# ever taken for exactly what it was made for; those nobody took are dropped past the bound.
_AHEAD: dict[tuple[CropSpec, int, int, int, int, int], tuple[Box, bool]] = {}
_AHEAD_MAX: Final[int] = 1 << 14


def plan_ahead(
    spec: CropSpec, shapes: np.ndarray, *, seed: int, epoch: int, indices: np.ndarray
) -> None:
    """Plan at once the samples ``plan_crop`` will be asked for one by one in this process."""
    if len(_AHEAD) > _AHEAD_MAX:
        _AHEAD.clear()
    heights, widths = shapes[:, 0].tolist(), shapes[:, 1].tolist()
    plans = plan_crops(spec, heights, widths, seed=seed, epoch=epoch, indices=indices)
    key = seed % 2**64
    for h, w, i, plan in zip(heights, widths, indices.tolist(), plans, strict=True):
        _AHEAD[(spec, key, epoch, i, h, w)] = plan


def plan_crop(
    spec: CropSpec, height: int, width: int, *, seed: int, epoch: int, index: int
) -> tuple[Box, bool]:
    """Choose the box and the flip of one sample, from its displayed size."""
    check_image_size(height, width)
    ahead = _AHEAD.pop((spec, seed % 2**64, epoch, index, height, width), None)
    if ahead is not None:
        return ahead
    return plan_crops(spec, [height], [width], seed=seed, epoch=epoch, indices=[index])[0]


def random_resized_box(
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    rng: np.random.Generator,
) -> Box:
    """Draw the box of torchvision's ``RandomResizedCrop.get_params``."""
    check_image_size(height, width)
    checked = CropSpec.of(1, crop="random-resized", scale=scale, ratio=ratio)
    scale, ratio = checked.scale, checked.ratio
    draws = rng.random((1, _DRAWS))
    return Box(*_random_boxes(np.array([height]), np.array([width]), scale, ratio, draws)[0])


def _random_boxes(
    h: np.ndarray,
    w: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draws: np.ndarray,
) -> list[list[int]]:
    """``random_resized_box`` on a batch: one row of ``_DRAWS`` uniforms per image."""
    area = (h * w).astype(np.float64)[:, None]
    tries = 2 * RANDOM_ATTEMPTS
    target = area * (scale[0] + (scale[1] - scale[0]) * draws[:, 0:tries:2])
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_low + (log_high - log_low) * draws[:, 1:tries:2])
    box_w = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    box_h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (box_w > 0) & (box_w <= w[:, None]) & (box_h > 0) & (box_h <= h[:, None])
    rows, first = np.arange(h.size), np.argmax(fits, axis=1)
    found = fits[rows, first]
    # none fits: the central box, the whole image clamped to the nearest ratio
    narrow, wide = w < h * ratio[0], w > h * ratio[1]
    clamped_h = np.maximum(1, np.rint(w / ratio[0])).astype(np.int64)
    clamped_w = np.maximum(1, np.rint(h * ratio[1])).astype(np.int64)
    bw = np.where(found, box_w[rows, first], np.where(wide, clamped_w, w))
    bh = np.where(found, box_h[rows, first], np.where(narrow, clamped_h, h))
    top = np.where(found, _below(draws[:, tries], h - bh + 1), (h - bh) // 2)
    left = np.where(found, _below(draws[:, tries + 1], w - bw + 1), (w - bw) // 2)
    boxes: list[list[int]] = np.stack([top, left, bh, bw], axis=1).tolist()
    return boxes


def _below(draws: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Uniform ints in ``[0, count)`` from uniforms in ``[0, 1)``."""
    below: np.ndarray = np.minimum((draws * count).astype(np.int64), count - 1)
    return below
