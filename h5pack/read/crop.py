"""Decode, cut and resize training images to a fixed size: the kernels of the image pipeline.

Where to cut is :mod:`h5pack.read.boxes`' business (:func:`plan_crop`, re-exported here with
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
from PIL import Image, ImageFile

from h5pack.core.decode import (
    BACKENDS,
    MAX_IMAGE_PIXELS,
    Backend,
    ImageArray,
    apply_orientation,
    decode_image,
    exif_orientation,
    finish_pixels,
    open_pillow,
    pillow_pixels,
)
from h5pack.core.jpeg import JpegHeader, read_jpeg_header
from h5pack.core.jpegbox import decode_box
from h5pack.errors import DecodeError, OptionsError
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
    crop_uniforms,
    dct_reduction,
    plan_crop,
    plan_crops,
    positive_size,
    random_resized_box,
    scale_box,
    stored_box,
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

_DRAFT_FORMATS: Final[frozenset[str]] = frozenset({"JPEG", "MPO"})
_DRAFT_MODES: Final[frozenset[str]] = frozenset({"RGB", "L", "CMYK"})


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

    ``cv2.flip`` swaps the pixels in place in 8 us for 224x224x3, where numpy's
    ``out[...] = out[:, ::-1]`` (a buffered, 3-byte-strided copy) took 460 us.
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
    header = _jpeg_of(data, name, limit) if spec.reducing_gap is not None else None
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
    header = _jpeg_of(data, name, limit)
    if header is not None and header.mode in ("RGB", "L") and header.orientation == 1:
        pixels = _decode_jpeg(header, data, 1, name)
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
# box just covers the output loses detail on textured photos (sand, foliage: up to 6 dB
# PSNR against a Lanczos reference, where the full path loses none). Keeping the reduced
# box at least twice the output (Pillow's own `reducing_gap` in Image.thumbnail) brings
# that within about 1 dB of the full path; CropSpec.reducing_gap chooses. For ImageNet-sized
# photos (~500x375) cut to 224 the gap of 2 never reduces: the gain is on large photos.


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


def _jpeg_of(data: bytes, name: str, limit: int) -> JpegHeader | None:
    """The header of a JPEG the pipeline decodes itself; None for other files.

    ``core.jpeg.read_jpeg_header`` first (``NOTE [ Fast JPEG header ]``), Pillow's header
    for what it does not answer (which also raises the errors of a damaged or huge file).
    """
    header = read_jpeg_header(data)
    pillow_limit = Image.MAX_IMAGE_PIXELS
    if header is not None and header.width * header.height <= min(
        limit, pillow_limit if pillow_limit else limit
    ):
        return header
    image = open_pillow(data, name, limit)
    try:
        if (
            isinstance(image, ImageFile.ImageFile)
            and image.format in _DRAFT_FORMATS
            and image.mode in _DRAFT_MODES
            and len(image.tile) == 1
        ):
            width, height = image.size
            return JpegHeader(width, height, image.mode, exif_orientation(image))
    finally:
        image.close()
    return None


def upright_jpeg_header(data: bytes, channels: int) -> JpegHeader | None:
    """The header of a JPEG that :func:`decode_crop_into` decodes as stored, unconverted.

    An upright (EXIF orientation 1) RGB JPEG for ``channels`` 3, or gray one for 1, whose
    header ``core.jpeg.read_jpeg_header`` reads and whose size is within the pixel limits;
    None for anything else (which ``decode_crop_into`` also takes, by its other paths).
    """
    header = read_jpeg_header(data)
    if (
        header is None
        or header.orientation != 1
        or header.mode != ("L" if channels == 1 else "RGB")
    ):
        return None
    pillow_limit = Image.MAX_IMAGE_PIXELS
    limit = min(MAX_IMAGE_PIXELS, pillow_limit) if pillow_limit else MAX_IMAGE_PIXELS
    return header if header.width * header.height <= limit else None


def decode_jpeg(header: JpegHeader, data: bytes, *, name: str, reduction: int = 1) -> np.ndarray:
    """Decode the JPEG ``data`` whose header is ``header``, as stored: ``decode_crop_into``'s.

    Raises:
        DecodeError: the data does not decode; the message starts with ``name``.
    """
    return _decode_jpeg(header, data, reduction, name)


_BOX_CHANNELS: Final = {"RGB": 3, "L": 1}  # the modes decode_box takes, as stored
_BILINEAR_SUPPORT: Final = 1.0  # Pillow's BILINEAR filter reaches one pixel each way


def decode_jpeg_box(
    header: JpegHeader,
    data: bytes | np.ndarray,
    box: Box,
    reduction: int = 1,
    *,
    canvas: bool = False,
) -> np.ndarray | None:
    """The ``box`` of the JPEG ``data`` as stored, decoded alone; None where it cannot be.

    The pixels equal ``decode_jpeg(header, data, name=..., reduction=reduction)[box]``
    (``NOTE [ Decoding only the box ]``; ``box`` in the reduced image's pixels); None for a
    mode other than RGB and gray, or whatever :func:`h5pack.core.jpegbox.decode_box`
    declines: the caller then decodes the whole image. ``canvas``: as ``decode_box``'s.
    """
    channels = _BOX_CHANNELS.get(header.mode)
    if channels is None:
        return None
    size = (header.height, header.width)
    return decode_box(data, size, box, channels, reduction, canvas=canvas)


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
    pixels = _decode_jpeg(image, data, plan.reduction, name)
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
    one, which only Pillow's resize takes; rounding it to whole reduced pixels instead cost
    up to 19 dB of PSNR against the full path on the shared photos (38 dB against 57).
    """
    top, left, height, width = (v / reduction for v in box)
    two_d = pixels[:, :, 0] if pixels.shape[2] == 1 else pixels
    resized = Image.fromarray(np.ascontiguousarray(two_d)).resize(
        (out_size[1], out_size[0]),
        Image.Resampling.BILINEAR,
        box=(left, top, left + width, top + height),
    )
    return np.asarray(resized).reshape(*out_size, pixels.shape[2])


# NOTE [ JPEG decoder ]
# Pillow and OpenCV both decode JPEGs with libjpeg-turbo (same IDCT, same upsampling: the
# pixels were identical on every JPEG measured), but through Pillow a 500x375 JPEG took
# ~950 us (its loader decodes into 4-byte RGBX pixels that numpy then repacks) and through
# cv2.imdecode ~530 us, straight into an RGB array (2-core development VM, BENCHMARKS.md).
# So the pipeline decodes RGB and gray JPEGs with OpenCV whatever the backend, and the
# backend chooses the other formats' decoder and the resize filter. One behaviour differs:
# libjpeg recovers from corrupt entropy-coded data with a warning (printed on stderr by
# OpenCV) and grey blocks, where Pillow raises; OpenCV, torchvision.io and DALI serve such
# images. Truncated files are still refused (cv2 returns nothing, Pillow then raises), and
# `h5pack verify` or verify_checksums find damage done to a pack after it was written. A
# box decoded alone (core/jpegbox.py) is libjpeg-turbo too, with the same pixels; it
# leaves every file it warns about or cannot take to this decode.


def _decode_jpeg(header: JpegHeader, data: bytes, reduction: int, name: str) -> np.ndarray:
    """Decode the JPEG at ``1 / reduction`` scale, as stored: (h, w, 1|3) uint8.

    RGB and gray JPEGs go to ``cv2.imdecode`` (see ``NOTE [ JPEG decoder ]``); what it
    refuses or sizes differently, and CMYK, go to Pillow, whose errors are raised.
    """
    stored_w, stored_h = header.size
    if header.mode in ("RGB", "L"):
        pixels = _decode_jpeg_opencv(data, reduction, header.mode == "RGB")
        expected = (-(-stored_h // reduction), -(-stored_w // reduction))
        if pixels is not None and pixels.shape[:2] == expected:
            return pixels
    image = open_pillow(data, name, None)
    try:
        if reduction > 1:
            # Pillow's draft picks the largest of 8, 4, 2 not over min(W // w, H // h),
            # which for these requested sizes is exactly `reduction`.
            image.draft(image.mode, (stored_w // reduction, stored_h // reduction))
        # JPEG loading does not re-check Pillow's decompression-bomb limit (the header
        # did), so unlike decode._decode_pillow no warning needs silencing here.
        image.load()
        return pillow_pixels(image)
    except Exception as err:  # truncated or corrupt data raises OSError, SyntaxError, ...
        raise DecodeError(f"{name}: cannot decode {image.format} image: {err}") from err
    finally:
        image.close()


def _decode_jpeg_opencv(data: bytes, reduction: int, rgb: bool) -> np.ndarray | None:
    """``cv2.imdecode`` at ``1 / reduction``, EXIF orientation ignored; None if it fails."""
    import cv2

    reduced = {1: 0, 2: 16, 4: 32, 8: 64}[reduction]  # the IMREAD_REDUCED_* bits
    rgb_flag = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.11
    color = (rgb_flag if rgb_flag is not None else cv2.IMREAD_COLOR) if rgb else 0
    try:
        pixels = cv2.imdecode(
            np.frombuffer(data, dtype=np.uint8),
            color | reduced | cv2.IMREAD_IGNORE_ORIENTATION,
        )
    except cv2.error:
        return None
    if pixels is None or pixels.dtype != np.uint8:
        return None
    if pixels.ndim == 2:
        return pixels[:, :, None]
    if rgb_flag is None:
        cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB, dst=pixels)
    return pixels
