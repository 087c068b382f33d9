"""Decode only a box of a JPEG: the rows and columns a crop needs, the pixels a whole decode has.

# NOTE [ Decoding only the box ]
# libjpeg-turbo's jpeg_crop_scanline restricts the IDCT, upsampling and colour conversion
# to the box's columns, jpeg_skip_scanlines entropy-decodes the rows above without the
# rest, and the decode stops at the box's last row; ``_jpegbox`` drives it from C without
# the GIL. Same pixels, bit for bit (the region is a pixel wider where the image goes on,
# then cut; tests/test_jpegbox.py). The extension links no libjpeg: it loads Pillow's,
# else the system's libjpeg.so.62 (``H5PACK_LIBJPEG`` names another, or ``none``). What it
# refuses (no EOI, other colour spaces, boxes outside, any libjpeg warning) is decoded
# whole, which raises. Gain: docs/decisions/0003-box-decoder-kept.md.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import glob
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np

__all__ = ["available", "decode_box", "disabled", "library", "unavailable_reason"]

_EOI: Final[bytes] = b"\xff\xd9"
# the most the decoded region is wider than the box: one column of margin on each side, and
# up to an iMCU (at most 32 columns: 4x horizontal chroma subsampling) less one on each side
_WIDENING: Final[int] = 2 * 32
_LOCK = threading.Lock()
_STATE: dict[str, str | None] = {}  # "library": the path loaded, or None once none could be
_DISABLED = [False]  # set by disabled(), for the whole process and the workers it forks


def _candidates() -> list[str]:
    """The libjpeg libraries to try, in order."""
    chosen = os.environ.get("H5PACK_LIBJPEG")
    if chosen:
        return [] if chosen.lower() == "none" else [chosen]
    import PIL

    root = Path(PIL.__file__).resolve().parent  # auditwheel's and delocate's places
    found: list[str] = []
    for where in (
        root.parent / "pillow.libs" / "libjpeg*.so*",
        root / ".dylibs" / "libjpeg*.dylib",
    ):
        found += sorted(glob.glob(str(where)))
    system = ctypes.util.find_library("jpeg")
    found += [name for name in (system, "libjpeg.so.62") if name and name not in found]
    return found


def library() -> str | None:
    """The libjpeg the box decoder uses, loading it on first call; None if there is none."""
    if "library" in _STATE:
        return _STATE["library"]
    with _LOCK:
        if "library" not in _STATE:
            _STATE["library"] = _load()
    return _STATE["library"]


def _load() -> str | None:
    try:
        from h5pack.core import _jpegbox
    except ImportError:  # built without a C compiler: whole decodes only
        return None
    if sys.platform == "win32":  # pragma: no cover - the extension needs dlopen
        return None
    for path in _candidates():
        try:
            _jpegbox.load(path)
        except OSError:
            continue
        return path
    return None


def unavailable_reason() -> str | None:
    """Why :func:`decode_box` declines every JPEG here, in words; None when it decodes."""
    if _DISABLED[0]:
        return "box decodes are disabled in this process (jpegbox.disabled())"
    if library() is not None:
        return None
    chosen = os.environ.get("H5PACK_LIBJPEG", "")
    if chosen.lower() == "none":
        return "H5PACK_LIBJPEG=none turns the box decoder off"
    try:
        from h5pack.core import _jpegbox  # noqa: F401
    except ImportError:
        return (
            "h5pack's box decoder was not built (no C compiler and Python headers at install "
            "time, e.g. Debian's build-essential python3-dev; reinstall with them)"
        )
    tried = ", ".join(_candidates()) or "none"
    return f"no libjpeg here takes the box decoder's libjpeg 6.2 calls (tried: {tried})"


def available() -> bool:
    """Whether :func:`decode_box` decodes (the extension and a libjpeg are there, not disabled)."""
    return not _DISABLED[0] and library() is not None


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, :func:`decode_box` declines, in every thread and forked worker."""
    before = _DISABLED[0]
    _DISABLED[0] = True
    try:
        yield
    finally:
        _DISABLED[0] = before


def decode_box(
    data: bytes | np.ndarray,
    size: tuple[int, int],
    box: tuple[int, int, int, int],
    channels: int,
    reduction: int = 1,
    *,
    canvas: bool = False,
) -> np.ndarray | None:
    """The ``box`` (top, left, height, width) of the JPEG ``data`` of stored (H, W) ``size``.

    At 1/``reduction`` of the size (NOTE [ JPEG DCT scaling ]); None when this decoder
    declines, and the caller decodes whole. With ``canvas``, the whole reduced image's
    array, in which only the box holds pixels.
    """
    top, left, height, width = box
    if not available() or min(top, left) < 0 or min(height, width) <= 0:
        return None
    if bytes(data[-2:]) != _EOI:
        return None
    from h5pack.core import _jpegbox

    # room for the widened region's rows, decoded in place; the box's rows end at the front
    reduced = (-(-size[0] // reduction), -(-size[1] // reduction))
    if canvas:
        room = np.empty(reduced[0] * reduced[1] * channels, dtype=np.uint8)
    else:
        room = np.empty((height + 1) * min(width + _WIDENING, reduced[1]) * channels, np.uint8)
    status, warnings = _jpegbox.decode_box(
        data, size[0], size[1], top, left, height, width, channels, room, reduction, canvas
    )
    if status != 0 or warnings != 0:
        return None
    if canvas:
        return room.reshape(*reduced, channels)
    return room[: height * width * channels].reshape(height, width, channels)
