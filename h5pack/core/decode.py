"""Decode image bytes into RGB (or gray) uint8 arrays; resize and re-encode them.

Every decoded image is ``(H, W, C)`` uint8, C-contiguous and writable, with ``C`` = 3 (RGB)
or 1 (luminance), whatever the file held:

* Files are recognised by their content, never by their name.
* The EXIF orientation tag is applied (values 2..8), so ``H, W`` are as displayed. For PNG
  only an ``eXIf`` chunk before the image data counts: a later one would need the whole
  image decoded just to learn its size, and :func:`probe_size` must stay cheap.
* Transparency (alpha channels, ``tRNS`` and palette transparency) is composited onto
  :data:`ALPHA_BACKGROUND`, white: ``out = round((c * a + bg * (255 - a)) / 255)``.
* 16-bit samples become 8-bit by keeping their high byte (``v >> 8``, i.e.
  ``floor(v / 256)``, never more than 1 away from ``round(v * 255 / 65535)``): 65535 -> 255,
  32768 -> 128, 255 -> 0. This is what Pillow itself does to 16-bit RGB(A) PNGs, so doing
  it for gray as well makes both backends agree exactly. Nothing is clipped or wrapped.
* Pillow mode ``I`` (32-bit integers) is read on the same 16-bit scale (negative values
  become 0, values over 65535 become 255); mode ``F`` (floats) is read as ``[0, 1]``
  (clipped, NaN -> 0). ``1`` gives 0/255; ``CMYK``, ``YCbCr``, ``LAB`` and ``HSV`` go through
  Pillow's conversion to RGB (no colour management: ICC profiles are not applied).
* Multi-page files (TIFF, animated GIF/WebP, MPO) give their first frame.
* ``channels=1`` gives ITU-R 601-2 luminance, ``L = R * 299/1000 + G * 587/1000 +
  B * 114/1000``, computed exactly as Pillow's ``convert("L")`` (16-bit fixed point), after
  compositing; gray sources are returned as they are.

Backends: ``"pillow"`` decodes everything with Pillow. ``"opencv"`` decodes JPEG, PNG, WebP
and BMP with ``cv2.imdecode(..., IMREAD_UNCHANGED)`` and normalises the result the same way
(BGR -> RGB, alpha composite, 16-bit scaling, EXIF orientation from the header); every other
format (GIF, TIFF, ...) and every file OpenCV refuses or reads differently (e.g. a gray PNG
whose ``tRNS`` OpenCV drops) is handed to Pillow, so both backends give exactly the same
pixels on lossless files and agree within a few levels on JPEG (different IDCTs). Both
backends read the header with Pillow first: to recognise the file, check its size against
the decompression-bomb limit before any pixel is decoded, and read its EXIF orientation.

Decompression bombs: an image of more than ``max_pixels`` pixels (default
:data:`MAX_IMAGE_PIXELS`) is refused from its header, before decoding. Truncated files are
errors (Pillow's ``LOAD_TRUNCATED_IMAGES`` is never set); junk after a JPEG's end marker is
tolerated, as every decoder does.

Nothing here changes global state: no Pillow setting is modified, and see
``NOTE [ Pillow's decompression-bomb warning ]`` for the one warning filter used.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
import warnings
from collections.abc import Iterator
from typing import Final

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError

from h5pack._types import StrPath
from h5pack.core.vocabulary import BACKENDS as BACKENDS  # re-exported
from h5pack.core.vocabulary import RESIZE_METHODS as RESIZE_METHODS
from h5pack.core.vocabulary import Backend as Backend
from h5pack.core.vocabulary import ResizeMethod as ResizeMethod
from h5pack.errors import DecodeError

ImageArray = npt.NDArray[np.uint8]

PAD_VALUE: Final[int] = 0
"""Value of the border that ``resize_image(method="pad")`` adds (black, in every channel)."""

ALPHA_BACKGROUND: Final[tuple[int, int, int]] = (255, 255, 255)
"""RGB colour that transparent pixels are composited onto (white)."""

MAX_IMAGE_PIXELS: Final[int] = 178_956_970
"""Default limit on ``H * W`` before decoding: twice Pillow's default warning threshold, the
size at which Pillow itself refuses to open an image (about 13,400 x 13,400)."""

DEFAULT_JPEG_QUALITY: Final[int] = 90

_EXIF_ORIENTATION_TAG: Final[int] = 0x0112
_TIFF_WIDTH_TAG: Final[int] = 256
_TIFF_LENGTH_TAG: Final[int] = 257
_OPENCV_FORMATS: Final[frozenset[str]] = frozenset({"JPEG", "MPO", "PNG", "WEBP", "BMP"})
_ALPHA_MODES: Final[frozenset[str]] = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})
# Pillow's RGB -> L weights (ITU-R 601-2 in 16-bit fixed point; they sum to 65536).
_LUMA_WEIGHTS: Final[tuple[int, int, int]] = (19595, 38470, 7471)

# NOTE [ Pillow's decompression-bomb warning ]
# Pillow checks every image it opens against its global Image.MAX_IMAGE_PIXELS and reports
# sizes over it with a DecompressionBombWarning (an exception under `-W error`, as in our
# tests) and sizes over twice it with a DecompressionBombError. h5pack applies its own limit
# (max_pixels) from the header, so Pillow's warning is noise: we silence that one warning
# around the calls that can emit it, instead of changing Image.MAX_IMAGE_PIXELS (global
# state that other code relies on). The warnings filter list is itself process-global
# before Python 3.14, so entering catch_warnings from two threads at once could restore the
# wrong list: the lock keeps h5pack's own threads from interleaving there. It is held only
# around Image.open (header parsing, cheap) and, for images bigger than Pillow's threshold,
# around their decoding.
_PIL_WARNINGS_LOCK = threading.Lock()


@contextlib.contextmanager
def _pillow_bomb_warning_silenced() -> Iterator[None]:
    with _PIL_WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def _check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} should be one of {choices}, but got {name}={value!r}")


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
        return 1  # see the module docstring: getexif() would decode the whole PNG
    try:
        value = image.getexif().get(_EXIF_ORIENTATION_TAG, 1)
    except Exception:  # corrupt EXIF: show the image as stored, as viewers do
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def apply_orientation(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """Apply an EXIF orientation to an (H, W, C) array (as ``ImageOps.exif_transpose``)."""
    if orientation == 2:
        return pixels[:, ::-1]
    if orientation == 3:
        return pixels[::-1, ::-1]
    if orientation == 4:
        return pixels[::-1]
    if orientation == 5:
        return pixels.transpose(1, 0, 2)
    if orientation == 6:
        return np.rot90(pixels, k=-1)
    if orientation == 7:
        return pixels[::-1, ::-1].transpose(1, 0, 2)
    if orientation == 8:
        return np.rot90(pixels, k=1)
    return pixels


def _from_16bit(values: np.ndarray) -> np.ndarray:
    """Map 16-bit samples (any integer dtype) to 8 bits by their high byte; clip outside."""
    wide: np.ndarray = np.clip(values, 0, 65535).astype(np.uint16)
    return (wide >> 8).astype(np.uint8)


def _from_float(values: np.ndarray) -> np.ndarray:
    """Map ``[0, 1]`` floats to 0..255 (rounded; clipped outside; NaN -> 0)."""
    scaled = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    return np.rint(np.clip(scaled, 0.0, 1.0) * 255.0).astype(np.uint8)


def pillow_pixels(image: Image.Image) -> np.ndarray:
    """Return the loaded image as (H, W, C) uint8 with C = 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA)."""
    mode = image.mode
    transparent = "transparency" in image.info
    if mode.startswith("I"):  # I, I;16, I;16B, I;16L, I;16N
        pixels = _from_16bit(np.asarray(image))
    elif mode == "F":
        pixels = _from_float(np.asarray(image))
    elif mode in ("1", "L") and not transparent:
        pixels = np.asarray(image if mode == "L" else image.convert("L"))
    elif mode in ("1", "L", "LA", "La"):
        pixels = np.asarray(image if mode == "LA" else image.convert("LA"))
    elif mode == "RGB" and not transparent:
        pixels = np.asarray(image)
    elif mode in _ALPHA_MODES or transparent or _palette_has_alpha(image):
        pixels = np.asarray(image if mode == "RGBA" else image.convert("RGBA"))
    else:  # P, RGBX, CMYK, YCbCr, LAB, HSV
        pixels = np.asarray(image.convert("RGB"))
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def _palette_has_alpha(image: Image.Image) -> bool:
    palette = image.palette if image.mode == "P" else None
    return palette is not None and palette.mode == "RGBA"


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


# NOTE [ Decoding without the array ]: a conversion worker decodes every file, and before
# the fast paths below it went Pillow image -> numpy array (``np.asarray``: a copy, read-only)
# -> a writable copy (``finish_pixels``) -> a Pillow image again (``Image.fromarray``: a copy)
# -> resized -> numpy (two copies). For the common case, an 8-bit RGB image without
# transparency or EXIF rotation decoded by Pillow into 3 channels, the array is exactly
# Pillow's own pixels, so ``decode_resized`` resizes the loaded Pillow image itself, and
# ``decoded_size`` (encoded packs: the file must decode, its pixels are not kept) only loads
# it. Every other image takes the general path. Same pixels, same errors, less CPU
# (docs/decisions/0025).


def _plain_rgb(image: Image.Image) -> bool:
    """Whether ``pillow_pixels`` of ``image`` would be ``np.asarray(image)`` itself."""
    return image.mode == "RGB" and "transparency" not in image.info


def _fast_path(image: Image.Image, backend: Backend, channels: int) -> bool:
    """Whether ``image`` (opened, not loaded) can skip the array (NOTE [ Decoding ... ])."""
    return (
        backend == "pillow" and channels == 3 and _plain_rgb(image) and exif_orientation(image) == 1
    )


def _decode_opencv(data: bytes, image: Image.Image) -> np.ndarray | None:
    """Decode with OpenCV into the same (H, W, C) form as ``pillow_pixels``; None to defer.

    None hands the file to Pillow: a format not in ``_OPENCV_FORMATS``, a file OpenCV
    cannot decode (its error would be less precise than Pillow's), or a result that is not
    what Pillow's header promised (another size, or transparency OpenCV dropped).
    """
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
        decoded = _from_16bit(decoded)
    elif decoded.dtype != np.uint8:
        return None
    if decoded.ndim == 2:
        decoded = decoded[:, :, None]
    channels = decoded.shape[2]
    if channels == 3:
        decoded = decoded[:, :, ::-1]
    elif channels == 4:
        decoded = decoded[:, :, [2, 1, 0, 3]]
    elif channels != 1:
        return None
    width, height = image.size
    if decoded.shape[:2] != (height, width):
        return None
    has_alpha = (
        image.mode in _ALPHA_MODES or "transparency" in image.info or _palette_has_alpha(image)
    )
    if has_alpha and channels != 4:
        return None
    return decoded


def _composite(pixels: np.ndarray) -> np.ndarray:
    """Composite an (H, W, 2|4) array onto :data:`ALPHA_BACKGROUND`; return (H, W, 1|3)."""
    color = pixels[:, :, :-1].astype(np.uint32)
    alpha = pixels[:, :, -1:].astype(np.uint32)
    if color.shape[2] == 1:
        background = np.array([_luminance_of(ALPHA_BACKGROUND)], dtype=np.uint32)
    else:
        background = np.array(ALPHA_BACKGROUND, dtype=np.uint32)
    blended = (color * alpha + background * (255 - alpha) + 127) // 255
    return blended.astype(np.uint8)


def _luminance_of(rgb: tuple[int, int, int]) -> int:
    r, g, b = rgb
    wr, wg, wb = _LUMA_WEIGHTS
    return (r * wr + g * wg + b * wb + 0x8000) >> 16


def _luminance(rgb: np.ndarray) -> np.ndarray:
    """Return the (H, W, 1) luminance of an (H, W, 3) uint8 array, as Pillow's ``L``."""
    wr, wg, wb = _LUMA_WEIGHTS
    wide = rgb.astype(np.uint32)
    luma = (wide[:, :, 0] * wr + wide[:, :, 1] * wg + wide[:, :, 2] * wb + 0x8000) >> 16
    return luma.astype(np.uint8)[:, :, None]


def finish_pixels(pixels: np.ndarray, channels: int) -> ImageArray:
    """Composite alpha and convert to ``channels``; return a fresh C-contiguous array."""
    if pixels.shape[2] in (2, 4):
        pixels = _composite(pixels)
    if channels == 1 and pixels.shape[2] == 3:
        pixels = _luminance(pixels)
    elif channels == 3 and pixels.shape[2] == 1:
        pixels = np.repeat(pixels, 3, axis=2)
    out = np.ascontiguousarray(pixels, dtype=np.uint8)
    # np.asarray(PIL image) can be a read-only view of Pillow's bytes: never return one.
    return out if out.flags.writeable else out.copy()


def decode_image(
    data: bytes,
    *,
    name: str = "<bytes>",
    backend: Backend = "pillow",
    channels: int = 3,
    max_pixels: int | None = None,
) -> ImageArray:
    """Decode an image file's bytes into an (H, W, C) uint8 array (see the module docstring).

    Args:
        data: The file's bytes; the format is recognised from them.
        name: What to call the image in error messages (e.g. its relative path).
        backend: ``"pillow"`` or ``"opencv"``.
        channels: 3 for RGB, 1 for luminance.
        max_pixels: Refuse images with more than this many pixels; None means
            :data:`MAX_IMAGE_PIXELS`.

    Returns:
        A C-contiguous, writable uint8 array of shape (H, W, channels), EXIF-oriented.

    Raises:
        DecodeError: The bytes are empty, not an image, truncated, corrupt, or too large;
            the message starts with ``name``.
        ValueError: ``backend``, ``channels`` or ``max_pixels`` is invalid.
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
                # Pillow applied the orientation itself while loading, and dropped the tag
                # (recent Pillow does so for TIFF).
                orientation = 1
    finally:
        image.close()
    return finish_pixels(apply_orientation(pixels, orientation), channels)


def _checked_decode_args(backend: Backend, channels: int, max_pixels: int | None) -> int:
    """Check ``decode_image``'s choices; return the pixel limit to apply."""
    _check_choice("backend", backend, BACKENDS)
    _check_choice("channels", channels, (1, 3))
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
) -> ImageArray:
    """Return ``resize_image(decode_image(data, ...), size, ...)``: the same pixels, faster.

    The common case skips the numpy round trip between decoding and resizing (NOTE
    [ Decoding without the array ]).

    Args:
        data: The file's bytes.
        size: The output's (height, width).
        name: What to call the image in error messages.
        method: As for :func:`resize_image`.
        backend: As for :func:`decode_image`.
        channels: As for :func:`decode_image`.
        max_pixels: As for :func:`decode_image`.

    Raises:
        DecodeError: As :func:`decode_image`.
        ValueError: An invalid size, method, backend, channels or max_pixels.
    """
    _check_choice("method", method, RESIZE_METHODS)
    limit = _checked_decode_args(backend, channels, max_pixels)
    target_h, target_w = _check_size(size)
    image = open_pillow(data, name, limit)
    try:
        if _fast_path(image, backend, channels):
            _decode_pillow(image, name, pixels=False)
            if _plain_rgb(image):  # a format may change its mode while loading
                width, height = image.size
                new_h, new_w = _fitted(height, width, target_h, target_w, method)
                if (new_h, new_w) == (height, width):
                    resized = np.array(image, dtype=np.uint8)
                else:
                    resized = _pillow_resized(image, new_h, new_w)
                return _placed(resized, target_h, target_w, method)
    finally:
        image.close()
    decoded = decode_image(data, name=name, backend=backend, channels=channels, max_pixels=limit)
    return resize_image(decoded, size, method=method, backend=backend)


