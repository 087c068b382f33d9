"""JPEG decoding for the crop pipeline: headers, whole decodes at a scale, boxes decoded alone."""

from __future__ import annotations

from typing import Final

import numpy as np
from PIL import Image, ImageFile

from h5pack.core.decode import MAX_IMAGE_PIXELS, exif_orientation, open_pillow, pillow_pixels
from h5pack.core.jpeg import JpegHeader, read_jpeg_header
from h5pack.core.jpegbox import decode_box
from h5pack.errors import DecodeError
from h5pack.read.boxes import Box

__all__ = ["decode_jpeg", "decode_jpeg_box", "jpeg_header", "upright_jpeg_header"]

_DRAFT_FORMATS: Final[frozenset[str]] = frozenset({"JPEG", "MPO"})
_DRAFT_MODES: Final[frozenset[str]] = frozenset({"RGB", "L", "CMYK"})


def jpeg_header(data: bytes, name: str, limit: int) -> JpegHeader | None:
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


# NOTE [ JPEG decoder ]
# Pillow and OpenCV both decode JPEGs with libjpeg-turbo (same IDCT, same upsampling: the
# pixels were identical on every JPEG measured), but Pillow's loader decodes into 4-byte
# RGBX pixels that numpy then repacks, where cv2.imdecode decodes straight into an RGB array
# for far less CPU (BENCHMARKS.md).
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
