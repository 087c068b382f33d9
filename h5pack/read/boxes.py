"""Where to cut each training image: the boxes and flips of the training image pipeline.

A :class:`CropSpec` says what every image becomes; :func:`plan_crop` turns it into the box to
cut out of one image and whether to flip the result, from the image's displayed size only:

* ``"random-resized"``: the box of torchvision's ``RandomResizedCrop`` (same algorithm, see
  :func:`random_resized_box`);
* ``"center"``: the largest centred box with the output's aspect ratio (:func:`center_box`);
* ``"resize"``: the whole image.

Randomness is a pure function of ``(seed, epoch, index)`` (:func:`crop_uniforms`), so an
epoch gives the same boxes and flips in any process, with any number of workers, and a
resumed epoch continues identically; :func:`plan_crops` plans a whole batch at once. The
rest is box arithmetic the kernels of :mod:`h5pack.read.crop` share: a box through an EXIF
orientation (:func:`stored_box`), onto a resized image (:func:`scale_box`), and how far a
JPEG may be decoded at reduced scale (:func:`dct_reduction`).
This module decodes and resizes nothing.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, SupportsIndex

import numpy as np

from h5pack.core.decode import BACKENDS, Backend
from h5pack.core.vocabulary import CROPS as CROPS  # re-exported
from h5pack.core.vocabulary import Crop as Crop
from h5pack.errors import OptionsError

DEFAULT_SCALE: Final[tuple[float, float]] = (0.08, 1.0)
"""torchvision's default ``RandomResizedCrop`` area range, as fractions of the image."""

DEFAULT_RATIO: Final[tuple[float, float]] = (3 / 4, 4 / 3)
"""torchvision's default ``RandomResizedCrop`` aspect-ratio (width / height) range."""

DEFAULT_REDUCING_GAP: Final[float] = 2.0
"""Default :attr:`CropSpec.reducing_gap`: JPEGs are decoded at a reduced scale only while
the box stays at least twice the output's size (``NOTE [ JPEG DCT scaling ]``)."""

FLIP_PROBABILITY: Final[float] = 0.5
"""Probability of a horizontal flip when :attr:`CropSpec.flip` is set."""

DCT_REDUCTIONS: Final[tuple[int, ...]] = (8, 4, 2)
"""The reductions (1/8, 1/4, 1/2 scale) at which libjpeg decodes a JPEG (its scaled IDCT)."""

RANDOM_ATTEMPTS: Final[int] = 10
"""RandomResizedCrop's tries at a random box before its central fallback."""
_CROP_TAG: Final[int] = 0x63726F70  # "crop": keeps these streams apart from other seeded ones


class Box(NamedTuple):
    """A rectangle of pixels: rows ``top : top + height``, columns ``left : left + width``."""

    top: int
    left: int
    height: int
    width: int