def decoded_size(
    data: bytes,
    *,
    name: str = "<bytes>",
    backend: Backend = "pillow",
    channels: int = 3,
    max_pixels: int | None = None,
) -> tuple[int, int]:
    """Return the ``(H, W)`` of ``decode_image(data, ...)``, decoding the image in full.

    Unlike :func:`probe_size`, every pixel is decoded, so a file that does not decode
    raises as :func:`decode_image` does; the array is not built where it is not needed
    (NOTE [ Decoding without the array ]).

    Raises:
        DecodeError: As :func:`decode_image`.
        ValueError: An invalid backend, channels or max_pixels.
    """
    limit = _checked_decode_args(backend, channels, max_pixels)
    image = open_pillow(data, name, limit)
    try:
        plain = image.mode in ("RGB", "L") and "transparency" not in image.info
        if backend == "pillow" and plain and exif_orientation(image) == 1:
            _decode_pillow(image, name, pixels=False)
            if image.mode in ("RGB", "L") and "transparency" not in image.info:
                width, height = image.size
                return height, width
    finally:
        image.close()
    decoded = decode_image(data, name=name, backend=backend, channels=channels, max_pixels=limit)
    return int(decoded.shape[0]), int(decoded.shape[1])


def probe_size(data: bytes, *, name: str = "<bytes>") -> tuple[int, int]:
    """Return an image's displayed ``(H, W)`` from its header, without decoding pixels.

    The size is after EXIF orientation, so it is the shape :func:`decode_image` returns.

    Args:
        data: The file's bytes.
        name: What to call the image in error messages.

    Returns:
        ``(height, width)``.

    Raises:
        DecodeError: The header cannot be read (not an image, empty, corrupt), or the size
            is over Pillow's own hard limit.
    """
    image = open_pillow(data, name, None)
    try:
        width, height = _stored_size(image)
        orientation = exif_orientation(image)
    finally:
        image.close()
    return (width, height) if orientation >= 5 else (height, width)


