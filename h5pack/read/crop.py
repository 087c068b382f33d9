"""Decode and crop training images to a fixed size, with torchvision-style augmentation.

Every sample comes out as a C-contiguous ``(H, W, C)`` uint8 array of the size a
:class:`CropSpec` asks for, whatever the stored image's size:

* ``"random-resized"``: the box of torchvision's ``RandomResizedCrop`` (same algorithm, see
  :func:`random_resized_box`), resized to the output size;
* ``"center"``: the largest centred box with the output's aspect ratio
  (:func:`center_box`), resized to the output size;
* ``"resize"``: the whole image, stretched to the output size.

The box is always cut first and only the box is resized, with antialiasing: Pillow's
``BILINEAR`` (whose support widens when shrinking, like torchvision's
``Resize(antialias=True)``) or OpenCV's ``INTER_AREA`` when shrinking and ``INTER_LINEAR``
when enlarging, as :func:`h5pack.core.decode.resize_image` does. An optional horizontal
flip (p = 0.5) follows.

Randomness is a pure function of ``(seed, epoch, index)`` (:func:`sample_rng`), so an epoch
gives the same boxes and flips in any process, with any number of workers, and a resumed
epoch continues identically.

:func:`decode_crop` goes from a file's bytes straight to the output. Pixels are exactly
what :func:`h5pack.core.decode.decode_image` followed by :func:`crop_array` gives (same
EXIF orientation, mode conversions, alpha compositing and errors), except that RGB, gray
and CMYK JPEGs (baseline, progressive, or the first frame of an MPO) are decoded at a
reduced scale when the box allows it, which moves pixels by a few grey levels; see
``NOTE [ JPEG DCT scaling ]``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, SupportsIndex, get_args

import numpy as np
from PIL import Image, ImageFile

from h5pack.core.decode import (
    BACKENDS,
    MAX_IMAGE_PIXELS,
    Backend,
    ImageArray,
    _finish,
    _open_pillow,
    _orient,
    _orientation,
    _pillow_pixels,
    _resize_to,
    decode_image,
)
from h5pack.errors import DecodeError, OptionsError

Crop = Literal["random-resized", "center", "resize"]
CROPS: tuple[str, ...] = get_args(Crop)

DEFAULT_SCALE: Final[tuple[float, float]] = (0.08, 1.0)
"""torchvision's default ``RandomResizedCrop`` area range, as fractions of the image."""

DEFAULT_RATIO: Final[tuple[float, float]] = (3 / 4, 4 / 3)
"""torchvision's default ``RandomResizedCrop`` aspect-ratio (width / height) range."""

DEFAULT_REDUCING_GAP: Final[float] = 2.0
"""Default :attr:`CropSpec.reducing_gap`: JPEGs are decoded at a reduced scale only while
the box stays at least twice the output's size (``NOTE [ JPEG DCT scaling ]``)."""

FLIP_PROBABILITY: Final[float] = 0.5
"""Probability of a horizontal flip when :attr:`CropSpec.flip` is set."""

_ATTEMPTS: Final[int] = 10  # RandomResizedCrop's tries before its central fallback
_CROP_TAG: Final[int] = 0x63726F70  # "crop": keeps these streams apart from other seeded ones
_DCT_REDUCTIONS: Final[tuple[int, ...]] = (8, 4, 2)  # libjpeg scales Pillow's draft offers
_DRAFT_FORMATS: Final[frozenset[str]] = frozenset({"JPEG", "MPO"})
_DRAFT_MODES: Final[frozenset[str]] = frozenset({"RGB", "L", "CMYK"})


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
        backend: ``"pillow"`` or ``"opencv"``: the resizing kernel, and the decoder of the
            files that :func:`decode_crop` hands to :func:`~h5pack.core.decode.decode_image`.
        reducing_gap: :func:`decode_crop` decodes a JPEG at 1/2, 1/4 or 1/8 scale when the
            box, so reduced, is still at least ``reducing_gap`` times the output (in both
            sides); at least 1. None always decodes in full (exactly ``decode_image`` and
            :func:`crop_array`). Named after Pillow's ``reducing_gap``, which plays the
            same role in ``Image.thumbnail``.

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
        object.__setattr__(self, "size", _positive_size(self.size))
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