@dataclass(frozen=True, kw_only=True)
class CropSpec:
    """How to cut every image to a fixed size.

    Attributes:
        size: The output's ``(height, width)``; :meth:`of` also takes one int for a square.
        crop: ``"random-resized"``, ``"center"`` or ``"resize"`` (see the module docstring).
        scale: Range of the random box's area, as fractions of the image's area
            (``"random-resized"`` only); ``0 < scale[0] <= scale[1] <= 1``.
        ratio: Range of the random box's aspect ratio, width / height, drawn log-uniformly
            (``"random-resized"`` only); ``0 < ratio[0] <= ratio[1]``.
        flip: Flip the output horizontally with probability :data:`FLIP_PROBABILITY`.
        backend: ``"pillow"`` or ``"opencv"``: the resizing filter, Pillow's antialiased
            ``BILINEAR`` or OpenCV's ``INTER_AREA`` when shrinking and ``INTER_LINEAR``
            when enlarging, and the decoder of every format but RGB and gray JPEGs, which
            libjpeg-turbo decodes through OpenCV (see :mod:`h5pack.read.crop`).
        reducing_gap: A JPEG is decoded at 1/2, 1/4 or 1/8 scale when the box, so
            reduced, is still at least ``reducing_gap`` times the output (in both sides); at
            least 1. None always decodes in full (the pixels of ``decode_image`` and
            ``crop_array``). Named after Pillow's ``reducing_gap``, which plays the same
            role in ``Image.thumbnail``.

    Raises:
        OptionsError: A field is out of range.

    Example:
        >>> CropSpec.of(224, crop="random-resized", flip=True).size
        (224, 224)
    """

    size: tuple[int, int]
    crop: Crop
    scale: tuple[float, float] = DEFAULT_SCALE
    ratio: tuple[float, float] = DEFAULT_RATIO
    flip: bool = False
    backend: Backend = "pillow"
    reducing_gap: float | None = DEFAULT_REDUCING_GAP

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", positive_size(self.size))
        if self.crop not in CROPS:
            raise OptionsError(f"crop should be one of {CROPS}, but got crop={self.crop!r}")
        object.__setattr__(self, "scale", _check_range("scale", self.scale, upper=1.0))
        object.__setattr__(self, "ratio", _check_range("ratio", self.ratio, upper=math.inf))
        if not isinstance(self.flip, bool):
            raise OptionsError(f"flip should be a bool, but got flip={self.flip!r}")
        if self.backend not in BACKENDS:
            raise OptionsError(
                f"backend should be one of {BACKENDS}, but got backend={self.backend!r}"
            )
        gap = self.reducing_gap
        valid_gap = isinstance(gap, (int, float)) and not isinstance(gap, bool) and gap >= 1.0
        if gap is not None and not (valid_gap and math.isfinite(gap)):
            raise OptionsError(
                f"reducing_gap should be None or a number >= 1, but got reducing_gap={gap!r}"
            )

    @classmethod
    def of(
        cls,
        size: int | tuple[int, int],
        *,
        crop: Crop,
        scale: tuple[float, float] = DEFAULT_SCALE,
        ratio: tuple[float, float] = DEFAULT_RATIO,
        flip: bool = False,
        backend: Backend = "pillow",
        reducing_gap: float | None = DEFAULT_REDUCING_GAP,
    ) -> CropSpec:
        """Build a spec, reading an int ``size`` as a square ``(size, size)``.

        Args:
            size: The output's side, or its ``(height, width)``.
            crop: See the class.
            scale: See the class.
            ratio: See the class.
            flip: See the class.
            backend: See the class.
            reducing_gap: See the class.

        Returns:
            The validated spec.

        Raises:
            OptionsError: A field is out of range.
        """
        pair = (size, size) if isinstance(size, int) else size
        return cls(
            size=pair,
            crop=crop,
            scale=scale,
            ratio=ratio,
            flip=flip,
            backend=backend,
            reducing_gap=reducing_gap,
        )


def positive_size(size: Iterable[SupportsIndex]) -> tuple[int, int]:
    """Return ``size`` as a ``(height, width)`` pair of positive ints.

    Raises:
        OptionsError: ``size`` is not two positive ints.
    """
    try:
        height, width = (operator.index(v) for v in size)
    except (TypeError, ValueError):
        raise OptionsError(
            "size should be a (height, width) pair of ints (use CropSpec.of for a square), "
            f"but got size={size!r}"
        ) from None
    if height < 1 or width < 1:
        raise OptionsError(f"size should be positive, but got size={size!r}")
    return height, width


def _check_range(name: str, pair: Iterable[float], *, upper: float) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise OptionsError(
            f"{name} should be a (low, high) pair, but got {name}={pair!r}"
        ) from None
    if not (0.0 < low <= high <= upper and math.isfinite(high)):
        bound = "" if math.isinf(upper) else f" <= {upper}"
        raise OptionsError(f"{name} should satisfy 0 < low <= high{bound}, but got {name}={pair!r}")
    return low, high


def _check_image_size(height: int, width: int) -> None:
    if height < 1 or width < 1:
        raise OptionsError(
            f"the image should be at least 1x1, but got height={height}, width={width}"
        )


