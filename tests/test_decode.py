"""Tests for h5pack.core.decode: modes, EXIF, alpha, 16-bit, bombs, corrupt input, resizing."""

from __future__ import annotations

import io
import os
import struct
import warnings
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from h5pack.core.decode import (
    MAX_IMAGE_PIXELS,
    Backend,
    decode_image,
    load_file,
    probe_size,
)
from h5pack.core.pixels import ALPHA_BACKGROUND
from h5pack.core.resize import PAD_VALUE, reencode_jpeg, resize_image
from h5pack.errors import DecodeError

BACKENDS: list[Backend] = ["pillow", "opencv"]
H, W = 24, 32  # not square, so a transposition cannot go unnoticed


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_rgb(seed: int = 0, shape: tuple[int, int] = (H, W)) -> np.ndarray:
    return rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


def smooth_rgb(shape: tuple[int, int] = (64, 96)) -> np.ndarray:
    """A photo-like image (smooth shapes and a little noise), for lossy comparisons."""
    y, x = np.mgrid[0 : shape[0], 0 : shape[1]].astype(np.float64)
    noise = rng(1).normal(0, 1.5, (*shape, 3))
    base = np.stack(
        [
            x / shape[1] * 200 + 20,
            y / shape[0] * 180 + 40,
            128 + 90 * np.sin(x / 9.0) * np.cos(y / 7.0),
        ],
        -1,
    )
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def composite_on_white(color: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Independent float reference for alpha compositing onto white."""
    c = color.astype(np.float64)
    a = alpha.astype(np.float64)[..., None] / 255.0
    return np.rint(c * a + 255.0 * (1.0 - a)).astype(np.uint8)


def gray3(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[:, :, None], 3, axis=2)


def decode_both(data: bytes, **kwargs: Any) -> np.ndarray:
    """Decode with both backends, check they agree exactly, return the result."""
    pillow = decode_image(data, backend="pillow", **kwargs)
    opencv = decode_image(data, backend="opencv", **kwargs)
    np.testing.assert_array_equal(pillow, opencv)
    return pillow


def check_output(image: np.ndarray, shape: tuple[int, ...]) -> None:
    assert image.shape == shape
    assert image.dtype == np.uint8
    assert image.flags.c_contiguous
    assert image.flags.writeable


# --- modes -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "WEBP"])
def test_rgb_lossless_round_trip(fmt: str) -> None:
    pixels = random_rgb()
    params = {"lossless": True} if fmt == "WEBP" else {}
    out = decode_both(encode(Image.fromarray(pixels), fmt, **params))
    check_output(out, (H, W, 3))
    np.testing.assert_array_equal(out, pixels)


def test_mode_1() -> None:
    bits = rng().random((H, W)) > 0.5
    image = Image.fromarray(bits)
    assert image.mode == "1"
    out = decode_both(encode(image, "PNG"))
    np.testing.assert_array_equal(out, gray3(bits.astype(np.uint8) * 255))


def test_mode_l() -> None:
    gray = rng().integers(0, 256, (H, W), dtype=np.uint8)
    data = encode(Image.fromarray(gray), "PNG")
    np.testing.assert_array_equal(decode_both(data), gray3(gray))
    np.testing.assert_array_equal(decode_both(data, channels=1), gray[:, :, None])


def test_mode_la_composites_on_white() -> None:
    gray = rng(1).integers(0, 256, (H, W), dtype=np.uint8)
    alpha = rng(2).integers(0, 256, (H, W), dtype=np.uint8)
    image = Image.fromarray(np.stack([gray, alpha], -1), mode="LA")
    expected = composite_on_white(gray[:, :, None], alpha)
    data = encode(image, "PNG")
    np.testing.assert_array_equal(decode_both(data, channels=1), expected)
    np.testing.assert_array_equal(decode_both(data), np.repeat(expected, 3, axis=2))


def palette_image(seed: int = 0) -> tuple[Image.Image, np.ndarray, np.ndarray]:
    palette = rng(seed).integers(0, 256, (256, 3), dtype=np.uint8)
    index = rng(seed + 1).integers(0, 256, (H, W), dtype=np.uint8)
    image = Image.fromarray(index).convert("L")
    image = Image.frombytes("P", (W, H), index.tobytes())
    image.putpalette(palette.tobytes())
    return image, palette, index


def test_mode_p() -> None:
    image, palette, index = palette_image()
    np.testing.assert_array_equal(decode_both(encode(image, "PNG")), palette[index])


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_mode_p_with_transparency_composites_on_white(fmt: str) -> None:
    image, palette, index = palette_image(3)
    transparent = int(index[0, 0])
    expected = palette[index].copy()
    expected[index == transparent] = ALPHA_BACKGROUND
    out = decode_both(encode(image, fmt, transparency=transparent))
    np.testing.assert_array_equal(out, expected)
    assert (out[0, 0] == 255).all()


def test_mode_rgba_composites_on_white() -> None:
    rgba = rng(4).integers(0, 256, (H, W, 4), dtype=np.uint8)
    rgba[0, 0] = (255, 0, 0, 0)  # fully transparent red -> white
    rgba[0, 1] = (0, 0, 255, 128)  # half blue
    rgba[0, 2] = (10, 20, 30, 255)  # opaque
    out = decode_both(encode(Image.fromarray(rgba), "PNG"))
    np.testing.assert_array_equal(out, composite_on_white(rgba[..., :3], rgba[..., 3]))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [127, 127, 255]
    assert out[0, 2].tolist() == [10, 20, 30]


def test_rgb_and_gray_trns_color_key() -> None:
    pixels = random_rgb(5)
    pixels[:2] = (10, 20, 30)
    out = decode_both(encode(Image.fromarray(pixels), "PNG", transparency=(10, 20, 30)))
    expected = pixels.copy()
    expected[(pixels == (10, 20, 30)).all(-1)] = 255
    np.testing.assert_array_equal(out, expected)

    gray = rng(6).integers(0, 256, (H, W), dtype=np.uint8)
    gray[0] = 7
    out = decode_both(encode(Image.fromarray(gray), "PNG", transparency=7), channels=1)
    np.testing.assert_array_equal(out[:, :, 0], np.where(gray == 7, 255, gray))


def test_mode_cmyk() -> None:
    cmyk = rng(7).integers(0, 256, (H, W, 4), dtype=np.uint8)
    image = Image.frombytes("CMYK", (W, H), cmyk.tobytes())
    out = decode_both(encode(image, "TIFF"))
    c = cmyk.astype(np.float64)
    expected = (255 - c[..., :3]) * (255 - c[..., 3:]) / 255  # Pillow's naive CMYK -> RGB
    assert np.abs(out - expected).max() <= 1.0


def test_cmyk_jpeg_backends_close() -> None:
    cmyk = np.zeros((16, 16, 4), dtype=np.uint8)
    cmyk[...] = (10, 200, 30, 40)
    data = encode(Image.frombytes("CMYK", (16, 16), cmyk.tobytes()), "JPEG", quality=100)
    pillow = decode_image(data).astype(int)
    opencv = decode_image(data, backend="opencv").astype(int)
    assert np.abs(pillow - opencv).max() <= 4
    assert np.abs(pillow[8, 8] - [207, 46, 190]).max() <= 4


SIXTEEN_BIT = np.array([0, 255, 256, 300, 32767, 32768, 65280, 65534, 65535], dtype=np.uint16)


def check_16bit_scaling(out: np.ndarray, values: np.ndarray) -> None:
    expected = values // 256  # the high byte
    np.testing.assert_array_equal(out, expected)
    assert np.abs(out - np.rint(values.astype(np.float64) * 255 / 65535)).max() <= 1
    assert 300 % 256 not in out  # no wrapping


def test_16bit_gray_png() -> None:
    values = np.tile(SIXTEEN_BIT, (4, 1))
    image = Image.fromarray(values)
    assert image.mode.startswith("I;16")
    out = decode_both(encode(image, "PNG"), channels=1)
    check_16bit_scaling(out[:, :, 0], values)
    rgb = decode_both(encode(image, "PNG"))
    assert rgb[0].tolist()[-1] == [255, 255, 255]
    assert rgb[0].tolist()[5] == [128, 128, 128]


def test_16bit_rgb_and_rgba_png() -> None:
    values = np.stack([SIXTEEN_BIT, SIXTEEN_BIT[::-1], np.full(9, 32768, np.uint16)], -1)
    rgb = np.tile(values[None], (3, 1, 1))
    ok, buffer = cv2.imencode(".png", rgb[:, :, ::-1])  # OpenCV writes 16-bit BGR
    assert ok
    out = decode_both(buffer.tobytes())
    check_16bit_scaling(out, rgb)

    rgba = np.concatenate([rgb, np.full((3, 9, 1), 65535, np.uint16)], -1)
    ok, buffer = cv2.imencode(".png", rgba[:, :, [2, 1, 0, 3]])
    assert ok
    check_16bit_scaling(decode_both(buffer.tobytes()), rgb)


def test_mode_i_reads_on_the_16bit_scale() -> None:
    values = np.array([[-5, 0, 255, 256, 32768, 65535, 70000, 2**31 - 1]], dtype=np.int32)
    image = Image.fromarray(values)
    assert image.mode == "I"
    out = decode_both(encode(image, "TIFF"), channels=1)
    assert out[0, :, 0].tolist() == [0, 0, 0, 1, 128, 255, 255, 255]


def test_mode_f_reads_zero_to_one() -> None:
    values = np.array([[0.0, 0.25, 0.5, 1.0, 2.0, -1.0, np.nan, np.inf]], dtype=np.float32)
    image = Image.fromarray(values)
    assert image.mode == "F"
    out = decode_both(encode(image, "TIFF"), channels=1)
    assert out[0, :, 0].tolist() == [0, 64, 128, 255, 255, 0, 0, 255]


def test_channels_1_is_601_luminance() -> None:
    pixels = random_rgb(8)
    out = decode_both(encode(Image.fromarray(pixels), "PNG"), channels=1)
    check_output(out, (H, W, 1))
    p = pixels.astype(np.float64)
    reference = 0.299 * p[..., 0] + 0.587 * p[..., 1] + 0.114 * p[..., 2]
    assert np.abs(out[:, :, 0] - reference).max() <= 1.0
    np.testing.assert_array_equal(out[:, :, 0], np.asarray(Image.fromarray(pixels).convert("L")))


def test_multipage_tiff_first_frame() -> None:
    frames = [Image.fromarray(random_rgb(seed)) for seed in (10, 11, 12)]
    data = encode(frames[0], "TIFF", save_all=True, append_images=frames[1:])
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 3
    np.testing.assert_array_equal(decode_both(data), np.asarray(frames[0]))


def test_animated_gif_first_frame() -> None:
    frames = [Image.new("RGB", (W, H), color) for color in [(255, 0, 0), (0, 255, 0)]]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 2
    out = decode_both(data)
    assert (out == (255, 0, 0)).all()


def test_decoded_by_content_not_by_name(tmp_path: Path) -> None:
    pixels = random_rgb(13)
    path = tmp_path / "really_a_png.jpg"
    path.write_bytes(encode(Image.fromarray(pixels), "PNG"))
    np.testing.assert_array_equal(decode_both(load_file(path), name=path.name), pixels)


# --- EXIF orientation -------------------------------------------------------------------


def with_orientation(pixels: np.ndarray, orientation: int, fmt: str, **params: Any) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(Image.fromarray(pixels), fmt, exif=exif, **params)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["PNG", "TIFF", "WEBP"])
def test_exif_orientation_lossless(orientation: int, fmt: str) -> None:
    pixels = random_rgb(14)
    params = {"lossless": True} if fmt == "WEBP" else {}
    data = with_orientation(pixels, orientation, fmt, **params)
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    out = decode_both(data)
    np.testing.assert_array_equal(out, expected)
    assert probe_size(data) == out.shape[:2]
    if orientation == 6:  # "rotate 90 degrees clockwise to display"
        np.testing.assert_array_equal(out, np.rot90(pixels, k=-1))
    if orientation == 8:
        np.testing.assert_array_equal(out, np.rot90(pixels, k=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_exif_orientation_6_jpeg(backend: Backend) -> None:
    pixels = smooth_rgb()
    data = with_orientation(pixels, 6, "JPEG", quality=95)
    out = decode_image(data, backend=backend)
    check_output(out, (96, 64, 3))
    assert probe_size(data) == (96, 64)
    diff = np.abs(out.astype(int) - np.rot90(pixels, k=-1))
    assert diff.mean() < 2.0
    # Against the other orientation it would be far off: the test can tell them apart.
    assert np.abs(out.astype(int) - np.rot90(pixels, k=1)).mean() > 20


def test_probe_size_without_orientation() -> None:
    data = encode(Image.fromarray(random_rgb()), "PNG")
    assert probe_size(data, name="x.png") == (H, W)
    assert probe_size(with_orientation(random_rgb(), 3, "JPEG")) == (H, W)


# --- decompression bombs ------------------------------------------------------------------


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))
        + kind
        + payload
        + struct.pack(">I", zlib.crc32(kind + payload))
    )


def png_header(width: int, height: int) -> bytes:
    """An 8-bit gray PNG that claims ``width x height`` pixels, cut after one row of data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    stream = zlib.compressobj()
    row = stream.compress(bytes(min(width, 64) + 1)) + stream.flush(zlib.Z_SYNC_FLUSH)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", row)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bomb_refused_from_header(backend: Backend) -> None:
    data = encode(Image.fromarray(random_rgb()), "PNG")
    assert decode_image(data, backend=backend, max_pixels=H * W).shape == (H, W, 3)
    with pytest.raises(DecodeError, match=r"^bomb\.png: image is 32x24 = 768 pixels, over"):
        decode_image(data, name="bomb.png", backend=backend, max_pixels=H * W - 1)


def test_pillow_bomb_warning_never_escapes() -> None:
    # 10,000 x 10,000 is over Pillow's warning threshold but under h5pack's default limit;
    # pytest turns warnings into errors, so a leaked DecompressionBombWarning would fail.
    pil_limit = Image.MAX_IMAGE_PIXELS
    assert pil_limit is not None
    assert pil_limit < 10_000 * 10_000 <= MAX_IMAGE_PIXELS
    filters_before = list(warnings.filters)
    big = png_header(10_000, 10_000)
    assert probe_size(big) == (10_000, 10_000)
    with pytest.raises(DecodeError, match="over the limit of 1000000"):
        decode_image(big, name="big.png", max_pixels=1_000_000)
    # Under h5pack's limit: decoding starts (Pillow re-checks while loading) and fails on
    # the missing data, with no warning either.
    with pytest.raises(DecodeError, match=r"^big\.png: cannot decode PNG image"):
        decode_image(big, name="big.png")
    assert warnings.filters == filters_before
    assert pil_limit == Image.MAX_IMAGE_PIXELS


@pytest.mark.parametrize("backend", BACKENDS)
def test_bomb_over_pillow_hard_limit(backend: Backend) -> None:
    huge = png_header(20_000, 20_000)
    with pytest.raises(DecodeError, match=r"^huge\.png: too large"):
        decode_image(huge, name="huge.png", backend=backend)
    with pytest.raises(DecodeError, match=r"^huge\.png: too large"):
        probe_size(huge, name="huge.png")


# --- corrupt and hostile bytes --------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_jpeg_junk_after_eoi_is_tolerated(backend: Backend) -> None:
    data = encode(Image.fromarray(smooth_rgb()), "JPEG", quality=90)
    clean = decode_image(data, backend=backend)
    np.testing.assert_array_equal(decode_image(data + b"garbage", backend=backend), clean)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "make",
    [
        lambda: encode(Image.fromarray(smooth_rgb()), "JPEG")[:-400],
        lambda: encode(Image.fromarray(smooth_rgb()), "JPEG", progressive=True)[:-400],
        lambda: encode(Image.fromarray(random_rgb()), "PNG")[:-60],
        lambda: encode(Image.fromarray(random_rgb()), "TIFF")[:-200],
        lambda: encode(Image.fromarray(random_rgb()), "WEBP")[:-100],
    ],
    ids=["jpeg", "progressive-jpeg", "png", "tiff", "webp"],
)
def test_truncated_is_refused(backend: Backend, make: Callable[[], bytes]) -> None:
    with pytest.raises(DecodeError, match=r"^cut\.img: "):
        decode_image(make(), name="cut.img", backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty file"),
        (rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes(), "not a recognised image"),
        (b"Dear diary,\nthis is not a JPEG.\n", "not a recognised image"),
        (b"\xff\xd8\xff\xe0" + bytes(20), ""),  # a JPEG header and nothing after it
        (png_header(4, 4), ""),  # header only, no pixel data
    ],
    ids=["empty", "random", "text", "jpeg-soi-only", "png-header-only"],
)
def test_junk_is_refused_naming_the_file(backend: Backend, data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=rf"^cat/notes\.jpg: .*{message}"):
        decode_image(data, name="cat/notes.jpg", backend=backend)


