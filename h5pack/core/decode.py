"""Decode image bytes into (H, W, C) uint8 arrays in ``core.pixels``'s form.

``"pillow"`` decodes everything; ``"opencv"`` decodes JPEG, PNG, WebP and BMP and hands
Pillow every other file and every one it reads differently. Both read the header with
Pillow first, to refuse an image over ``max_pixels`` before decoding it.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
import warnings
from collections.abc import Iterator
from typing import Any, Final

import numpy as np
from PIL import Image, UnidentifiedImageError

from h5pack._types import StrPath
from h5pack.core.pixels import (
    ImageArray,
    apply_orientation,
    finish_pixels,
    from_16bit,
    has_alpha,
    pillow_pixels,
)
from h5pack.core.resize import (
    check_choice,
    check_size,
    fitted_size,
    pillow_resized,
    placed,
    resize_image,
)
from h5pack.core.vocabulary import BACKENDS as BACKENDS  # re-exported
from h5pack.core.vocabulary import RESIZE_METHODS as RESIZE_METHODS
from h5pack.core.vocabulary import Backend as Backend
from h5pack.core.vocabulary import ResizeMethod as ResizeMethod
from h5pack.errors import DecodeError

# Default limit on H * W before decoding: where Pillow itself refuses (about 13,400^2).
MAX_IMAGE_PIXELS: Final[int] = 178_956_970

_EXIF_ORIENTATION_TAG: Final[int] = 0x0112
_TIFF_WIDTH_TAG: Final[int] = 256
_TIFF_LENGTH_TAG: Final[int] = 257
_OPENCV_FORMATS: Final[frozenset[str]] = frozenset({"JPEG", "MPO", "PNG", "WEBP", "BMP"})

# NOTE [ Pillow's decompression-bomb warning ]
# h5pack applies its own limit (max_pixels) from the header, so Pillow's
# DecompressionBombWarning is noise: it is silenced around the calls that emit it rather
# than changing Image.MAX_IMAGE_PIXELS (global state). The filter list is process-global,
# so a lock keeps h5pack's threads from interleaving catch_warnings; it is held around
# Image.open and, for images over Pillow's threshold, their decoding.
_PIL_WARNINGS_LOCK = threading.Lock()


@contextlib.contextmanager
def _pillow_bomb_warning_silenced() -> Iterator[None]:
    with _PIL_WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def open_pillow(data: bytes, name: str, max_pixels: int | None) -> Image.Image:
    """Open ``data`` lazily (header only) and check its size; the caller closes it."""
    if not data:
        raise DecodeError(f"{name}: empty file (0 bytes), not an image")
    try:
        with _pillow_bomb_warning_silenced():
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as err:
        raise DecodeError(
            f"{name}: not a recognised image file ({len(data)} bytes starting {data[:12]!r})"
        ) from err
    except Image.DecompressionBombError as err:
        raise DecodeError(
            f"{name}: too large to decode: {err} (this is Pillow's own limit, "
            "PIL.Image.MAX_IMAGE_PIXELS, which h5pack does not change)"
        ) from err
    except Exception as err:  # a corrupt header can raise almost anything from a plugin
        raise DecodeError(f"{name}: cannot read the image header: {err!r}") from err
    if max_pixels is not None:
        width, height = image.size
        if width * height > max_pixels:
            image.close()
            raise DecodeError(
                f"{name}: image is {width}x{height} = {width * height} pixels, over the limit "
                f"of {max_pixels} (a decompression bomb?); pass a larger max_pixels to "
                "decode it"
            )
    return image


def exif_orientation(image: Image.Image) -> int:
    """Return the EXIF orientation (1..8) readable without decoding pixels; 1 if none."""
    if image.format == "PNG" and "exif" not in image.info:
        return 1  # a later eXIf chunk: getexif() would decode the whole PNG (core.pixels)
    try:
        value = image.getexif().get(_EXIF_ORIENTATION_TAG, 1)
    except Exception:  # corrupt EXIF: show the image as stored, as viewers do
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _decode_pillow(image: Image.Image, name: str, *, pixels: bool = True) -> np.ndarray | None:
    """Load ``image``'s pixels; return them as ``pillow_pixels`` does (None: ``pixels=False``)."""
    width, height = image.size
    pil_limit = Image.MAX_IMAGE_PIXELS
    huge = pil_limit is not None and width * height > pil_limit
    try:
        # Pillow can re-check sizes while loading (TIFF tiles, GIF frames).
        with _pillow_bomb_warning_silenced() if huge else contextlib.nullcontext():
            image.load()
            return pillow_pixels(image) if pixels else None
    except Exception as err:  # truncated or corrupt data raises OSError, SyntaxError, ...
        raise DecodeError(f"{name}: cannot decode {image.format} image: {err}") from err


