"""Decode, cut and resize training images to a fixed size: the image pipeline's kernels.

Where to cut is ``read.cropplan``'s (re-exported here with the box names). :func:`crop_into`
resizes a box of an array straight into a batch slot, then flips it; :func:`decode_crop_into`
does the same from an image file's bytes, decoding JPEGs at a reduced scale when the box
allows (NOTE [ JPEG DCT scaling ]) and only as far as the box (NOTE [ Decoding only the box
]). The pixels are ``decode_image``'s cut and resized, except those reduced JPEGs (a few
grey levels) and RGB and gray JPEGs decoded by OpenCV (NOTE [ JPEG decoder ]). The resizing
kernel is an argument (``ResizeInto``): Pillow's or OpenCV's reference, or a faster one.
"""

from __future__ import annotations

import numpy as np

from h5pack.core.decode import MAX_IMAGE_PIXELS, Backend, decode_image
from h5pack.core.pixels import ImageArray, finish_pixels
from h5pack.errors import OptionsError
from h5pack.read.boxes import (
    CROPS,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    Box,
    Crop,
    CropSpec,
    center_box,
    positive_size,
    scale_box,
)
from h5pack.read.cropplan import crop_uniforms, plan_crop, plan_crops, random_resized_box
from h5pack.read.jpegdecode import (
    decode_crop_jpeg,
    decode_jpeg,
    decode_jpeg_box,
    jpeg_header,
    plan_jpeg,
    resize_jpeg_into,
    upright_jpeg_header,
)
from h5pack.read.kernels import (
    KeepDecoded,
    ResizeInto,
    crop_into,
    flip_in_place,
    opencv_resize_into,
    pillow_resize_into,
    reference_resize,
)

__all__ = [  # the box names are re-exported: callers of the pipeline need only this module
    "CROPS",
    "DEFAULT_RATIO",
    "DEFAULT_SCALE",
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

# NOTE [ the cache changes no pixel ]
# A sample's output must not depend on whether the decoded cache holds it (issue 20 D). So
# the cache keeps exactly what decode_crop_into decodes in full, before any cut:
# decode_image's pixels (orientation 0), or a JPEG's as stored with its EXIF orientation,
# and a hit goes through the same cut, resize, orientation and channel code
# (crop_decoded_into). A JPEG whose box this epoch allows a reduced decode is decoded again
# at that scale, cached or not. (cache_max_side is the one exception, by design.)


def crop_array(
    hwc: np.ndarray,
    box: Box,
    out_size: tuple[int, int],
    *,
    flip: bool = False,
    backend: Backend = "pillow",
) -> ImageArray:
    """Cut ``box`` out of a uint8 (H, W, 1|3) image, resize it to ``out_size``, maybe flip.

    ``backend``: ``"pillow"`` (exactly ``Image.crop(box).resize(size, BILINEAR)``) or
    ``"opencv"`` (``INTER_AREA`` when shrinking, ``INTER_LINEAR`` otherwise).
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
    """:func:`decode_crop_into` into a new array, with ``spec.backend``'s reference kernel."""
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

    The box and flip are :func:`plan_crop`'s for the displayed size (see the module). ``out``
    is a C-contiguous uint8 ``(*spec.size, 3|1)`` (RGB, or luminance as ``decode_image``);
    ``resize`` the kernel (None: ``spec.backend``'s reference); ``keep`` is given the
    full-scale decode and its orientation before the cut (never a reduced one), what
    :func:`crop_decoded_into` takes to give the same output; ``max_pixels`` (None:
    ``MAX_IMAGE_PIXELS``) refuses larger images.
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
        decode_crop_jpeg(header, data, spec, out, (seed, epoch, index), kernel, name, keep)
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
    """Return ``decode_image``'s pixels, possibly read-only (an upright JPEG uncopied)."""
    if channels not in (1, 3):
        raise OptionsError(f"channels should be 1 or 3, but got channels={channels!r}")
    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    header = jpeg_header(data, name, limit)
    if header is not None and header.mode in ("RGB", "L") and header.orientation == 1:
        pixels = decode_jpeg(header, data, name=name)
        return pixels if pixels.shape[2] == channels else finish_pixels(pixels, channels)
    return decode_image(data, name=name, backend=backend, channels=channels, max_pixels=limit)


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

    ``pixels`` and ``orientation`` are what ``decode_crop_into`` gave ``keep`` (NOTE [ the
    cache changes no pixel ]). Returns False, writing nothing, when this epoch's box would
    have the JPEG decoded at a reduced scale (decode the bytes instead).
    """
    kernel = resize or reference_resize(spec.backend)
    if orientation == 0:
        box, flip = plan_crop(spec, *pixels.shape[:2], seed=seed, epoch=epoch, index=index)
        crop_into(pixels, box, out, flip=flip, resize=kernel)
        return True
    stored_h, stored_w = pixels.shape[:2]
    plan = plan_jpeg(stored_h, stored_w, orientation, spec, (seed, epoch, index))
    if plan.reduction != 1:
        return False
    resize_jpeg_into(pixels, plan, spec, out, kernel, (0, 0), (stored_h, stored_w))
    return True