def test_invalid_arguments() -> None:
    data = encode(Image.fromarray(random_rgb()), "PNG")
    with pytest.raises(ValueError, match="backend should be one of"):
        decode_image(data, backend="magick")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="channels should be one of"):
        decode_image(data, channels=4)
    with pytest.raises(ValueError, match="max_pixels should be positive"):
        decode_image(data, max_pixels=0)


# --- backends agree ------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("subsampling", [0, 2])
def test_backends_agree_on_jpeg(channels: int, subsampling: int) -> None:
    data = encode(Image.fromarray(smooth_rgb()), "JPEG", quality=90, subsampling=subsampling)
    pillow = decode_image(data, channels=channels).astype(int)
    opencv = decode_image(data, backend="opencv", channels=channels).astype(int)
    assert pillow.shape == opencv.shape == (64, 96, channels)
    assert np.abs(pillow - opencv).mean() < 1.0
    assert np.abs(pillow - opencv).max() <= 12


def test_gray_jpeg_backends_agree() -> None:
    gray = smooth_rgb()[:, :, 0]
    data = encode(Image.fromarray(gray), "JPEG", quality=90)
    pillow = decode_image(data, channels=1).astype(int)
    opencv = decode_image(data, backend="opencv", channels=1).astype(int)
    assert np.abs(pillow - opencv).max() <= 2
    assert np.abs(pillow[:, :, 0] - gray).mean() < 3


