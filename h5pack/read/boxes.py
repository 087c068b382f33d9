"""Where to cut each training image: ``CropSpec`` and box arithmetic (no pixels).

``"random-resized"`` is torchvision's ``RandomResizedCrop`` box, ``"center"`` the largest
centred box with the output's aspect ratio, ``"resize"`` the whole image; ``read.cropplan``
draws each sample's box. A box maps through an EXIF orientation (:func:`stored_box`), onto a
resized image (:func:`scale_box`), and sets how far a JPEG may be reduced (``dct_reduction``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple, SupportsIndex

from h5pack.core.decode import BACKENDS, Backend
from h5pack.core.vocabulary import CROPS as CROPS  # re-exported
from h5pack.core.vocabulary import Crop as Crop
from h5pack.errors import OptionsError

# torchvision's RandomResizedCrop defaults: area (fractions of the image) and aspect ranges
DEFAULT_SCALE: Final[tuple[float, float]] = (0.08, 1.0)
DEFAULT_RATIO: Final[tuple[float, float]] = (3 / 4, 4 / 3)
RANDOM_ATTEMPTS: Final[int] = 10  # its tries at a random box before the central fallback
DEFAULT_REDUCING_GAP: Final[float] = 2.0  # CropSpec.reducing_gap (NOTE [ JPEG DCT scaling ])
FLIP_PROBABILITY: Final[float] = 0.5
DCT_REDUCTIONS: Final[tuple[int, ...]] = (8, 4, 2)  # libjpeg's scaled IDCTs: 1/8, 1/4, 1/2


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
        size: The output's ``(height, width)`` (``of`` also takes an int: a square).
        crop: ``"random-resized"``, ``"center"`` or ``"resize"``.
        scale: The random box's area range, as fractions of the image's
            (``0 < low <= high <= 1``).
        ratio: The random box's aspect range, width / height, drawn log-uniformly.
        flip: Flip horizontally with probability :data:`FLIP_PROBABILITY`.
        backend: ``"pillow"`` or ``"opencv"``: the resize filter, and the decoder of every
            format but RGB and gray JPEGs (libjpeg-turbo through OpenCV).
        reducing_gap: Decode a JPEG at 1/2, 1/4 or 1/8 scale while the reduced box stays at
            least this many times the output (>= 1); None: always in full.
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
        """Build a spec, reading an int ``size`` as a square ``(size, size)``."""
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
    """Return ``size`` as a ``(height, width)`` pair of positive ints (else ``OptionsError``)."""
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


def check_image_size(height: int, width: int) -> None:
    """Raise ``OptionsError`` unless the image is at least 1x1."""
    if height < 1 or width < 1:
        raise OptionsError(
            f"the image should be at least 1x1, but got height={height}, width={width}"
        )


def center_box(height: int, width: int, out_h: int, out_w: int) -> Box:
    """Return the largest centred box with the output's aspect ratio.

    A square output's is the central ``min(height, width)`` square: torchvision's
    ``Resize(s)`` + ``CenterCrop(s)`` region, to within its rounding's one pixel.
    """
    check_image_size(height, width)
    positive_size((out_h, out_w))
    if width * out_h > height * out_w:  # relatively wider than the output: keep the height
        box_h, box_w = height, min(width, max(1, round(height * out_w / out_h)))
    else:
        box_h, box_w = min(height, max(1, round(width * out_h / out_w))), width
    return Box((height - box_h) // 2, (width - box_w) // 2, box_h, box_w)


def stored_box(box: Box, orientation: int, stored_h: int, stored_w: int) -> Box:
    """Map a box in displayed coordinates to the stored image's, undoing an EXIF orientation.

    ``orient(stored, orientation)[box]`` and ``orient(stored[result], orientation)`` are the
    same pixels (``orient`` as ``ImageOps.exif_transpose``).
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
    """Return the largest DCT reduction (8, 4, 2, else 1) leaving ``box`` ``gap`` x the output."""
    if gap is None:
        return 1
    for reduction in DCT_REDUCTIONS:
        if box.height >= out_h * reduction * gap and box.width >= out_w * reduction * gap:
            return reduction
    return 1


def scale_box(box: Box, size: tuple[int, int], to: tuple[int, int]) -> Box:
    """Return ``box``, planned on an image of ``size`` (H, W), on it resized to ``to``.

    Each edge is rounded to at most half a pixel of ``to`` off, the box kept inside and 1x1
    at least: the box is planned on the full size, whatever size is decoded or cached.
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
