"""A JPEG's header in a few microseconds: size, mode and EXIF orientation, as Pillow reads them.

# NOTE [ Fast JPEG header ]
# ``read_jpeg_header`` walks the markers up to the first scan and reads only SOFn and the
# first EXIF APP1, where Pillow parses every marker in Python (docs/decisions/0025). It
# answers only for files it understands completely (8-bit, 1, 3 or 4 components, one SHORT
# orientation tag, no XMP), else None: the caller opens the file with Pillow.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
_EXIF = b"Exif\x00\x00"
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
_ORIENTATION = 0x0112


@dataclass(frozen=True, slots=True)
class JpegHeader:
    """What ``Image.open`` reads of a JPEG: stored size, Pillow's mode, EXIF orientation."""

    width: int
    height: int
    mode: str
    orientation: int

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)``, as ``Image.size``."""
        return self.width, self.height


def read_jpeg_header(data: bytes | memoryview) -> JpegHeader | None:
    """Return the header of the JPEG ``data``, or None when Pillow must read it (any doubt)."""
    try:
        return _read(data)
    except (struct.error, IndexError, ValueError):
        return None


def _read(data: bytes | memoryview) -> JpegHeader | None:
    if data[:2] != b"\xff\xd8":
        return None
    size = len(data)
    position = 2
    frame: tuple[int, int, str] | None = None
    orientation: int | None = None
    exif_seen = False
    while position + 4 <= size:
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:
            return None  # markers without a length where none belongs: let Pillow judge
        (length,) = struct.unpack_from(">H", data, position + 2)
        if length < 2 or position + 2 + length > size:
            return None
        body = position + 4
        end = position + 2 + length
        if marker == 0xDA:  # start of scan: the header is complete
            if frame is None:
                return None
            width, height, mode = frame
            return JpegHeader(width, height, mode, orientation or 1)
        if marker in _SOF:
            if frame is not None or length < 8:
                return None
            bits, height, width, layers = struct.unpack_from(">BHHB", data, body)
            if bits != 8 or layers not in _MODES or width == 0 or height == 0:
                return None
            frame = (width, height, _MODES[layers])
        elif marker == 0xE1:
            segment = bytes(data[body:end])
            if segment.startswith(_XMP):
                return None  # Pillow may read an orientation from XMP
            if segment.startswith(_EXIF):
                if exif_seen:
                    return None  # Pillow joins several EXIF segments
                exif_seen = True
                orientation = _exif_orientation(segment[len(_EXIF) :])
                if orientation is None:
                    return None
        position = end
    return None  # no scan: truncated or not a JPEG that Pillow would open alike


def _exif_orientation(tiff: bytes) -> int | None:
    """The orientation of IFD0 of the TIFF block ``tiff`` (1 without one); None if unsure."""
    order = tiff[:2]
    if order == b"II":
        prefix = "<"
    elif order == b"MM":
        prefix = ">"
    else:
        return None
    magic, ifd = struct.unpack_from(prefix + "HI", tiff, 2)
    if magic != 42 or ifd < 8 or ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(prefix + "H", tiff, ifd)
    if ifd + 2 + 12 * count > len(tiff):
        return None
    found: int | None = None
    for entry in range(count):
        tag, kind, values = struct.unpack_from(prefix + "HHI", tiff, ifd + 2 + 12 * entry)
        if tag != _ORIENTATION:
            continue
        if found is not None or kind != 3 or values != 1:
            return None
        (found,) = struct.unpack_from(prefix + "H", tiff, ifd + 10 + 12 * entry)
    if found is None:
        return 1
    return found if 1 <= found <= 8 else 1