def _positive_size(size: Iterable[SupportsIndex]) -> tuple[int, int]:
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
        rng: The source of randomness (see :func:`sample_rng`).

    Returns:
        A box inside the image.

    Raises:
        OptionsError: The image size, ``scale`` or ``ratio`` is invalid.
    """
    _check_image_size(height, width)
    scale_low, scale_high = _check_range("scale", scale, upper=1.0)
    ratio_low, ratio_high = _check_range("ratio", ratio, upper=math.inf)
    area = height * width
    log_low, log_high = math.log(ratio_low), math.log(ratio_high)
    for _ in range(_ATTEMPTS):
        target_area = area * rng.uniform(scale_low, scale_high)
        aspect = math.exp(rng.uniform(log_low, log_high))
        box_w = round(math.sqrt(target_area * aspect))
        box_h = round(math.sqrt(target_area / aspect))
        if 0 < box_w <= width and 0 < box_h <= height:
            top = int(rng.integers(0, height - box_h + 1))
            left = int(rng.integers(0, width - box_w + 1))
            return Box(top, left, box_h, box_w)
    in_ratio = width / height
    if in_ratio < ratio_low:
        box_w, box_h = width, max(1, round(width / ratio_low))
    elif in_ratio > ratio_high:
        box_w, box_h = max(1, round(height * ratio_high)), height
    else:
        box_w, box_h = width, height
    return Box((height - box_h) // 2, (width - box_w) // 2, box_h, box_w)


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
    _positive_size((out_h, out_w))
    if width * out_h > height * out_w:  # relatively wider than the output: keep the height
        box_h, box_w = height, min(width, max(1, round(height * out_w / out_h)))
    else:
        box_h, box_w = min(height, max(1, round(width * out_h / out_w))), width
    return Box((height - box_h) // 2, (width - box_w) // 2, box_h, box_w)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """Return the random generator of sample ``index`` in ``epoch``.

    It is a pure function of its arguments: the same triple gives the same stream in any
    process, and streams of different triples are independent (``SeedSequence`` hashing).

    Args:
        seed: The run's seed; any int (taken modulo 2**64).
        epoch: The epoch, from 0.
        index: The sample's index in the pack, from 0.

    Returns:
        A fresh generator.

    Raises:
        OptionsError: ``epoch`` or ``index`` is negative.
    """
    if epoch < 0 or index < 0:
        raise OptionsError(
            f"epoch and index should be non-negative, but got epoch={epoch}, index={index}"
        )
    return np.random.default_rng([seed % 2**64, epoch, index, _CROP_TAG])


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
    rng = sample_rng(seed, epoch, index)
    if spec.crop == "random-resized":
        box = random_resized_box(height, width, spec.scale, spec.ratio, rng)
    elif spec.crop == "center":
        box = center_box(height, width, *spec.size)
    else:
        box = Box(0, 0, height, width)
    return box, spec.flip and bool(rng.random() < FLIP_PROBABILITY)


def crop_array(
    hwc: np.ndarray,
    box: Box,
    out_size: tuple[int, int],
    *,
    flip: bool = False,
    backend: Backend = "pillow",
) -> ImageArray:
    """Cut ``box`` out of an image, resize it to ``out_size`` and optionally flip it.

    Args:
        hwc: A uint8 array of shape (H, W, 1) or (H, W, 3).
        box: The box to cut; it must lie inside the image.
        out_size: The output's ``(height, width)``.
        flip: Flip the result horizontally.
        backend: ``"pillow"`` (bilinear, antialiased when shrinking: exactly
            ``Image.crop(box).resize(size, BILINEAR)``) or ``"opencv"`` (``INTER_AREA``
            when shrinking, ``INTER_LINEAR`` otherwise).

    Returns:
        A new C-contiguous, writable uint8 array of shape ``(*out_size, C)``.

    Raises:
        OptionsError: The array, box, size or backend is invalid.
    """
    if hwc.dtype != np.uint8 or hwc.ndim != 3 or hwc.shape[2] not in (1, 3):
        raise OptionsError(
            "hwc should be a uint8 array of shape (H, W, 1|3), but got "
            f"dtype={hwc.dtype} shape={hwc.shape}"
        )
    out_h, out_w = _positive_size(out_size)
    if backend not in BACKENDS:
        raise OptionsError(f"backend should be one of {BACKENDS}, but got backend={backend!r}")
    top, left, box_h, box_w = box
    image_h, image_w = hwc.shape[:2]
    inside = top >= 0 and left >= 0 and top + box_h <= image_h and left + box_w <= image_w
    if not (inside and box_h >= 1 and box_w >= 1):
        raise OptionsError(
            f"box should lie inside the {image_h}x{image_w} image, but got box={box!r}"
        )
    resized = _resize_to(hwc[top : top + box_h, left : left + box_w], out_h, out_w, backend)
    if np.may_share_memory(resized, hwc):  # a box of the output's size is not resized
        resized = resized.copy()
    return _finish(resized[:, ::-1] if flip else resized, hwc.shape[2])


def decode_crop(
    data: bytes,
    spec: CropSpec,
    *,
    seed: int,
    epoch: int,
    index: int,
    name: str = "<bytes>",
    channels: int = 3,
    max_pixels: int | None = None,
) -> ImageArray:
    """Decode an image file's bytes into the cropped, resized and flipped output.

    The box and flip are :func:`plan_crop`'s for the image's displayed size. The result is
    :func:`~h5pack.core.decode.decode_image` followed by :func:`crop_array`, except for
    JPEGs, which are decoded at a reduced scale when the box allows it, within a few grey
    levels of that (see ``NOTE [ JPEG DCT scaling ]``).

    Args:
        data: The file's bytes, as stored in a pack.
        spec: What to do.
        seed: The run's seed.
        epoch: The epoch.
        index: The sample's index in the pack.
        name: What to call the image in error messages (e.g. its relative path).
        channels: 3 for RGB, 1 for luminance, as in ``decode_image``.
        max_pixels: Refuse images with more than this many pixels; None means
            :data:`~h5pack.core.decode.MAX_IMAGE_PIXELS`.

    Returns:
        A C-contiguous, writable uint8 array of shape ``(*spec.size, channels)``.

    Raises:
        DecodeError: The bytes are empty, not an image, truncated, corrupt, or too large;
            the message starts with ``name``.
        OptionsError: ``channels``, ``max_pixels``, ``epoch`` or ``index`` is invalid.
    """
    if channels not in (1, 3):
        raise OptionsError(f"channels should be 1 or 3, but got channels={channels!r}")
    if max_pixels is not None and max_pixels <= 0:
        raise OptionsError(f"max_pixels should be positive, but got max_pixels={max_pixels}")
    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    image = _open_pillow(data, name, limit)
    try:
        if (
            spec.reducing_gap is not None
            and isinstance(image, ImageFile.ImageFile)
            and image.format in _DRAFT_FORMATS
            and image.mode in _DRAFT_MODES
            and len(image.tile) == 1
        ):
            pixels, flip = _decode_crop_jpeg(
                image, spec, seed=seed, epoch=epoch, index=index, name=name
            )
            return _finish(pixels[:, ::-1] if flip else pixels, channels)
    finally:
        image.close()
    decoded = decode_image(
        data, name=name, backend=spec.backend, channels=channels, max_pixels=limit
    )
    box, flip = plan_crop(spec, *decoded.shape[:2], seed=seed, epoch=epoch, index=index)
    return crop_array(decoded, box, spec.size, flip=flip, backend=spec.backend)


def _stored_box(box: Box, orientation: int, stored_h: int, stored_w: int) -> Box:
    """Map a box in displayed coordinates to the stored image's, undoing the orientation.

    ``decode._orient(stored, orientation)[box]`` and ``decode._orient(stored[result],
    orientation)`` are the same pixels.
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


