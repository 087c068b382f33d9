"""Where to cut each training image: the boxes and flips of the training image pipeline.

A :class:`CropSpec` says what every image becomes; :func:`plan_crop` turns it into the box to
cut out of one image and whether to flip the result, from the image's displayed size only:

* ``"random-resized"``: the box of torchvision's ``RandomResizedCrop`` (same algorithm, see
  :func:`random_resized_box`);
* ``"center"``: the largest centred box with the output's aspect ratio (:func:`center_box`);
* ``"resize"``: the whole image.

Randomness is a pure function of ``(seed, epoch, index)`` (:func:`sample_rng`), so an epoch
gives the same boxes and flips in any process, with any number of workers, and a resumed
epoch continues identically. The rest is box arithmetic the kernels of :mod:`h5pack.read.crop`
share: a box through an EXIF orientation (:func:`stored_box`), onto a resized image
(:func:`scale_box`), and how far a JPEG may be decoded at reduced scale (:func:`dct_reduction`).
This module decodes and resizes nothing.
"""

from __future__ import annotations

import math
import operator
import threading
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
    for _ in range(RANDOM_ATTEMPTS):
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
    positive_size((out_h, out_w))
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


# NOTE [ Sample generators of a batch ]
#
# ``sample_rng`` builds a ``SeedSequence`` and a ``PCG64`` per sample: 10-14 us of CPU,
# more than half of ``plan_crop``. ``prepare_sample_rngs`` computes, for a whole batch at
# once, the PCG64 states those generators start from: numpy's ``SeedSequence`` hashing
# (its ``hashmix``/``mix`` on uint32 words, as in numpy/random/bit_generator.pyx) vectorised
# over the batch's indices, then ``pcg64_set_seed``'s two LCG steps in Python ints. ``plan_crop``
# takes a prepared state when there is one, on a generator of its thread whose state is set
# (1 us), and otherwise builds ``sample_rng`` as before: the same stream either way
# (tests/test_crop.py compares them), ~4 us per sample instead of 10-14.

_M32: Final[int] = 0xFFFFFFFF
_M128: Final[int] = (1 << 128) - 1
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT: Final[int] = (2549297995355413924 << 64) + 4865540595714422341
_PREPARED: dict[tuple[int, int, int], tuple[int, int]] = {}
_PREPARED_MAX: Final[int] = 1 << 14  # prepared states nobody took are dropped past this
_THREAD = threading.local()


def entropy_words(seed: int, epoch: int) -> tuple[list[int], list[int]]:
    """The 32-bit words around the index in ``sample_rng(seed, epoch, index)``'s entropy.

    Its ``SeedSequence`` hashes ``before + [index] + after`` (for an index below 2**32),
    numpy's conversion of ``[seed % 2**64, epoch, index, crop tag]`` into words.
    """
    return [*_words(seed % 2**64), *_words(epoch)], _words(_CROP_TAG)


def _words(value: int) -> list[int]:
    # numpy's _int_to_uint32_array: little-endian 32-bit words, [0] for 0
    found = []
    while value > 0:
        found.append(value & _M32)
        value >>= 32
    return found or [0]


def pcg64_states(seed: int, epoch: int, indices: Sequence[int]) -> list[tuple[int, int]]:
    """The PCG64 ``(state, inc)`` that ``sample_rng(seed, epoch, i)`` starts from, per index.

    See ``NOTE [ Sample generators of a batch ]``.

    Raises:
        OptionsError: ``epoch`` or an index is negative.
    """
    idx = np.asarray(indices, dtype=np.int64)
    if epoch < 0 or (idx.size and int(idx.min()) < 0):
        raise OptionsError(f"epoch and index should be non-negative, but got epoch={epoch}")
    if idx.size and int(idx.max()) > _M32:  # an index of two words: the slow, general path
        return [_state_of(sample_rng(seed, epoch, int(i))) for i in idx.tolist()]
    u = np.uint64
    shape = idx.shape
    before, after = entropy_words(seed, epoch)
    entropy = [np.full(shape, w, u) for w in before]
    entropy += [idx.astype(u), *(np.full(shape, w, u) for w in after)]
    mask, shift = u(_M32), u(16)
    hash_const = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal hash_const
        value = value ^ u(hash_const)
        hash_const = (hash_const * _MULT_A) & _M32
        value = (value * u(hash_const)) & mask
        return value ^ (value >> shift)

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = np.asarray(x * u(_MIX_L) - y * u(_MIX_R), dtype=u) & mask
        return result ^ (result >> shift)

    pool = [hashmix(entropy[i] if i < len(entropy) else np.zeros(shape, u)) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(4, len(entropy)):
        for dst in range(4):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    state_words = []
    hash_const = _INIT_B
    for i in range(8):
        value = pool[i % 4] ^ u(hash_const)
        hash_const = (hash_const * _MULT_B) & _M32
        value = (value * u(hash_const)) & mask
        state_words.append((value ^ (value >> shift)).tolist())
    found = []
    for j in range(idx.size):
        w = [state_words[2 * k][j] | (state_words[2 * k + 1][j] << 32) for k in range(4)]
        inc = ((((w[2] << 64) | w[3]) << 1) | 1) & _M128
        state = (inc + ((w[0] << 64) | w[1])) & _M128  # state 0, one step (0 * mult + inc)
        found.append(((state * _PCG_MULT + inc) & _M128, inc))
    return found


def _state_of(rng: np.random.Generator) -> tuple[int, int]:
    state = rng.bit_generator.state["state"]
    return int(state["state"]), int(state["inc"])


def prepare_sample_rngs(seed: int, epoch: int, indices: Sequence[int]) -> None:
    """Compute at once the generators ``plan_crop`` will draw for ``indices`` in this process."""
    if len(_PREPARED) > _PREPARED_MAX:
        _PREPARED.clear()
    key = seed % 2**64
    for index, state in zip(indices, pcg64_states(seed, epoch, indices), strict=True):
        _PREPARED[(key, epoch, int(index))] = state


def _crop_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """``sample_rng(seed, epoch, index)``'s stream; from a prepared state when there is one."""
    state = _PREPARED.pop((seed % 2**64, epoch, index), None)
    if state is None or epoch < 0 or index < 0:
        return sample_rng(seed, epoch, index)
    rng = getattr(_THREAD, "rng", None)
    if rng is None:
        rng = _THREAD.rng = np.random.Generator(np.random.PCG64(0))
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": state[0], "inc": state[1]},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return rng


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
    rng = _crop_rng(seed, epoch, index)
    if spec.crop == "random-resized":
        box = random_resized_box(height, width, spec.scale, spec.ratio, rng)
    elif spec.crop == "center":
        box = center_box(height, width, *spec.size)
    else:
        box = Box(0, 0, height, width)
    return box, spec.flip and bool(rng.random() < FLIP_PROBABILITY)


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