# NOTE [ Decoding without the array ]: for the common case, an 8-bit RGB image without
# transparency or EXIF rotation decoded by Pillow into 3 channels, the array is exactly
# Pillow's own pixels, so ``decode_resized`` resizes the loaded Pillow image itself and
# ``decoded_size`` only loads it: no numpy round trip. Every other image takes the general
# path. Same pixels, same errors, less CPU (docs/decisions/0025).


@contextlib.contextmanager
def _loaded_plain(
    data: bytes, name: str, limit: int, backend: Backend, modes: tuple[str, ...]
) -> Iterator[Image.Image | None]:
    """The loaded image if its pixels are Pillow's own in ``modes`` (NOTE [ Decoding ... ])."""

    def plain(image: Image.Image) -> bool:
        return image.mode in modes and "transparency" not in image.info

    image = open_pillow(data, name, limit)
    try:
        if backend == "pillow" and plain(image) and exif_orientation(image) == 1:
            _decode_pillow(image, name, pixels=False)
            yield image if plain(image) else None  # a format may change its mode loading
        else:
            yield None
    finally:
        image.close()


def _decode_opencv(data: bytes, image: Image.Image) -> np.ndarray | None:
    """Decode with OpenCV into ``pillow_pixels``'s form; None hands the file to Pillow."""
    if image.format not in _OPENCV_FORMATS:
        return None
    import cv2  # imported here so that importing h5pack.core.decode stays fast

    try:
        decoded = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error:  # some decoders raise instead of returning None
        return None
    if decoded is None:
        return None
    if decoded.dtype == np.uint16:
        decoded = from_16bit(decoded)
    elif decoded.dtype != np.uint8:
        return None
    if decoded.ndim == 2:
        decoded = decoded[:, :, None]
    channels = decoded.shape[2]
    order: Any = {1: slice(None), 3: slice(None, None, -1), 4: [2, 1, 0, 3]}.get(channels)
    width, height = image.size
    if order is None or decoded.shape[:2] != (height, width):
        return None
    return None if has_alpha(image) and channels != 4 else decoded[:, :, order]  # BGR to RGB


def decode_image(
    data: bytes,
    *,
    name: str = "<bytes>",
    backend: Backend = "pillow",
    channels: int = 3,
    max_pixels: int | None = None,
) -> ImageArray:
    """Decode an image file's bytes into an (H, W, channels) uint8 array, EXIF-oriented.

    Raises ``DecodeError`` (starting with ``name``) for a file that is empty, no image,
    truncated, corrupt or over ``max_pixels`` (None: :data:`MAX_IMAGE_PIXELS`).
    """
    max_pixels = _checked_decode_args(backend, channels, max_pixels)
    image = open_pillow(data, name, max_pixels)
    try:
        orientation = exif_orientation(image)
        pixels = _decode_opencv(data, image) if backend == "opencv" else None
        if pixels is None:
            pixels = _decode_pillow(image, name)
            assert pixels is not None
            if orientation != 1 and exif_orientation(image) == 1:
                orientation = 1  # Pillow applied it while loading (recent Pillow, TIFF)
    finally:
        image.close()
    return finish_pixels(apply_orientation(pixels, orientation), channels)