def _stored_size(image: Image.Image) -> tuple[int, int]:
    """Return ``(W, H)`` as stored, before any EXIF orientation.

    Recent Pillow reports a TIFF's size already oriented (and orients it while loading);
    the TIFF's own width and length tags give the stored size whatever the version.
    """
    tags = getattr(image, "tag_v2", None) if image.format == "TIFF" else None
    if tags is not None:
        width, height = tags.get(_TIFF_WIDTH_TAG), tags.get(_TIFF_LENGTH_TAG)
        if isinstance(width, int) and isinstance(height, int):
            return width, height
    return image.size


def _check_size(size: tuple[int, int]) -> tuple[int, int]:
    height, width = (int(v) for v in size)
    if height <= 0 or width <= 0:
        raise ValueError(f"size should be a positive (H, W), but got size={size!r}")
    return height, width


def _check_image(image: np.ndarray) -> None:
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3):
        raise ValueError(
            "image should be a uint8 array of shape (H, W, 1|3), but got "
            f"dtype={image.dtype} shape={image.shape}"
        )


def _resize_to(image: np.ndarray, height: int, width: int, backend: Backend) -> ImageArray:
    """Resize an (H, W, C) uint8 array to exactly (height, width), antialiased."""
    if image.shape[:2] == (height, width):
        return np.ascontiguousarray(image)
    if backend == "opencv":
        import cv2

        shrinking = height <= image.shape[0] and width <= image.shape[1]
        interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
        out = cv2.resize(np.ascontiguousarray(image), (width, height), interpolation=interpolation)
        return np.ascontiguousarray(out.reshape(height, width, image.shape[2]))
    two_d = image[:, :, 0] if image.shape[2] == 1 else image
    resized = _pillow_resized(Image.fromarray(np.ascontiguousarray(two_d)), height, width)
    return resized.reshape(height, width, image.shape[2])


