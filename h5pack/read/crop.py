"""Decode, cut and resize training images to a fixed size: the kernels of the image pipeline.

Where to cut is :mod:`h5pack.read.cropplan`'s business (:func:`plan_crop`, re-exported here with
the other box names); this module moves the pixels:

* :func:`crop_into` cuts a box out of an ``(H, W, C)`` array and resizes the box, and only
  the box, straight into an output buffer (a view of the batch), then flips it in place;
* :func:`decode_crop_into` does the same from an image file's bytes, decoding JPEGs at a
  reduced scale when the box allows it (``NOTE [ JPEG DCT scaling ]``), and at either
  scale only as far as the box (``NOTE [ Decoding only the box ]``: the same pixels);
* :func:`crop_array` and :func:`decode_crop` are the same into a new array.

The resizing kernel is a :data:`ResizeInto` argument. The reference kernels here are
:func:`pillow_resize_into` (``Image.resize(size, BILINEAR)``, whose support widens when
shrinking, like torchvision's ``Resize(antialias=True)``) and :func:`opencv_resize_into`
(``INTER_AREA`` when shrinking, ``INTER_LINEAR`` when enlarging, as
:func:`h5pack.core.decode.resize_image`); :mod:`h5pack.training.fixed_size` passes a faster
kernel computing Pillow's filter with torch, which this layer does not import.

Pixels are those of :func:`h5pack.core.decode.decode_image` followed by the cut and the
resize (same EXIF orientation, mode conversions, alpha compositing and errors), except that
RGB, gray and CMYK JPEGs are decoded at a reduced scale when the box allows it, which moves
pixels by a few grey levels, and that RGB and gray JPEGs are decoded by OpenCV's
libjpeg-turbo whatever the backend (``NOTE [ JPEG decoder ]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final, NamedTuple

import numpy as np
from PIL import Image

from h5pack.core.decode import (
    BACKENDS,
    MAX_IMAGE_PIXELS,
    Backend,
    ImageArray,
    apply_orientation,
    decode_image,
    finish_pixels,
)
from h5pack.core.jpeg import JpegHeader
from h5pack.errors import OptionsError
from h5pack.read.boxes import (
    CROPS,
    DCT_REDUCTIONS,
    DEFAULT_RATIO,
    DEFAULT_REDUCING_GAP,
    DEFAULT_SCALE,
    FLIP_PROBABILITY,
    Box,
    Crop,
    CropSpec,
    center_box,
    dct_reduction,
    positive_size,
    scale_box,
    stored_box,
)
from h5pack.read.cropplan import crop_uniforms, plan_crop, plan_crops, random_resized_box
from h5pack.read.jpegdecode import (
    decode_jpeg,
    decode_jpeg_box,
    jpeg_header,
    upright_jpeg_header,
)

__all__ = [  # the box names are re-exported: callers of the pipeline need only this module
    "CROPS",
    "DCT_REDUCTIONS",
    "DEFAULT_RATIO",
    "DEFAULT_REDUCING_GAP",
    "DEFAULT_SCALE",
    "FLIP_PROBABILITY",
    "Box",
    "Crop",
    "CropSpec",
    "KeepDecoded",
    "ResizeInto",
    "center_box",
    "crop_array",
    "crop_decoded_into",
    "crop_into",
    "crop_uniforms",
    "decode_crop",
    "decode_crop_into",
    "decode_jpeg",
    "decode_jpeg_box",
    "decode_pixels",
    "flip_in_place",
    "opencv_resize_into",
    "pillow_resize_into",
    "plan_crop",
    "plan_crops",
    "random_resized_box",
    "reference_resize",
    "scale_box",
    "upright_jpeg_header",
]

ResizeInto = Callable[[np.ndarray, np.ndarray], None]
"""A resizing kernel: ``resize(source, out)`` resizes the ``(h, w, C)`` uint8 ``source`` (any
row stride, possibly read-only) into the C-contiguous ``(H, W, C)`` uint8 ``out``, same C."""

KeepDecoded = Callable[[np.ndarray, int], None]
"""``keep(pixels, orientation)``: given a full-scale decode by :func:`decode_crop_into`, for
:func:`crop_decoded_into` to cut later (the decoded cache's ``put``)."""

# NOTE [ the cache changes no pixel ]
# A sample's output must not depend on whether the decoded cache holds it (issue 20 D: a
# cache that kept decode_image's pixels gave hits that differed from the uncached path by up
# to 28 grey levels, and with a partial cache which samples were held, so which path each
# took, depended on timing). So the cache keeps exactly what decode_crop_into decodes when
# it decodes in full, before any cut: decode_image's pixels (orientation tag 0), or a JPEG's
# pixels as stored with its EXIF orientation (tag 1..8), and a hit goes through the same
# cut, resize, orientation and channel code (crop_decoded_into). A JPEG whose box this
# epoch allows a reduced decode is decoded again at that scale, cached or not: the reduced
# IDCT gives other pixels than any resize of the full ones. (cache_max_side is the one
# exception by design: then every sample is cut from the shrunk image, cached or not.)


def pillow_resize_into(source: np.ndarray, out: np.ndarray) -> None:
    """Resize with Pillow's antialiased ``BILINEAR``: exactly ``Image.resize`` (a kernel)."""
    if source.shape[:2] == out.shape[:2]:
        out[...] = source
        return
    two_d = source[:, :, 0] if source.shape[2] == 1 else source
    resized = Image.fromarray(np.ascontiguousarray(two_d)).resize(
        (out.shape[1], out.shape[0]), Image.Resampling.BILINEAR
    )
    out[...] = np.asarray(resized).reshape(out.shape)


def opencv_resize_into(source: np.ndarray, out: np.ndarray) -> None:
    """Resize with OpenCV: ``INTER_AREA`` shrinking, else ``INTER_LINEAR`` (a kernel).

    ``cv2.resize`` reads the row-strided box in place and writes ``out`` directly.
    """
    if source.shape[:2] == out.shape[:2]:
        out[...] = source
        return
    import cv2  # here: importing this module stays light

    shrinking = out.shape[0] <= source.shape[0] and out.shape[1] <= source.shape[1]
    interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    one = source.shape[2] == 1  # OpenCV takes a 1-channel image as 2-D
    target = out[:, :, 0] if one else out
    result = cv2.resize(
        source[:, :, 0] if one else source,
        (out.shape[1], out.shape[0]),
        dst=target,
        interpolation=interpolation,
    )
    if result is not target:  # OpenCV allocated anew (it should not): copy it over
        target[...] = result


def reference_resize(backend: Backend) -> ResizeInto:
    """Return the reference kernel of ``backend``: Pillow's or OpenCV's resize.

    Raises:
        OptionsError: an unknown backend.
    """
    if backend == "pillow":
        return pillow_resize_into
    if backend == "opencv":
        return opencv_resize_into
    raise OptionsError(f"backend should be one of {BACKENDS}, but got backend={backend!r}")


def crop_into(
    hwc: np.ndarray, box: Box, out: np.ndarray, *, flip: bool, resize: ResizeInto
) -> None:
    """Resize ``box`` of ``hwc`` into ``out`` with ``resize``, then flip ``out`` if asked.

    Nothing is copied besides what ``resize`` does: the box is a view of ``hwc``.

    Args:
        hwc: A uint8 ``(H, W, C)`` array; may be read-only.
        box: The box to cut; it must lie inside the image.
        out: The C-contiguous uint8 ``(h, w, C)`` output, e.g. one image of a batch.
        flip: Flip the result horizontally.
        resize: The kernel (see :data:`ResizeInto`).

    Raises:
        OptionsError: the box is outside the image, or the channels differ.
    """
    top, left, box_h, box_w = box
    image_h, image_w = hwc.shape[:2]
    inside = top >= 0 and left >= 0 and top + box_h <= image_h and left + box_w <= image_w
    if not (inside and box_h >= 1 and box_w >= 1):
        raise OptionsError(
            f"box should lie inside the {image_w}x{image_h} (WxH) image, but got box={box!r}"
        )
    if hwc.shape[2] != out.shape[2]:
        raise OptionsError(
            f"hwc and out should have the same channels, but got {hwc.shape} and {out.shape}"
        )
    resize(hwc[top : top + box_h, left : left + box_w], out)
    if flip:
        flip_in_place(out)


def flip_in_place(out: np.ndarray) -> None:
    """Flip the C-contiguous ``(H, W, C)`` uint8 ``out`` horizontally, in place.

    ``cv2.flip`` swaps the pixels in place, far cheaper than numpy's 3-byte-strided
    ``out[...] = out[:, ::-1]``.
    """
    import cv2

    target = out[:, :, 0] if out.shape[2] == 1 else out
    result = cv2.flip(target, 1, dst=target)
    if result is not target:  # OpenCV allocated anew (it should not): copy it over
        target[...] = result


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
        backend: ``"pillow"`` (exactly ``Image.crop(box).resize(size, BILINEAR)``) or
            ``"opencv"`` (``INTER_AREA`` when shrinking, ``INTER_LINEAR`` otherwise).

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
    out_h, out_w = positive_size(out_size)
    resize = reference_resize(backend)
    out = np.empty((out_h, out_w, hwc.shape[2]), dtype=np.uint8)
    crop_into(hwc, box, out, flip=flip, resize=resize)
    return out


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

    :func:`decode_crop_into` into a new array, with the reference kernel of
    ``spec.backend``.

    Returns:
        A C-contiguous, writable uint8 array of shape ``(*spec.size, channels)``.

    Raises:
        DecodeError: The bytes are empty, not an image, truncated, corrupt, or too large;
            the message starts with ``name``.
        OptionsError: ``channels``, ``max_pixels``, ``epoch`` or ``index`` is invalid.
    """
    if channels not in (1, 3):
        raise OptionsError(f"channels should be 1 or 3, but got channels={channels!r}")
    out = np.empty((*spec.size, channels), dtype=np.uint8)
    decode_crop_into(
        data, spec, out, seed=seed, epoch=epoch, index=index, name=name, max_pixels=max_pixels
    )
    return out


def decode_crop_into(
    data: bytes,
    spec: CropSpec,
    out: np.ndarray,
    *,
    seed: int,
    epoch: int,
    index: int,
    name: str = "<bytes>",
    max_pixels: int | None = None,
    resize: ResizeInto | None = None,
    keep: KeepDecoded | None = None,
) -> None:
    """Decode an image file's bytes into ``out``: the planned box, resized, maybe flipped.

    The box and flip are :func:`plan_crop`'s for the image's displayed size. The pixels are
    :func:`~h5pack.core.decode.decode_image`'s followed by :func:`crop_into`, except for
    JPEGs, which are decoded at a reduced scale when the box allows it (see
    ``NOTE [ JPEG DCT scaling ]``), and RGB and gray JPEGs by OpenCV (``NOTE [ JPEG
    decoder ]``) or, without ``keep``, only as far as the box, at full or reduced scale, by
    the same libjpeg-turbo code (``NOTE [ Decoding only the box ]``: the pixels of the whole
    decode).

    Args:
        data: The file's bytes, as stored in a pack.
        spec: What to do; ``out`` must be ``(*spec.size, channels)``.
        out: The C-contiguous uint8 output, ``channels`` 3 (RGB) or 1 (luminance, as in
            ``decode_image``).
        seed: The run's seed.
        epoch: The epoch.
        index: The sample's index in the pack.
        name: What to call the image in error messages (e.g. its relative path).
        max_pixels: Refuse images with more than this many pixels; None means
            :data:`~h5pack.core.decode.MAX_IMAGE_PIXELS`.
        resize: The resizing kernel; None: :func:`reference_resize` of ``spec.backend``.
        keep: Called with the full-scale decode and its orientation tag before the cut,
            when the image is decoded at full scale (never at a reduced one): what
            :func:`crop_decoded_into` takes to give the same output later.

    Raises:
        DecodeError: The bytes are empty, not an image, truncated, corrupt, or too large;
            the message starts with ``name``.
        OptionsError: ``out``, ``max_pixels``, ``epoch`` or ``index`` is invalid.
    """
    channels = out.shape[2] if out.ndim == 3 else 0
    if out.dtype != np.uint8 or out.shape[:2] != spec.size or channels not in (1, 3):
        raise OptionsError(
            f"out should be a uint8 array of shape {(*spec.size, '1|3')}, but got "
            f"dtype={out.dtype} shape={out.shape}"
        )
    if max_pixels is not None and max_pixels <= 0:
        raise OptionsError(f"max_pixels should be positive, but got max_pixels={max_pixels}")
    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    kernel = resize or reference_resize(spec.backend)
    header = jpeg_header(data, name, limit) if spec.reducing_gap is not None else None
    if header is not None:
        _decode_crop_jpeg(header, data, spec, out, (seed, epoch, index), kernel, name, keep)
        return
    decoded = decode_image(
        data, name=name, backend=spec.backend, channels=channels, max_pixels=limit
    )
    if keep is not None:
        keep(decoded, 0)
    box, flip = plan_crop(spec, *decoded.shape[:2], seed=seed, epoch=epoch, index=index)
    crop_into(decoded, box, out, flip=flip, resize=kernel)


def decode_pixels(
    data: bytes,
    *,
    name: str = "<bytes>",
    backend: Backend = "pillow",
    channels: int = 3,
    max_pixels: int | None = None,
) -> np.ndarray:
    """Decode an image file's bytes: :func:`~h5pack.core.decode.decode_image`'s pixels.

    The same pixels and errors, but the array may be read-only and is not copied once more
    to make it writable (an RGB or gray JPEG as stored comes straight from the decoder):
    for a caller that only reads it, such as the decoded cache.

    Raises:
        DecodeError: as ``decode_image``.
        OptionsError: ``channels`` is not 1 or 3.
    """
    if channels not in (1, 3):
        raise OptionsError(f"channels should be 1 or 3, but got channels={channels!r}")
    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    header = jpeg_header(data, name, limit)
    if header is not None and header.mode in ("RGB", "L") and header.orientation == 1:
        pixels = decode_jpeg(header, data, name=name)
        return pixels if pixels.shape[2] == channels else finish_pixels(pixels, channels)
    return decode_image(data, name=name, backend=backend, channels=channels, max_pixels=limit)


# NOTE [ JPEG DCT scaling ]
# libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size for a fraction of the cost (it
# runs a smaller inverse DCT per 8x8 block); Pillow exposes that as Image.draft, OpenCV as
# the IMREAD_REDUCED_* flags (the same libjpeg-turbo code: identical pixels). The box is
# planned on the full displayed size before reducing (so it does not depend on the
# reduction, and is the box decode_image + crop_array would cut), cut in stored coordinates,
# and mapped to the reduced image rounded to whole pixels (boxes.scale_box: at most half a
# reduced pixel off on each side). How far to reduce: the reduced IDCT is a cruder low-pass
# filter than the antialiased resize of a full decode, so reducing all the way until the
# box just covers the output loses detail on textured photos (sand, foliage). Keeping the
# reduced box at least twice the output (Pillow's own `reducing_gap` in Image.thumbnail)
# keeps it close to the full path; CropSpec.reducing_gap chooses. ImageNet-sized photos cut
# to 224 never reduce with the gap of 2: the gain is on large photos.


class _JpegPlan(NamedTuple):
    """Where and how a JPEG is cut: the box as stored, the flip, the DCT reduction."""

    cut: Box
    flip: bool
    reduction: int
    orientation: int
    out_h: int
    out_w: int


def _plan_jpeg(
    stored_h: int, stored_w: int, orientation: int, spec: CropSpec, where: tuple[int, int, int]
) -> _JpegPlan:
    """Plan the box on the displayed size, then map it to the stored image and reduce."""
    seed, epoch, index = where
    height, width = (stored_w, stored_h) if orientation >= 5 else (stored_h, stored_w)
    box, flip = plan_crop(spec, height, width, seed=seed, epoch=epoch, index=index)
    out_h, out_w = spec.size[::-1] if orientation >= 5 else spec.size
    cut = stored_box(box, orientation, stored_h, stored_w)
    reduction = dct_reduction(cut, out_h, out_w, spec.reducing_gap)
    return _JpegPlan(cut, flip, reduction, orientation, out_h, out_w)


_BILINEAR_SUPPORT: Final = 1.0  # Pillow's BILINEAR filter reaches one pixel each way


def _decode_crop_jpeg(
    image: JpegHeader,
    data: bytes,
    spec: CropSpec,
    out: np.ndarray,
    where: tuple[int, int, int],
    resize: ResizeInto,
    name: str,
    keep: KeepDecoded | None,
) -> None:
    """Decode the JPEG ``image`` (maybe at a reduced scale), resize the planned box into ``out``.

    See ``NOTE [ JPEG DCT scaling ]``. Cuts and resizes as stored, then orients the small
    result; the output's sides swap with the transposing orientations (5..8).
    """
    stored_w, stored_h = image.size
    plan = _plan_jpeg(stored_h, stored_w, image.orientation, spec, where)
    reduced = (-(-stored_h // plan.reduction), -(-stored_w // plan.reduction))
    if keep is None:  # only what the resize reads (NOTE [ Decoding only the box ])
        region = _region_read(plan, spec, reduced)
        # Pillow's resize of a fractional box gives other roundings on another image size
        # or place (measured), so it gets the region on an image-sized canvas
        canvas = plan.reduction > 1 and spec.backend == "pillow"
        boxed = decode_jpeg_box(image, data, region, plan.reduction, canvas=canvas)
        if boxed is not None:
            origin = (0, 0) if canvas else (region.top, region.left)
            _resize_jpeg_into(boxed, plan, spec, out, resize, origin, reduced)
            return
    pixels = decode_jpeg(image, data, name=name, reduction=plan.reduction)
    if plan.reduction == 1 and keep is not None:
        keep(pixels, plan.orientation)
    _resize_jpeg_into(pixels, plan, spec, out, resize, (0, 0), reduced)


def _region_read(plan: _JpegPlan, spec: CropSpec, reduced: tuple[int, int]) -> Box:
    """The part of the (reduced) image that resizing ``plan``'s box reads, as a box of it.

    At full scale, and at a reduced one with a whole-pixel box, the box itself. Pillow's
    resize of a fractional box (``_resize_fractional_box``) reads each output pixel's
    filter support around it (BILINEAR: one input pixel, times the shrink factor), so the
    region is the box widened by that support and two pixels, within the image.
    """
    cut, reduction = plan.cut, plan.reduction
    if reduction == 1:
        return cut
    covered = (reduced[0] * reduction, reduced[1] * reduction)
    if spec.backend != "pillow":
        return scale_box(cut, covered, reduced)
    top, left, height, width = (v / reduction for v in cut)
    edges = []
    for start, side, out_side, limit in (
        (top, height, plan.out_h, reduced[0]),
        (left, width, plan.out_w, reduced[1]),
    ):
        margin = math.ceil(_BILINEAR_SUPPORT * max(side / out_side, 1.0)) + 2
        edges.append(
            (max(0, math.floor(start) - margin), min(limit, math.ceil(start + side) + margin))
        )
    (y0, y1), (x0, x1) = edges
    return Box(y0, x0, y1 - y0, x1 - x0)


def _resize_jpeg_into(
    pixels: np.ndarray,
    plan: _JpegPlan,
    spec: CropSpec,
    out: np.ndarray,
    resize: ResizeInto,
    origin: tuple[int, int],
    reduced: tuple[int, int],
) -> None:
    """Resize the planned box of the JPEG's ``pixels`` into ``out``.

    ``pixels`` is the part of the image (as stored, at ``plan.reduction``, of size
    ``reduced``) whose top left pixel is ``origin``: the whole image, or the region
    ``_region_read`` chose (the same output either way).
    """
    cut, flip, reduction, orientation, out_h, out_w = plan
    if reduction > 1 and spec.backend == "pillow":  # `pixels` the whole image or a canvas
        small = _resize_fractional_box(pixels, cut, reduction, (out_h, out_w))
    else:
        # reduced pixel j covers stored pixels [j * r, (j + 1) * r): a scale of exactly 1/r
        covered = (reduced[0] * reduction, reduced[1] * reduction)
        top, left, box_h, box_w = scale_box(cut, covered, reduced)
        top, left = top - origin[0], left - origin[1]
        view = pixels[top : top + box_h, left : left + box_w]
        if orientation == 1 and view.shape[2] == out.shape[2]:  # the common case: no copy
            resize(view, out)
            if flip:
                flip_in_place(out)
            return
        small = np.empty((out_h, out_w, view.shape[2]), dtype=np.uint8)
        resize(view, small)
    oriented = apply_orientation(small, orientation)
    out[...] = finish_pixels(oriented[:, ::-1] if flip else oriented, out.shape[2])


def crop_decoded_into(
    pixels: np.ndarray,
    orientation: int,
    spec: CropSpec,
    out: np.ndarray,
    *,
    seed: int,
    epoch: int,
    index: int,
    resize: ResizeInto | None = None,
) -> bool:
    """Cut what :func:`decode_crop_into` decoded in full into ``out``: exactly its pixels.

    ``pixels`` and ``orientation`` are what ``decode_crop_into`` handed to its ``keep``
    (see ``NOTE [ the cache changes no pixel ]``). When this epoch's box would have the
    JPEG decoded at a reduced scale, the full pixels cannot give the same output: nothing
    is written and False is returned (decode the file's bytes instead).

    Args:
        pixels: The full-scale decode (read-only is fine).
        orientation: 0 for ``decode_image``'s pixels, else the JPEG's EXIF orientation
            (1..8; ``pixels`` are then as stored).
        spec: The crop, as given to ``decode_crop_into``.
        out: As in ``decode_crop_into``.
        seed: The run's seed.
        epoch: The epoch.
        index: The sample's index in the pack.
        resize: The resizing kernel; None: :func:`reference_resize` of ``spec.backend``.

    Returns:
        Whether ``out`` was filled.
    """
    kernel = resize or reference_resize(spec.backend)
    if orientation == 0:
        box, flip = plan_crop(spec, *pixels.shape[:2], seed=seed, epoch=epoch, index=index)
        crop_into(pixels, box, out, flip=flip, resize=kernel)
        return True
    stored_h, stored_w = pixels.shape[:2]
    plan = _plan_jpeg(stored_h, stored_w, orientation, spec, (seed, epoch, index))
    if plan.reduction != 1:
        return False
    _resize_jpeg_into(pixels, plan, spec, out, kernel, (0, 0), (stored_h, stored_w))
    return True


def _resize_fractional_box(
    pixels: np.ndarray, box: Box, reduction: int, out_size: tuple[int, int]
) -> np.ndarray:
    """Resize ``box`` (stored coordinates) of the reduced ``pixels`` with Pillow's ``box=``.

    Reduced pixel j covers stored pixels [j * s, (j + 1) * s): the box maps to a fractional
    one, which only Pillow's resize takes; rounding it to whole reduced pixels instead lost
    much of the full path's fidelity.
    """
    top, left, height, width = (v / reduction for v in box)
    two_d = pixels[:, :, 0] if pixels.shape[2] == 1 else pixels
    resized = Image.fromarray(np.ascontiguousarray(two_d)).resize(
        (out_size[1], out_size[0]),
        Image.Resampling.BILINEAR,
        box=(left, top, left + width, top + height),
    )
    return np.asarray(resized).reshape(*out_size, pixels.shape[2])