def test_thread_safe_and_no_global_state_change() -> None:
    blobs = [encode(Image.fromarray(random_rgb(seed)), "PNG") for seed in range(12)]
    blobs.append(png_header(10_000, 10_000))  # goes through the warning guard
    filters_before = list(warnings.filters)
    pil_limit = Image.MAX_IMAGE_PIXELS

    def work(data: bytes) -> np.ndarray | str:
        try:
            return decode_image(data, max_pixels=1_000_000)
        except DecodeError as err:
            return str(err)

    serial = [work(b) for b in blobs * 3]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(work, blobs * 3))
    for a, b in zip(serial, parallel, strict=True):
        if isinstance(a, str):
            assert a == b
        else:
            np.testing.assert_array_equal(a, b)
    assert warnings.filters == filters_before
    assert pil_limit == Image.MAX_IMAGE_PIXELS


# --- resize --------------------------------------------------------------------------------


def bands() -> np.ndarray:
    """40 x 80: red | green (centred square) | blue."""
    image = np.zeros((40, 80, 3), dtype=np.uint8)
    image[:, :20] = (255, 0, 0)
    image[:, 20:60] = (0, 255, 0)
    image[:, 60:] = (0, 0, 255)
    return image


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [(10, 10), (40, 80), (17, 33), (100, 30), (1, 1)])
def test_stretch_shape_and_constant(backend: Backend, size: tuple[int, int]) -> None:
    image = np.full((40, 80, 3), (10, 200, 77), dtype=np.uint8)
    out = resize_image(image, size, backend=backend)
    check_output(out, (*size, 3))
    assert (out == (10, 200, 77)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_crop_keeps_the_centred_square(backend: Backend) -> None:
    out = resize_image(bands(), (40, 40), method="crop", backend=backend)
    check_output(out, (40, 40, 3))
    assert (out == (0, 255, 0)).all()  # no scaling: exactly the centre
    small = resize_image(bands(), (20, 20), method="crop", backend=backend)
    check_output(small, (20, 20, 3))
    assert (small[:, 2:-2] == (0, 255, 0)).all()  # edges may blend with the bands
    assert small[:, :, 1].mean() > 230
    tall = resize_image(bands(), (30, 10), method="crop", backend=backend)
    check_output(tall, (30, 10, 3))
    assert (tall == (0, 255, 0)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_pad_borders_equal_pad_value(backend: Backend) -> None:
    image = np.full((20, 40, 3), 200, dtype=np.uint8)
    out = resize_image(image, (40, 40), method="pad", backend=backend)
    check_output(out, (40, 40, 3))
    assert (out[:10] == PAD_VALUE).all()
    assert (out[30:] == PAD_VALUE).all()
    assert (out[10:30] == 200).all()
    half = resize_image(image, (20, 20), method="pad", backend=backend)
    assert (half[:5] == PAD_VALUE).all()
    assert (half[15:] == PAD_VALUE).all()
    assert (half[5:15] == 200).all()
    side = resize_image(image, (10, 30), method="pad", backend=backend)
    check_output(side, (10, 30, 3))
    assert (side[:, :5] == PAD_VALUE).all()
    assert (side[:, 25:] == PAD_VALUE).all()
    assert (side[:, 5:25] == 200).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["stretch", "crop", "pad"])
def test_one_channel_resize(backend: Backend, method: Any) -> None:
    gray = rng().integers(0, 256, (13, 29, 1), dtype=np.uint8)
    check_output(resize_image(gray, (7, 11), method=method, backend=backend), (7, 11, 1))


def test_resize_backends_close_and_antialiased() -> None:
    image = smooth_rgb((128, 192))
    pillow = resize_image(image, (32, 48)).astype(int)
    opencv = resize_image(image, (32, 48), backend="opencv").astype(int)
    assert np.abs(pillow - opencv).mean() < 3
    # Antialiased: a fine checkerboard shrinks to its mean grey, not to aliasing stripes.
    checker = ((np.indices((64, 64)).sum(0) % 2) * 255).astype(np.uint8)
    checker3 = np.repeat(checker[:, :, None], 3, axis=2)
    for backend in BACKENDS:
        out = resize_image(checker3, (16, 16), backend=backend)
        assert np.abs(out.astype(int) - 128).max() <= 2


def test_resize_invalid_arguments() -> None:
    image = random_rgb()
    with pytest.raises(ValueError, match="method should be one of"):
        resize_image(image, (4, 4), method="squash")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size should be a positive"):
        resize_image(image, (0, 4))
    with pytest.raises(ValueError, match="image should be a uint8 array"):
        resize_image(image.astype(np.float32), (4, 4))
    with pytest.raises(ValueError, match="image should be a uint8 array"):
        resize_image(image[:, :, 0], (4, 4))


# --- re-encoding and files -------------------------------------------------------------------


def test_reencode_jpeg_round_trip_and_max_side() -> None:
    image = smooth_rgb()
    data = reencode_jpeg(image, quality=95)
    assert data[:3] == b"\xff\xd8\xff"
    assert np.abs(decode_image(data).astype(int) - image).mean() < 2
    small = decode_image(reencode_jpeg(image, max_side=48))
    assert small.shape == (32, 48, 3)
    assert np.abs(small.astype(int) - resize_image(image, (32, 48))).mean() < 3
    same = decode_image(reencode_jpeg(image, max_side=500))
    assert same.shape == image.shape
    lower = reencode_jpeg(image, quality=20)
    assert len(lower) < len(data)


def test_reencode_gray_and_invalid() -> None:
    gray = smooth_rgb()[:, :, :1].copy()
    out = decode_image(reencode_jpeg(gray), channels=1)
    assert out.shape == gray.shape
    assert Image.open(io.BytesIO(reencode_jpeg(gray))).mode == "L"
    with pytest.raises(ValueError, match="quality should be in"):
        reencode_jpeg(gray, quality=0)
    with pytest.raises(ValueError, match="max_side should be positive"):
        reencode_jpeg(gray, max_side=0)


def test_load_file(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"\x00\x01payload")
    assert load_file(path) == b"\x00\x01payload"
    assert load_file(str(path)) == b"\x00\x01payload"
    with pytest.raises(DecodeError, match="cannot read") as info:
        load_file(tmp_path / "missing.jpg")
    assert str(tmp_path / "missing.jpg") in str(info.value)
    with pytest.raises(DecodeError, match="not a regular file"):
        load_file(tmp_path)


def test_load_file_refuses_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(DecodeError, match=r"pipe\.jpg: not a regular file"):
        load_file(fifo)