def _pillow_resized(image: Image.Image, height: int, width: int) -> ImageArray:
    """Resize a Pillow image to (height, width); return its pixels as a writable array."""
    # Pillow's BILINEAR widens its support when shrinking, so it is antialiased (like
    # torchvision's Resize(antialias=True)).
    resized = image.resize((width, height), Image.Resampling.BILINEAR)
    return np.array(resized, dtype=np.uint8)


def resize_image(
    image: np.ndarray,
    size: tuple[int, int],
    *,
    method: ResizeMethod = "stretch",
    backend: Backend = "pillow",
) -> ImageArray:
    """Resize an (H, W, C) uint8 image to ``size`` = (H, W).

    Args:
        image: uint8 array of shape (H, W, 1) or (H, W, 3).
        size: The output's (height, width).
        method: ``"stretch"`` resizes to ``size`` ignoring the aspect ratio; ``"crop"``
            resizes so the image covers ``size`` (shorter side fits) and cuts the centre;
            ``"pad"`` resizes so the image fits inside ``size`` (longer side fits) and
            centres it on a :data:`PAD_VALUE` background.
        backend: ``"pillow"`` (bilinear, antialiased when shrinking) or ``"opencv"``
            (``INTER_AREA`` when shrinking, ``INTER_LINEAR`` otherwise).

    Returns:
        A C-contiguous uint8 array of shape (size[0], size[1], C); the input itself (made
        contiguous) when it already has that size and nothing is to be done.

    Raises:
        ValueError: The image, size, method or backend is invalid.
    """
    _check_choice("method", method, RESIZE_METHODS)
    _check_choice("backend", backend, BACKENDS)
    _check_image(image)
    target_h, target_w = _check_size(size)
    height, width = image.shape[:2]
    new_h, new_w = _fitted(height, width, target_h, target_w, method)
    resized = _resize_to(image, new_h, new_w, backend)
    return _placed(resized, target_h, target_w, method)


