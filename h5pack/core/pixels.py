"""Decoded pixels in h5pack's one form: ``(H, W, C)`` uint8, C = 3 (RGB) or 1 (luminance).

EXIF-oriented (for PNG, an ``eXIf`` chunk before the image data only); transparency
composited onto white; 16-bit samples' high byte; other modes through Pillow's RGB;
one channel is Pillow's ``convert("L")`` luminance.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
from PIL import Image

ImageArray = npt.NDArray[np.uint8]
ALPHA_BACKGROUND: Final[tuple[int, int, int]] = (255, 255, 255)
_ALPHA_MODES: Final[frozenset[str]] = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})
# Pillow's RGB -> L weights (ITU-R 601-2 in 16-bit fixed point; they sum to 65536).
_LUMA_WEIGHTS: Final[tuple[int, int, int]] = (19595, 38470, 7471)


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


def from_16bit(values: np.ndarray) -> np.ndarray:
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
        pixels = from_16bit(np.asarray(image))
    elif mode == "F":
        pixels = _from_float(np.asarray(image))
    elif mode in ("1", "L") and not transparent:
        pixels = np.asarray(image if mode == "L" else image.convert("L"))
    elif mode in ("1", "L", "LA", "La"):
        pixels = np.asarray(image if mode == "LA" else image.convert("LA"))
    elif mode == "RGB" and not transparent:
        pixels = np.asarray(image)
    elif has_alpha(image):
        pixels = np.asarray(image if mode == "RGBA" else image.convert("RGBA"))
    else:  # P, RGBX, CMYK, YCbCr, LAB, HSV
        pixels = np.asarray(image.convert("RGB"))
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def has_alpha(image: Image.Image) -> bool:
    """Whether ``image`` (opened) has transparency: an alpha channel, ``tRNS``, a palette's."""
    palette = image.palette if image.mode == "P" else None
    transparent = "transparency" in image.info or (palette is not None and palette.mode == "RGBA")
    return image.mode in _ALPHA_MODES or transparent


def _composite(pixels: np.ndarray) -> np.ndarray:
    """Composite an (H, W, 2|4) array onto :data:`ALPHA_BACKGROUND`; return (H, W, 1|3)."""
    color = pixels[:, :, :-1].astype(np.uint32)
    alpha = pixels[:, :, -1:].astype(np.uint32)
    background = np.array(ALPHA_BACKGROUND, dtype=np.uint8)
    if color.shape[2] == 1:
        background = _luminance(background)
    blended = (color * alpha + background * (255 - alpha) + 127) // 255
    return blended.astype(np.uint8)


def _luminance(rgb: np.ndarray) -> np.ndarray:
    """Return the luminance of uint8 RGB values (last axis 3 -> 1), as Pillow's ``L``."""
    wr, wg, wb = _LUMA_WEIGHTS
    wide = rgb.astype(np.uint32)
    luma = (wide[..., 0] * wr + wide[..., 1] * wg + wide[..., 2] * wb + 0x8000) >> 16
    return luma.astype(np.uint8)[..., None]


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