# NOTE [ JPEG DCT scaling ]
# libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size for a fraction of the cost (it
# runs a smaller inverse DCT per 8x8 block), and Pillow exposes that as Image.draft. The box
# is planned on the full displayed size before drafting (so it does not depend on the
# reduction, and is the box decode_image + crop_array would cut), cut in stored
# coordinates, and mapped to the drafted image as a fractional box: drafted pixel j covers
# stored pixels [j * s, (j + 1) * s). Pillow then crops and resizes in one call.
# How far to reduce: the reduced IDCT is a cruder low-pass filter than the antialiased
# resize of a full decode, so reducing all the way until the box just covers the output
# loses detail on textured photos (sand, foliage: up to 6 dB PSNR against a Lanczos
# reference, where the full path loses none). Keeping the reduced box at least twice the
# output (Pillow's own `reducing_gap` in Image.thumbnail) brings that within about 1 dB of
# the full path; CropSpec.reducing_gap chooses.
# Pillow's box resize also reads the pixels just outside the box for its filter support,
# where crop_array's cut does not: one more reason the pixels differ by a few levels.


def _draft_reduction(box: Box, out_h: int, out_w: int, gap: float) -> int:
    """Return the largest DCT reduction leaving ``box`` at least ``gap`` times the output."""
    for reduction in _DCT_REDUCTIONS:
        if box.height >= out_h * reduction * gap and box.width >= out_w * reduction * gap:
            return reduction
    return 1


