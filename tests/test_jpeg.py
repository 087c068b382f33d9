"""core.jpeg.read_jpeg_header: Pillow's size, mode and orientation, or None (then Pillow reads)."""

import io
import struct

import numpy as np
import pytest
from PIL import Image

from h5pack.core.decode import exif_orientation
from h5pack.core.jpeg import JpegHeader, read_jpeg_header
from h5pack.synthetic import synthesize_photo


def encode(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90, **params)
    return buffer.getvalue()


def pillow_header(data: bytes) -> JpegHeader:
    with Image.open(io.BytesIO(data)) as image:
        return JpegHeader(*image.size, image.mode, exif_orientation(image))


def exif_block(orientation: int, order: str = "<", kind: int = 3) -> bytes:
    """A TIFF block with IFD0 holding one orientation entry (and a second, unrelated one)."""
    mark = b"II" if order == "<" else b"MM"
    entries = struct.pack(order + "HHI", 0x010F, 2, 4) + b"abc\x00"  # Make
    value = struct.pack(order + "H", orientation) + b"\x00\x00"
    if kind == 4:
        value = struct.pack(order + "I", orientation)
    entries += struct.pack(order + "HHI", 0x0112, kind, 1) + value
    return (
        mark + struct.pack(order + "HI", 42, 8) + struct.pack(order + "H", 2) + entries + b"\0" * 4
    )


PHOTO = Image.fromarray(synthesize_photo(np.random.default_rng(0), (90, 130)))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
def test_the_header_is_pillows(orientation, mode):
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    data = encode(PHOTO.convert(mode), exif=exif.tobytes())
    assert read_jpeg_header(data) == pillow_header(data)


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("orientation", [0, 3, 6, 9])
def test_both_byte_orders_and_out_of_range_orientations(order, orientation):
    data = encode(PHOTO, exif=b"Exif\x00\x00" + exif_block(orientation, order))
    assert read_jpeg_header(data) == pillow_header(data)


def test_progressive_and_optimised_files():
    for params in ({"progressive": True}, {"optimize": True}, {"subsampling": 0}):
        data = encode(PHOTO, **params)
        assert read_jpeg_header(data) == pillow_header(data)


def test_what_it_does_not_understand_goes_to_pillow():
    long_orientation = encode(PHOTO, exif=b"Exif\x00\x00" + exif_block(6, kind=4))
    assert read_jpeg_header(long_orientation) is None
    xmp = b'http://ns.adobe.com/xap/1.0/\x00<x tiff:Orientation="6"/>'
    plain = encode(PHOTO)
    with_xmp = plain[:2] + b"\xff\xe1" + struct.pack(">H", len(xmp) + 2) + xmp + plain[2:]
    assert pillow_header(with_xmp).orientation == 6
    assert read_jpeg_header(with_xmp) is None
    bad_tiff = encode(PHOTO, exif=b"Exif\x00\x00XX\x00\x2a\x00\x00\x00\x08")
    assert read_jpeg_header(bad_tiff) is None
    assert read_jpeg_header(plain[:200]) is None  # no scan yet: truncated header
    assert read_jpeg_header(b"") is None
    png = io.BytesIO()
    PHOTO.save(png, format="PNG")
    assert read_jpeg_header(png.getvalue()) is None
