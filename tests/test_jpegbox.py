"""Decoding only a JPEG's box (NOTE [ Decoding only the box ]): a whole decode's pixels, exactly."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5pack.core import jpegbox
from h5pack.core.jpeg import JpegHeader, read_jpeg_header
from h5pack.errors import DecodeError
from h5pack.read import jpegdecode
from h5pack.read.crop import Box, CropSpec, decode_crop_into, decode_jpeg
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.synthetic import synthesize_photo
from h5pack.training.fixed_size import FixedSizeReader
from h5pack.training.resize import resize_kernel
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import crops_one_by_one, jpeg, shared_photos

SHARED_PHOTOS = shared_photos()

needs_decoder = pytest.mark.skipif(
    not jpegbox.available(), reason="the box decoder was not built or finds no libjpeg"
)


def test_ci_builds_the_box_decoder_and_finds_a_libjpeg():
    """CI must test the box decoder, not the fallback: its install compiles the extension
    (a C compiler and the Python headers are there) and Pillow ships a libjpeg-turbo."""
    if not os.environ.get("CI"):
        pytest.skip("outside CI the extension is optional (pyproject.toml: optional = true)")
    assert jpegbox.library() is not None
    assert jpegbox.available()


def _whole(data: bytes) -> np.ndarray:
    header = read_jpeg_header(data)
    assert header is not None
    return decode_jpeg(header, data, name="x.jpg")


def _boxes(rng: np.random.Generator, height: int, width: int) -> list[tuple[int, int, int, int]]:
    """Corners, whole rows and columns, boxes starting or ending on iMCU edges, 1x1, random."""
    boxes = [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, 1, 1)]
    for edge in (8, 16, 32):
        if edge < min(height, width):
            boxes += [
                (edge, edge, height - edge, width - edge),
                (0, 0, edge, edge),
                (edge - 1, edge + 1, min(5, height - edge + 1), min(7, width - edge - 1)),
            ]
    for _ in range(20):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        boxes.append(
            (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
        )
    return boxes


KINDS = {
    "4:2:0": dict(quality=90, subsampling=2),
    "4:2:2": dict(quality=90, subsampling=1),
    "4:4:4": dict(quality=90, subsampling=0),
    "progressive": dict(quality=85, progressive=True),
    "restart markers": dict(quality=90, restart_marker_rows=1),
    "low quality": dict(quality=20),
}
SIZES = [(375, 500), (53, 37), (17, 300), (1, 1), (16, 16), (129, 95)]


@needs_decoder
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_box_is_the_whole_decodes_box(kind, size):
    rng = np.random.default_rng(sum(size))
    pixels = synthesize_photo(rng, size)
    data = jpeg(pixels, **KINDS[kind])
    whole = _whole(data)
    for top, left, h, w in _boxes(rng, *size):
        got = jpegbox.decode_box(data, size, (top, left, h, w), 3)
        assert got is not None, (top, left, h, w)
        np.testing.assert_array_equal(got, whole[top : top + h, left : left + w], (top, left, h, w))


@needs_decoder
@pytest.mark.parametrize("reduction", [2, 4, 8])
@pytest.mark.parametrize("kind", ["4:2:0", "4:2:2", "4:4:4", "progressive"])
def test_a_reduced_box_is_the_reduced_whole_decodes_box(kind, reduction):
    """At 1/2, 1/4, 1/8 (libjpeg's DCT scaling): the box of the reduced whole decode."""
    rng = np.random.default_rng(reduction)
    size = (331, 517)
    data = jpeg(synthesize_photo(rng, size), **KINDS[kind])
    header = read_jpeg_header(data)
    assert header is not None
    whole = decode_jpeg(header, data, name="x.jpg", reduction=reduction)
    reduced = (-(-size[0] // reduction), -(-size[1] // reduction))
    assert whole.shape[:2] == reduced
    for top, left, h, w in _boxes(rng, *reduced):
        got = jpegbox.decode_box(data, size, (top, left, h, w), 3, reduction)
        assert got is not None, (top, left, h, w)
        np.testing.assert_array_equal(got, whole[top : top + h, left : left + w], (top, left, h, w))
    assert jpegbox.decode_box(data, size, (0, 0, reduced[0] + 1, 1), 3, reduction) is None


@needs_decoder
def test_a_gray_jpegs_box_is_its_whole_decodes_box():
    rng = np.random.default_rng(3)
    gray = synthesize_photo(rng, (90, 131))[:, :, 1]
    data = jpeg(gray, quality=90)
    whole = _whole(data)
    assert whole.shape == (90, 131, 1)
    for top, left, h, w in _boxes(rng, 90, 131):
        got = jpegbox.decode_box(data, (90, 131), (top, left, h, w), 1)
        assert got is not None
        np.testing.assert_array_equal(got, whole[top : top + h, left : left + w])
    assert jpegbox.decode_box(data, (90, 131), (0, 0, 5, 5), 3) is None  # gray is not RGB


@needs_decoder
@pytest.mark.skipif(not SHARED_PHOTOS.is_dir(), reason="no ../shared/data/photos here")
def test_the_real_photos_boxes_are_their_whole_decodes_boxes():
    """Full-size photos (mixed sizes, EXIF, large files), each with boxes everywhere."""
    rng = np.random.default_rng(0)
    photos = sorted(SHARED_PHOTOS.glob("*.jpg"))
    assert photos
    for path in photos:
        data = path.read_bytes()
        with Image.open(path) as image:  # Pillow's header: the fast one declines some
            assert image.mode == "RGB", path.name
            header = JpegHeader(image.width, image.height, "RGB", 1)
        whole = decode_jpeg(header, data, name=path.name)
        for top, left, h, w in _boxes(rng, header.height, header.width)[::4]:
            got = jpegdecode.decode_jpeg_box(header, data, Box(top, left, h, w))
            assert got is not None, path.name
            np.testing.assert_array_equal(got, whole[top : top + h, left : left + w], path.name)


@needs_decoder
def test_what_it_cannot_decode_exactly_it_declines():
    rng = np.random.default_rng(5)
    pixels = synthesize_photo(rng, (64, 80))
    data = jpeg(pixels, quality=90)
    size, box = (64, 80), (0, 0, 8, 8)
    assert jpegbox.decode_box(data, size, box, 3) is not None
    # a truncated file, even where the box ends above the cut: every epoch the same answer
    assert jpegbox.decode_box(data[: len(data) // 2], size, box, 3) is None
    assert jpegbox.decode_box(data[:-2], size, box, 3) is None
    # corrupt data libjpeg recovers from with a warning (a file cut, its end marker put back;
    # grey rows): left to the whole decode, which says so
    assert (
        jpegbox.decode_box(data[: len(data) // 2] + b"\xff\xd9", size, (40, 0, 24, 80), 3) is None
    )
    # another size than the header's, a box outside the image, an empty box
    assert jpegbox.decode_box(data, (64, 81), box, 3) is None
    assert jpegbox.decode_box(data, size, (60, 0, 8, 8), 3) is None
    assert jpegbox.decode_box(data, size, (0, 75, 8, 8), 3) is None
    assert jpegbox.decode_box(data, size, (0, 0, 0, 8), 3) is None
    # not a JPEG at all, and a CMYK one (other colour spaces go to the whole decode)
    assert jpegbox.decode_box(b"\x00" * 100 + b"\xff\xd9", size, box, 3) is None
    cmyk = jpeg(pixels, mode="CMYK")
    assert jpegbox.decode_box(cmyk, size, box, 3) is None
    header = read_jpeg_header(cmyk)
    assert header is not None
    assert header.mode == "CMYK"
    assert jpegdecode.decode_jpeg_box(header, cmyk, Box(*box)) is None


@needs_decoder
def test_a_truncated_jpeg_raises_the_whole_decodes_error_naming_the_file():
    """Declined, the sample goes to the whole decode, whose error names the file."""
    data = jpeg(synthesize_photo(np.random.default_rng(1), (64, 80)), quality=90)
    out = np.empty((16, 16, 3), dtype=np.uint8)
    spec = CropSpec.of(16, crop="random-resized")
    with pytest.raises(DecodeError, match=r"^cut\.jpg: "):
        decode_crop_into(
            data[: len(data) // 3], spec, out, seed=0, epoch=0, index=0, name="cut.jpg"
        )


def test_a_library_that_is_not_libjpeg_is_refused(tmp_path):
    pytest.importorskip("h5pack.core._jpegbox")
    from h5pack.core import _jpegbox

    with pytest.raises(OSError, match="cannot open"):
        _jpegbox.load(str(tmp_path / "missing.so"))
    import zlib  # a shared library with no libjpeg in it: CPython's zlib module

    with pytest.raises(OSError, match="has no jpeg_"):
        _jpegbox.load(zlib.__file__)


def test_why_the_box_decoder_is_off_is_said(monkeypatch):
    """The stall report and bench --diagnose tell a user why JPEGs are decoded whole."""
    if jpegbox.available():
        assert jpegbox.unavailable_reason() is None
        with jpegbox.disabled():
            assert "disabled" in (jpegbox.unavailable_reason() or "")
    monkeypatch.setattr(jpegbox, "library", lambda: None)
    monkeypatch.setenv("H5PACK_LIBJPEG", "none")
    assert jpegbox.unavailable_reason() == "H5PACK_LIBJPEG=none turns the box decoder off"
    monkeypatch.setenv("H5PACK_LIBJPEG", "/nowhere/libjpeg.so.62")
    reason = jpegbox.unavailable_reason() or ""
    assert "/nowhere/libjpeg.so.62" in reason or "not built" in reason


def test_h5pack_libjpeg_none_turns_the_box_decoder_off():
    code = "from h5pack.core import jpegbox; print(jpegbox.available(), jpegbox.library())"
    env = dict(os.environ, H5PACK_LIBJPEG="none")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "None"]


# -- through the pipeline: the same batches with and without box decodes ---------------------


def _files() -> list[bytes]:
    """ImageNet-like JPEGs, EXIF-rotated ones, a gray, a progressive and a CMYK one."""
    rng = np.random.default_rng(11)
    return [
        jpeg(
            synthesize_photo(rng, (180 + 23 * i, 260 - 9 * i)),
            orientation={1: 6, 6: 3}.get(i, 1),
            mode={4: "L", 8: "CMYK"}.get(i),
            progressive=i == 5,
        )
        for i in range(10)
    ]


@pytest.fixture(scope="module")
def jpeg_pack(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("box") / "jpegs.h5"
    files = _files()
    write_arrays(path, files, [0] * len(files), options=ConvertOptions(chunk_bytes=1 << 16))
    return path


@needs_decoder
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("crop_name", ["random-resized", "center"])
def test_the_pipeline_serves_the_same_pixels_with_and_without_box_decodes(
    jpeg_pack, threads, crop_name, monkeypatch
):
    """The per-batch loop (upright RGB JPEGs) and the one-by-one path (rotated, gray, CMYK):
    the same batches with box decodes as with whole ones, epoch after epoch."""
    decoded = []
    real = jpegdecode.decode_box

    def counting(*args, **keywords):
        got = real(*args, **keywords)
        decoded.append(got is not None)
        return got

    monkeypatch.setattr(jpegdecode, "decode_box", counting)
    # 112: no box of these ~200-px images allows a reduced decode (NOTE [ JPEG DCT scaling ])
    spec = CropSpec.of(112, crop=crop_name, flip=True)
    reader = PackReader(jpeg_pack, ReaderOptions(threads=threads))
    count = len(reader.meta.labels)
    stored = reader.read_stored(np.arange(count))
    kernel = resize_kernel(spec.backend)

    def epoch(number: int) -> tuple[np.ndarray, np.ndarray]:
        batch = np.zeros((count, 112, 112, 3), dtype=np.uint8)
        FixedSizeReader(reader, spec, None).read_into(np.arange(count), batch, seed=2, epoch=number)
        one_by_one = np.zeros_like(batch)
        crops_one_by_one(stored, spec, one_by_one, seed=2, epoch=number, resize=kernel)
        return batch, one_by_one

    for number in range(3):
        decoded.clear()
        with_boxes = epoch(number)
        # every JPEG but the CMYK one, in each path, decoded its box alone
        assert decoded == [True] * 2 * (count - 1)
        with jpegbox.disabled():
            whole = epoch(number)
        np.testing.assert_array_equal(with_boxes[0], whole[0], f"per-batch loop, epoch {number}")
        np.testing.assert_array_equal(with_boxes[1], whole[1], f"one by one, epoch {number}")
        np.testing.assert_array_equal(with_boxes[0], with_boxes[1], f"epoch {number}")


def _large_files() -> list[bytes]:
    """Photos large enough for reduced decodes of 48x48 outputs, upright and rotated."""
    rng = np.random.default_rng(13)
    return [
        jpeg(
            synthesize_photo(rng, (700 + 97 * i, 1100 - 61 * i)),
            85,
            orientation=6 if i % 3 == 1 else 1,
            mode="L" if i == 4 else None,
            subsampling=i % 3,
        )
        for i in range(6)
    ]


@needs_decoder
@pytest.mark.parametrize("backend", ["pillow", "opencv"])
def test_reduced_decodes_of_a_box_give_the_whole_reduced_decodes_pixels(backend, monkeypatch):
    """A box that takes a reduced decode (NOTE [ JPEG DCT scaling ]) decodes only the region
    its resize reads (for Pillow's fractional box, the box widened by the filter's reach, on
    an image-sized canvas): the same output as the whole reduced image, epoch after epoch."""
    reductions = []
    real = jpegdecode.decode_box

    def counting(data, size, box, channels, reduction=1, *, canvas=False):
        got = real(data, size, box, channels, reduction, canvas=canvas)
        if got is not None:  # None only while disabled: every other call is counted below
            reductions.append(reduction)
        return got

    monkeypatch.setattr(jpegdecode, "decode_box", counting)
    spec = CropSpec.of(48, crop="random-resized", flip=True, backend=backend)
    files = _large_files()
    for epoch in range(4):
        for index, data in enumerate(files):
            boxed = np.empty((48, 48, 3), dtype=np.uint8)
            decode_crop_into(data, spec, boxed, seed=1, epoch=epoch, index=index)
            whole = np.empty_like(boxed)
            with jpegbox.disabled():
                decode_crop_into(data, spec, whole, seed=1, epoch=epoch, index=index)
            np.testing.assert_array_equal(boxed, whole, f"epoch {epoch}, image {index}")
    assert len(reductions) == 4 * len(files)
    assert {2, 4, 8} <= set(reductions)


@needs_decoder
@pytest.mark.skipif(not SHARED_PHOTOS.is_dir(), reason="no ../shared/data/photos here")
@pytest.mark.parametrize("backend", ["pillow", "opencv"])
def test_the_real_photos_crops_are_the_same_with_box_decodes(backend):
    """Full-size photos cut to 224: most boxes take a reduced decode."""
    spec = CropSpec.of(224, crop="random-resized", flip=True, backend=backend)
    photos = sorted(SHARED_PHOTOS.glob("*.jpg"))
    for epoch in range(2):
        for index, path in enumerate(photos):
            data = path.read_bytes()
            boxed = np.empty((224, 224, 3), dtype=np.uint8)
            decode_crop_into(data, spec, boxed, seed=4, epoch=epoch, index=index, name=path.name)
            whole = np.empty_like(boxed)
            with jpegbox.disabled():
                decode_crop_into(data, spec, whole, seed=4, epoch=epoch, index=index)
            np.testing.assert_array_equal(boxed, whole, f"{path.name}, epoch {epoch}")


def test_the_pipeline_decodes_whole_images_without_the_decoder(jpeg_pack, monkeypatch):
    """No extension or no libjpeg (available() False): the same batches, from whole decodes."""
    spec = CropSpec.of(64, crop="random-resized", flip=True)
    reader = PackReader(jpeg_pack, ReaderOptions(threads=1))
    count = len(reader.meta.labels)
    batch = np.zeros((count, 64, 64, 3), dtype=np.uint8)
    FixedSizeReader(reader, spec, None).read_into(np.arange(count), batch, seed=2, epoch=0)
    monkeypatch.setattr(jpegbox, "library", lambda: None)
    assert not jpegbox.available()
    again = np.zeros_like(batch)
    FixedSizeReader(reader, spec, None).read_into(np.arange(count), again, seed=2, epoch=0)
    np.testing.assert_array_equal(batch, again)