def _decode_crop_jpeg(
    image: ImageFile.ImageFile, spec: CropSpec, *, seed: int, epoch: int, index: int, name: str
) -> tuple[np.ndarray, bool]:
    """Decode the JPEG ``image`` at a reduced scale, cut and resize the planned box.

    Returns the (H, W, 1|3) oriented result, before flip and channel conversion, and
    whether to flip it. See ``NOTE [ JPEG DCT scaling ]``.
    """
    orientation = _orientation(image)
    stored_w, stored_h = image.size
    height, width = (stored_w, stored_h) if orientation >= 5 else (stored_h, stored_w)
    box, flip = plan_crop(spec, height, width, seed=seed, epoch=epoch, index=index)
    # Cut and resize as stored, then orient the small result; the output's sides swap
    # with the transposing orientations (5..8).
    out_h, out_w = spec.size[::-1] if orientation >= 5 else spec.size
    stored_box = _stored_box(box, orientation, stored_h, stored_w)
    reduction = _draft_reduction(stored_box, out_h, out_w, spec.reducing_gap or 1.0)
    pixels = _crop_drafted(image, stored_box, (out_h, out_w), reduction, spec.backend, name)
    return _orient(pixels, orientation), flip


def _crop_drafted(
    image: ImageFile.ImageFile,
    box: Box,
    out_size: tuple[int, int],
    reduction: int,
    backend: Backend,
    name: str,
) -> np.ndarray:
    """Decode the JPEG ``image`` at ``1 / reduction`` and resize ``box`` (as stored)."""
    out_h, out_w = out_size
    stored_w, stored_h = image.size
    scale = 1.0
    if reduction > 1:
        # Pillow's draft picks the largest of 8, 4, 2 not over min(W // w, H // h), which
        # for these requested sizes is exactly `reduction`; it reports the scale it chose.
        drafted = image.draft(image.mode, (stored_w // reduction, stored_h // reduction))
        if drafted is not None:
            scale = stored_w / drafted[1][2]
    top, left, height, width = (v / scale for v in box)
    try:
        # JPEG loading does not re-check Pillow's decompression-bomb limit (the header
        # did), so unlike decode._decode_pillow no warning needs silencing here.
        if backend == "pillow":
            resized = image.resize(
                (out_w, out_h),
                Image.Resampling.BILINEAR,
                box=(left, top, left + width, top + height),
            )
            return _pillow_pixels(resized)
        image.load()
        pixels = _pillow_pixels(image)
    except Exception as err:  # truncated or corrupt data raises OSError, SyntaxError, ...
        raise DecodeError(f"{name}: cannot decode {image.format} image: {err}") from err
    # OpenCV takes no fractional box: cut whole drafted pixels (at most half a drafted
    # pixel off on each side).
    rows = slice(round(top), max(round(top + height), round(top) + 1))
    columns = slice(round(left), max(round(left + width), round(left) + 1))
    return _resize_to(pixels[rows, columns], out_h, out_w, "opencv")