def _fitted(
    height: int, width: int, target_h: int, target_w: int, method: ResizeMethod
) -> tuple[int, int]:
    """Return the size an image is resized to before ``_placed`` crops or pads it."""
    if method == "stretch":
        return target_h, target_w
    if method == "crop":
        scale = max(target_h / height, target_w / width)
        return max(target_h, round(height * scale)), max(target_w, round(width * scale))
    scale = min(target_h / height, target_w / width)
    return (
        min(target_h, max(1, round(height * scale))),
        min(target_w, max(1, round(width * scale))),
    )


def _placed(resized: np.ndarray, target_h: int, target_w: int, method: ResizeMethod) -> ImageArray:
    """Return a resized (h, w, C) image cut (crop) or padded (pad) to (target_h, target_w)."""
    if resized.ndim == 2:
        resized = resized[:, :, None]
    new_h, new_w = resized.shape[:2]
    if method == "stretch":
        return np.ascontiguousarray(resized)
    if method == "crop":
        top, left = (new_h - target_h) // 2, (new_w - target_w) // 2
        return np.ascontiguousarray(resized[top : top + target_h, left : left + target_w])
    out = np.full((target_h, target_w, resized.shape[2]), PAD_VALUE, dtype=np.uint8)
    top, left = (target_h - new_h) // 2, (target_w - new_w) // 2
    out[top : top + new_h, left : left + new_w] = resized
    return out