def _checked_decode_args(backend: Backend, channels: int, max_pixels: int | None) -> int:
    """Check ``decode_image``'s choices; return the pixel limit to apply."""
    check_choice("backend", backend, BACKENDS)
    check_choice("channels", channels, (1, 3))
    if max_pixels is None:
        return MAX_IMAGE_PIXELS
    if max_pixels <= 0:
        raise ValueError(f"max_pixels should be positive, but got max_pixels={max_pixels}")
    return max_pixels


def decode_resized(
    data: bytes,
    size: tuple[int, int],
    *,
    name: str = "<bytes>",
    method: ResizeMethod = "stretch",
    backend: Backend = "pillow",
    channels: int = 3,
    max_pixels: int | None = None,
) -> tuple[ImageArray, tuple[int, int]]:
    """Return ``resize_image(decode_image(data, ...), size, ...)`` and the decoded (H, W)."""
    check_choice("method", method, RESIZE_METHODS)
    limit = _checked_decode_args(backend, channels, max_pixels)
    target_h, target_w = check_size(size)
    modes = ("RGB",) if channels == 3 else ()
    with _loaded_plain(data, name, limit, backend, modes) as image:
        if image is not None:
            width, height = image.size
            new_h, new_w = fitted_size(height, width, target_h, target_w, method)
            if (new_h, new_w) == (height, width):
                resized = np.array(image, dtype=np.uint8)
            else:
                resized = pillow_resized(image, new_h, new_w)
            return placed(resized, target_h, target_w, method), (height, width)
    decoded = decode_image(data, name=name, backend=backend, channels=channels, max_pixels=limit)
    source = (int(decoded.shape[0]), int(decoded.shape[1]))
    return resize_image(decoded, size, method=method, backend=backend), source


def decoded_size(
    data: bytes,
    *,
    name: str = "<bytes>",
    backend: Backend = "pillow",
    channels: int = 3,
    max_pixels: int | None = None,
) -> tuple[int, int]:
    """Return the ``(H, W)`` of ``decode_image(data, ...)``, decoding every pixel."""
    limit = _checked_decode_args(backend, channels, max_pixels)
    with _loaded_plain(data, name, limit, backend, ("RGB", "L")) as image:
        if image is not None:
            return image.size[1], image.size[0]
    decoded = decode_image(data, name=name, backend=backend, channels=channels, max_pixels=limit)
    return int(decoded.shape[0]), int(decoded.shape[1])


def probe_size(data: bytes, *, name: str = "<bytes>") -> tuple[int, int]:
    """Return an image's displayed (EXIF-oriented) ``(H, W)`` from its header alone."""
    image = open_pillow(data, name, None)
    try:
        width, height = _stored_size(image)
        orientation = exif_orientation(image)
    finally:
        image.close()
    return (width, height) if orientation >= 5 else (height, width)


def _stored_size(image: Image.Image) -> tuple[int, int]:
    """Return ``(W, H)`` as stored (recent Pillow reports a TIFF's already oriented)."""
    tags = getattr(image, "tag_v2", None) if image.format == "TIFF" else None
    if tags is not None:
        width, height = tags.get(_TIFF_WIDTH_TAG), tags.get(_TIFF_LENGTH_TAG)
        if isinstance(width, int) and isinstance(height, int):
            return width, height
    return image.size


def load_file(path: StrPath) -> bytes:
    """Return a file's bytes; a ``DecodeError`` naming it if it is unreadable or no regular file."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            # Opening a FIFO for reading would block until a writer comes.
            raise DecodeError(f"{os.fsdecode(path)}: not a regular file, cannot read it")
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise DecodeError(f"{os.fsdecode(path)}: cannot read: {err.strerror or err}") from err
