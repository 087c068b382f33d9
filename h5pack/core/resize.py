"""Resize decoded ``(H, W, 1|3)`` uint8 images (stretch, crop, pad) and re-encode them as JPEG."""

from __future__ import annotations

import io
from typing import Final

import numpy as np
from PIL import Image

from h5pack.core.pixels import ImageArray
from h5pack.core.vocabulary import BACKENDS, RESIZE_METHODS, Backend, ResizeMethod

PAD_VALUE: Final[int] = 0  # the border ``method="pad"`` adds (black)


def check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` (the argument ``name``) is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} should be one of {choices}, but got {name}={value!r}")


def check_size(size: tuple[int, int]) -> tuple[int, int]:
    """Return ``size`` as a positive ``(H, W)`` of ints, or raise ``ValueError``."""
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
    resized = pillow_resized(Image.fromarray(np.ascontiguousarray(two_d)), height, width)
    return resized.reshape(height, width, image.shape[2])


def pillow_resized(image: Image.Image, height: int, width: int) -> ImageArray:
    """Resize a Pillow image to (height, width); return its pixels as a writable array."""
    # Pillow's BILINEAR widens its support when shrinking: antialiased.
    resized = image.resize((width, height), Image.Resampling.BILINEAR)
    return np.array(resized, dtype=np.uint8)


def resize_image(
    image: np.ndarray,
    size: tuple[int, int],
    *,
    method: ResizeMethod = "stretch",
    backend: Backend = "pillow",
) -> ImageArray:
    """Resize an (H, W, 1|3) uint8 image to ``size``: stretch, cover and crop, or fit and pad.

    ``backend``: Pillow's antialiased bilinear, or OpenCV's area (shrinking) and linear.
    """
    check_choice("method", method, RESIZE_METHODS)
    check_choice("backend", backend, BACKENDS)
    _check_image(image)
    target_h, target_w = check_size(size)
    height, width = image.shape[:2]
    new_h, new_w = fitted_size(height, width, target_h, target_w, method)
    resized = _resize_to(image, new_h, new_w, backend)
    return placed(resized, target_h, target_w, method)


def fitted_size(
    height: int, width: int, target_h: int, target_w: int, method: ResizeMethod
) -> tuple[int, int]:
    """Return the size an image is resized to before ``placed`` crops or pads it."""
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


def placed(resized: np.ndarray, target_h: int, target_w: int, method: ResizeMethod) -> ImageArray:
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


def reencode_jpeg(image: np.ndarray, *, quality: int = 90, max_side: int | None = None) -> bytes:
    """Encode an (H, W, 1|3) uint8 image as JPEG, shrunk first so max(H, W) <= ``max_side``."""
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
