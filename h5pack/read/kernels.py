"""The resizing kernels of the crop pipeline: a box of an image resized into a batch slot."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image

from h5pack.core.decode import BACKENDS, Backend
from h5pack.errors import OptionsError
from h5pack.read.boxes import Box

ResizeInto = Callable[[np.ndarray, np.ndarray], None]
"""A resizing kernel: ``resize(source, out)`` resizes the ``(h, w, C)`` uint8 ``source`` (any
row stride, possibly read-only) into the C-contiguous ``(H, W, C)`` uint8 ``out``, same C."""

KeepDecoded = Callable[[np.ndarray, int], None]
"""``keep(pixels, orientation)``: given a full-scale decode by :func:`decode_crop_into`, for
:func:`crop_decoded_into` to cut later (the decoded cache's ``put``)."""


def pillow_resize_into(source: np.ndarray, out: np.ndarray) -> None:
    """Resize with Pillow's antialiased ``BILINEAR``: exactly ``Image.resize`` (a kernel)."""
    out[...] = source if source.shape[:2] == out.shape[:2] else pillow_resize(source, out.shape)


def pillow_resize(
    source: np.ndarray,
    size: tuple[int, ...],
    box: tuple[float, float, float, float] | None = None,
) -> np.ndarray:
    """Return ``source`` (or its fractional ``box``, l t r b) resized to ``size[:2]`` (H, W)."""
    two_d = source[:, :, 0] if source.shape[2] == 1 else source
    resized = Image.fromarray(np.ascontiguousarray(two_d)).resize(
        (size[1], size[0]), Image.Resampling.BILINEAR, box=box
    )
    return np.asarray(resized).reshape(size[0], size[1], source.shape[2])


def opencv_resize_into(source: np.ndarray, out: np.ndarray) -> None:
    """Resize with OpenCV: ``INTER_AREA`` shrinking, else ``INTER_LINEAR`` (a kernel)."""
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
    """Return the reference kernel of ``backend``: Pillow's or OpenCV's resize."""
    if backend == "pillow":
        return pillow_resize_into
    if backend == "opencv":
        return opencv_resize_into
    raise OptionsError(f"backend should be one of {BACKENDS}, but got backend={backend!r}")


def crop_into(
    hwc: np.ndarray, box: Box, out: np.ndarray, *, flip: bool, resize: ResizeInto
) -> None:
    """Resize ``box`` of ``hwc`` into ``out`` with ``resize``, then flip ``out`` if asked."""
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
    """Flip the C-contiguous ``(H, W, C)`` uint8 ``out`` horizontally, in place."""
    import cv2

    target = out[:, :, 0] if out.shape[2] == 1 else out
    result = cv2.flip(target, 1, dst=target)
    if result is not target:  # OpenCV allocated anew (it should not): copy it over
        target[...] = result
