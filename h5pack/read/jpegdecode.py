"""JPEGs in the crop pipeline: headers, decodes at a scale, boxes decoded alone, and the cut."""

from __future__ import annotations

import math
from typing import Final, NamedTuple

import numpy as np
from PIL import Image, ImageFile

from h5pack.core.decode import MAX_IMAGE_PIXELS, exif_orientation, open_pillow
from h5pack.core.jpeg import JpegHeader, read_jpeg_header
from h5pack.core.jpegbox import decode_box
from h5pack.core.pixels import apply_orientation, finish_pixels, pillow_pixels
from h5pack.errors import DecodeError
from h5pack.read.boxes import Box, CropSpec, dct_reduction, scale_box, stored_box
from h5pack.read.cropplan import plan_crop
from h5pack.read.kernels import KeepDecoded, ResizeInto, flip_in_place, pillow_resize

_DRAFT_FORMATS: Final[frozenset[str]] = frozenset({"JPEG", "MPO"})
_DRAFT_MODES: Final[frozenset[str]] = frozenset({"RGB", "L", "CMYK"})


def jpeg_header(data: bytes, name: str, limit: int) -> JpegHeader | None:
    """The header of a JPEG the pipeline decodes itself; None for other files."""
    header = read_jpeg_header(data)
    if header is not None and _within(header, limit):
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
    """The header of a JPEG that :func:`decode_crop_into` decodes as stored, unconverted."""
    header = read_jpeg_header(data)
    mode = "L" if channels == 1 else "RGB"
    if header is None or header.orientation != 1 or header.mode != mode:
        return None
    return header if _within(header, MAX_IMAGE_PIXELS) else None


def _within(header: JpegHeader, limit: int) -> bool:
    """Whether the image is within ``limit`` pixels and Pillow's own limit."""
    pillow = Image.MAX_IMAGE_PIXELS
    return header.width * header.height <= (min(limit, pillow) if pillow else limit)


_BOX_CHANNELS: Final = {"RGB": 3, "L": 1}  # the modes decode_box takes, as stored


def decode_jpeg_box(
    header: JpegHeader,
    data: bytes | np.ndarray,
    box: Box,
    reduction: int = 1,
    *,
    canvas: bool = False,
) -> np.ndarray | None:
    """The ``box`` of the JPEG ``data`` as stored, decoded alone; None where it cannot be."""
    channels = _BOX_CHANNELS.get(header.mode)
    if channels is None:
        return None
    size = (header.height, header.width)
    return decode_box(data, size, box, channels, reduction, canvas=canvas)


# NOTE [ JPEG decoder ]
# Pillow and OpenCV both decode JPEGs with libjpeg-turbo (identical pixels on every JPEG
# measured), but cv2.imdecode decodes straight into RGB where Pillow's RGBX needs a repack
# (BENCHMARKS.md). So RGB and gray JPEGs go to OpenCV whatever the backend, which chooses
# the other formats' decoder and the resize filter. libjpeg recovers from corrupt entropy
# data with grey blocks where Pillow raises (as torchvision.io and DALI do); truncated files
# are still refused, and verify_checksums finds damage done to a pack. A box decoded alone
# (core/jpegbox.py) is libjpeg-turbo too, and leaves any file it warns about to this decode.


def decode_jpeg(header: JpegHeader, data: bytes, *, name: str, reduction: int = 1) -> np.ndarray:
    """Decode the JPEG at ``1 / reduction`` scale, as stored: (h, w, 1|3) uint8."""
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
        # did), so unlike ``core.decode`` no warning needs silencing here.
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


# NOTE [ JPEG DCT scaling ]
# libjpeg decodes a JPEG at 1/2, 1/4 or 1/8 size for a fraction of the cost (Pillow's draft,
# OpenCV's IMREAD_REDUCED_*: identical pixels). The box is planned on the full displayed
# size (the box decode_image + crop_array would cut), cut in stored coordinates and mapped
# to the reduced image (boxes.scale_box). The reduced IDCT is a cruder low-pass filter than
# an antialiased resize, so the reduced box stays at least CropSpec.reducing_gap (2, as
# Pillow's thumbnail) times the output: ImageNet photos cut to 224 then never reduce.


class JpegPlan(NamedTuple):
    """Where and how a JPEG is cut: the box as stored, the flip, the DCT reduction."""

    cut: Box
    flip: bool
    reduction: int
    orientation: int
    out_h: int
    out_w: int


def plan_jpeg(
    stored_h: int, stored_w: int, orientation: int, spec: CropSpec, where: tuple[int, int, int]
) -> JpegPlan:
    """Plan the box on the displayed size, then map it to the stored image and reduce."""
    seed, epoch, index = where
    height, width = (stored_w, stored_h) if orientation >= 5 else (stored_h, stored_w)
    box, flip = plan_crop(spec, height, width, seed=seed, epoch=epoch, index=index)
    out_h, out_w = spec.size[::-1] if orientation >= 5 else spec.size
    cut = stored_box(box, orientation, stored_h, stored_w)
    reduction = dct_reduction(cut, out_h, out_w, spec.reducing_gap)
    return JpegPlan(cut, flip, reduction, orientation, out_h, out_w)


_BILINEAR_SUPPORT: Final = 1.0  # Pillow's BILINEAR filter reaches one pixel each way


def decode_crop_jpeg(
    image: JpegHeader,
    data: bytes,
    spec: CropSpec,
    out: np.ndarray,
    where: tuple[int, int, int],
    resize: ResizeInto,
    name: str,
    keep: KeepDecoded | None,
) -> None:
    """Decode the JPEG ``image`` (maybe at a reduced scale), resize the planned box into ``out``."""
    stored_w, stored_h = image.size
    plan = plan_jpeg(stored_h, stored_w, image.orientation, spec, where)
    reduced = (-(-stored_h // plan.reduction), -(-stored_w // plan.reduction))
    if keep is None:  # only what the resize reads (NOTE [ Decoding only the box ])
        region = _region_read(plan, spec, reduced)
        # Pillow's resize of a fractional box gives other roundings on another image size
        # or place (measured), so it gets the region on an image-sized canvas
        canvas = plan.reduction > 1 and spec.backend == "pillow"
        boxed = decode_jpeg_box(image, data, region, plan.reduction, canvas=canvas)
        if boxed is not None:
            origin = (0, 0) if canvas else (region.top, region.left)
            resize_jpeg_into(boxed, plan, spec, out, resize, origin, reduced)
            return
    pixels = decode_jpeg(image, data, name=name, reduction=plan.reduction)
    if plan.reduction == 1 and keep is not None:
        keep(pixels, plan.orientation)
    resize_jpeg_into(pixels, plan, spec, out, resize, (0, 0), reduced)


def _region_read(plan: JpegPlan, spec: CropSpec, reduced: tuple[int, int]) -> Box:
    """The part of the (reduced) image that resizing ``plan``'s box reads, as a box of it."""
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


def resize_jpeg_into(
    pixels: np.ndarray,
    plan: JpegPlan,
    spec: CropSpec,
    out: np.ndarray,
    resize: ResizeInto,
    origin: tuple[int, int],
    reduced: tuple[int, int],
) -> None:
    """Resize the planned box of the JPEG's ``pixels`` into ``out``."""
    cut, flip, reduction, orientation, out_h, out_w = plan
    if reduction > 1 and spec.backend == "pillow":  # `pixels` the whole image or a canvas
        top, left, height, width = (v / reduction for v in cut)
        box = (left, top, left + width, top + height)  # Pillow's fractional box: the pixels
        small = pillow_resize(pixels, (out_h, out_w), box)  # the full path's, closest
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