def random_resized_box(
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    rng: np.random.Generator,
) -> Box:
    """Draw the box of torchvision's ``RandomResizedCrop.get_params``.

    Up to 10 attempts draw an area fraction uniformly in ``scale`` and an aspect ratio
    (width / height) log-uniformly in ``ratio``, round the box's sides, and keep the first
    box that fits, at a uniformly drawn position. When none fits (e.g. a very elongated
    image), the box is central: the whole image clamped to the nearest ratio in ``ratio``.
    Unlike torchvision, that clamped side is never rounded down to 0.

    Args:
        height: The image's height.
        width: The image's width.
        scale: ``(low, high)`` area fractions; ``0 < low <= high <= 1``.
        ratio: ``(low, high)`` aspect ratios; ``0 < low <= high``.
        rng: The source of randomness.

    Returns:
        A box inside the image.

    Raises:
        OptionsError: The image size, ``scale`` or ``ratio`` is invalid.
    """
    _check_image_size(height, width)
    scale = _check_range("scale", scale, upper=1.0)
    ratio = _check_range("ratio", ratio, upper=math.inf)
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


def center_box(height: int, width: int, out_h: int, out_w: int) -> Box:
    """Return the largest centred box with the output's aspect ratio.

    The box spans the image's full height when the image is relatively wider than
    ``out_w / out_h``, else its full width; the other side is ``round`` of the matching
    proportion, and the offsets are ``(height - box.height) // 2`` and
    ``(width - box.width) // 2``. It is, up to rounding, the region that
    :func:`~h5pack.core.decode.resize_image` with ``method="crop"`` keeps. For a square
    output it is the central ``min(height, width)`` square: the region torchvision's
    ``Resize(s)`` followed by ``CenterCrop(s)`` keeps, to within the one pixel that
    torchvision's rounding of the resized long side and of the offset may move it.

    Args:
        height: The image's height.
        width: The image's width.
        out_h: The output's height.
        out_w: The output's width.

    Returns:
        A box inside the image.

    Raises:
        OptionsError: A size is not positive.
    """
    _check_image_size(height, width)
    positive_size((out_h, out_w))
    if width * out_h > height * out_w:  # relatively wider than the output: keep the height
        box_h, box_w = height, min(width, max(1, round(height * out_w / out_h)))
    else:
        box_h, box_w = min(height, max(1, round(width * out_h / out_w))), width
    return Box((height - box_h) // 2, (width - box_w) // 2, box_h, box_w)


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
    """Return the first ``count`` uniforms in ``[0, 1)`` of each sample's crop stream.

    A pure function of ``(seed, epoch, index)`` (``NOTE [ Crop streams ]``): the same in any
    process, for any batch the index is in.

    Args:
        seed: The run's seed; any int (taken modulo 2**64).
        epoch: The epoch, from 0.
        indices: The samples' indices in the pack, from 0.
        count: The uniforms per sample.

    Returns:
        A ``(len(indices), count)`` float64 array.

    Raises:
        OptionsError: ``epoch`` or an index is negative.
    """
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
    """Choose the box and the flip of every sample of a batch, from their displayed sizes.

    Sample ``k``'s plan is ``plan_crop``'s for ``indices[k]``: it depends on the sample,
    never on the rest of the batch.

    Args:
        spec: What to do.
        heights: Each image's displayed height (after EXIF orientation).
        widths: Each image's displayed width.
        seed: The run's seed.
        epoch: The epoch.
        indices: Each sample's index.

    Returns:
        ``[(box, flip), ...]``: the box to cut and whether to flip the result horizontally.

    Raises:
        OptionsError: An image size, ``epoch`` or an index is invalid.
    """
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
    """Plan at once the samples ``plan_crop`` will be asked for one by one in this process.

    ``shapes`` holds each sample's displayed ``(height, width[, ...])``.
    """
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
    """Choose the box and the flip of one sample, from its displayed size.

    Args:
        spec: What to do.
        height: The image's height, as displayed (after EXIF orientation).
        width: The image's width, as displayed.
        seed: The run's seed.
        epoch: The epoch.
        index: The sample's index.

    Returns:
        The box to cut, and whether to flip the result horizontally.

    Raises:
        OptionsError: The image size, ``epoch`` or ``index`` is invalid.
    """
    _check_image_size(height, width)
    ahead = _AHEAD.pop((spec, seed % 2**64, epoch, index, height, width), None)
    if ahead is not None:
        return ahead
    return plan_crops(spec, [height], [width], seed=seed, epoch=epoch, indices=[index])[0]


def stored_box(box: Box, orientation: int, stored_h: int, stored_w: int) -> Box:
    """Map a box in displayed coordinates to the stored image's, undoing an EXIF orientation.

    ``orient(stored, orientation)[box]`` and ``orient(stored[result], orientation)`` are the
    same pixels, where ``orient`` applies the orientation as ``ImageOps.exif_transpose``.

    Args:
        box: The box, in the displayed image (after the orientation).
        orientation: The EXIF orientation, 1..8 (1, or any other value: as stored).
        stored_h: The stored image's height (before the orientation).
        stored_w: The stored image's width.

    Returns:
        The same pixels' box in the stored image.
    """
    top, left, height, width = box
    bottom_gap = stored_h - top - height  # rows below the box, for the flipped cases
    right_gap = stored_w - left - width
    if orientation == 2:
        return Box(top, right_gap, height, width)
    if orientation == 3:
        return Box(bottom_gap, right_gap, height, width)
    if orientation == 4:
        return Box(bottom_gap, left, height, width)
    # 5..8 transpose: displayed rows are stored columns and displayed columns stored rows.
    if orientation == 5:
        return Box(left, top, width, height)
    if orientation == 6:
        return Box(stored_h - left - width, top, width, height)
    if orientation == 7:
        return Box(stored_h - left - width, stored_w - top - height, width, height)
    if orientation == 8:
        return Box(left, stored_w - top - height, width, height)
    return box


def dct_reduction(box: Box, out_h: int, out_w: int, gap: float | None) -> int:
    """Return the largest DCT reduction leaving ``box`` at least ``gap`` times the output.

    See ``NOTE [ JPEG DCT scaling ]`` in :mod:`h5pack.read.crop`.

    Args:
        box: The box to cut, in the stored image.
        out_h: The output's height (as stored: swapped under transposing orientations).
        out_w: The output's width.
        gap: :attr:`CropSpec.reducing_gap`; None never reduces.

    Returns:
        8, 4, 2, or 1 (decode in full).
    """
    if gap is None:
        return 1
    for reduction in DCT_REDUCTIONS:
        if box.height >= out_h * reduction * gap and box.width >= out_w * reduction * gap:
            return reduction
    return 1


def scale_box(box: Box, size: tuple[int, int], to: tuple[int, int]) -> Box:
    """Return ``box``, planned on an image of ``size`` (H, W), on the same image resized to ``to``.

    Edges are rounded to whole pixels and the result kept inside the image and at least
    1x1: each edge is at most half a pixel of ``to`` off. The decoded cache may
    keep a shrunk image, and a JPEG may be decoded at a reduced scale; the box is planned
    on the full size so that both give the same crop as a full decode.

    Args:
        box: A box inside an image of ``size``.
        size: That image's ``(height, width)``.
        to: The resized image's ``(height, width)``.

    Returns:
        A box inside an image of ``to``.
    """
    if size == to:
        return box
    sy, sx = to[0] / size[0], to[1] / size[1]
    top = min(to[0] - 1, round(box.top * sy))
    left = min(to[1] - 1, round(box.left * sx))
    # round the far edges too (not the sides): each edge is then off by half a pixel at most
    bottom = min(to[0], round((box.top + box.height) * sy))
    right = min(to[1], round((box.left + box.width) * sx))
    return Box(top, left, max(1, bottom - top), max(1, right - left))