def reencode_jpeg(
    image: np.ndarray, *, quality: int = DEFAULT_JPEG_QUALITY, max_side: int | None = None
) -> bytes:
    """Encode an (H, W, C) uint8 image as JPEG, first shrinking it so max(H, W) <= max_side.

    Args:
        image: uint8 array of shape (H, W, 1) or (H, W, 3).
        quality: JPEG quality, 1..100.
        max_side: Longest side allowed; the aspect ratio is kept. None keeps the size.

    Returns:
        The JPEG file's bytes (gray for C = 1).

    Raises:
        ValueError: The image, quality or max_side is invalid.
    """
    _check_image(image)
    if not 1 <= quality <= 100:
        raise ValueError(f"quality should be in 1..100, but got quality={quality}")
    if max_side is not None:
        if max_side <= 0:
            raise ValueError(f"max_side should be positive, but got max_side={max_side}")
        height, width = image.shape[:2]
        longest = max(height, width)
        if longest > max_side:
            scale = max_side / longest
            new_h = min(max_side, max(1, round(height * scale)))
            new_w = min(max_side, max(1, round(width * scale)))
            image = _resize_to(image, new_h, new_w, "pillow")
    two_d = image[:, :, 0] if image.shape[2] == 1 else image
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(two_d)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def load_file(path: StrPath) -> bytes:
    """Read a file's bytes, refusing anything that is not a regular file without opening it.

    Args:
        path: The file.

    Returns:
        Its bytes.

    Raises:
        DecodeError: The file cannot be read, or is a FIFO, socket, device or folder; the
            message names the path.
    """
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            # Opening a FIFO for reading would block until a writer comes.
            raise DecodeError(f"{os.fsdecode(path)}: not a regular file, cannot read it")
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise DecodeError(f"{os.fsdecode(path)}: cannot read: {err.strerror or err}") from err
