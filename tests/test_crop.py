"""Tests for h5pack.read.crop: boxes, determinism, pixels against Pillow, EXIF, modes, errors."""

from __future__ import annotations

import dataclasses
import io
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from h5pack.core.decode import Backend, decode_image
from h5pack.core.pixels import apply_orientation
from h5pack.core.resize import resize_image
from h5pack.errors import DecodeError, OptionsError
from h5pack.read import boxes, cropplan
from h5pack.read.boxes import stored_box
from h5pack.read.crop import (
    CROPS,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    Box,
    CropSpec,
    center_box,
    crop_array,
    crop_into,
    crop_uniforms,
    decode_crop,
    decode_crop_into,
    decode_pixels,
    flip_in_place,
    opencv_resize_into,
    pillow_resize_into,
    plan_crop,
    plan_crops,
    random_resized_box,
    reference_resize,
    scale_box,
)
from h5pack.read.cropplan import plan_ahead
from h5pack.synthetic import synthesize_photo
from tests.helpers import shared_photos

BACKENDS: list[Backend] = ["pillow", "opencv"]
# The project's real photographs, beside the checkout (see its README); optional.
SHARED_PHOTOS = shared_photos()
SHAPES = [(500, 375), (375, 500), (100, 1000), (1000, 100), (10, 10)]
OUT = (160, 224)  # not square, so swapped sides under EXIF rotations cannot go unnoticed

# Tolerances of the drafted JPEG path against a full decode + crop + resize, on
# photo-like JPEGs (mean absolute difference in grey levels, and PSNR in dB). Measured over
# every comparison in this file (synthetic photos and the real ones): mean <= 0.94 and
# PSNR >= 44.4 dB; boxes mapped wrongly through an EXIF rotation gave means of 1.6 to 70
# and 8 to 38 dB.
MAX_MEAN_DIFF = 1.5
MIN_PSNR_DB = 40.0


# --- helpers -----------------------------------------------------------------------------


def photo(seed: int = 0, shape: tuple[int, int] = (600, 800)) -> np.ndarray:
    return synthesize_photo(np.random.default_rng(seed), shape)


def encode(image: Image.Image, fmt: str = "JPEG", **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def jpeg(pixels: np.ndarray, *, orientation: int = 1, mode: str = "RGB") -> bytes:
    """Encode ``pixels`` (as stored) as a quality-90 JPEG with an EXIF orientation."""
    image = Image.fromarray(pixels).convert(mode)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    return encode(image, "JPEG", quality=90, exif=exif.tobytes())


def pillow_reference(data: bytes, box: Box, size: tuple[int, int], flip: bool) -> np.ndarray:
    """Full decode with Pillow, EXIF transpose, crop the box, resize BILINEAR, flip."""
    with Image.open(io.BytesIO(data)) as opened:
        image = ImageOps.exif_transpose(opened)
    if image.mode in ("RGBA", "LA", "P"):
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image.convert("RGBA"))
    image = image.convert("RGB")
    top, left, height, width = box
    resized = image.crop((left, top, left + width, top + height)).resize(
        (size[1], size[0]), Image.Resampling.BILINEAR
    )
    out = np.asarray(resized)
    return np.ascontiguousarray(out[:, ::-1]) if flip else out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    diff = np.abs(actual.astype(np.int16) - expected.astype(np.int16))
    assert diff.mean() < MAX_MEAN_DIFF, f"mean abs diff {diff.mean():.2f}"
    assert psnr(actual, expected) > MIN_PSNR_DB, f"PSNR {psnr(actual, expected):.1f} dB"


def check_output(image: np.ndarray, shape: tuple[int, ...]) -> None:
    assert image.shape == shape
    assert image.dtype == np.uint8
    assert image.flags.c_contiguous
    assert image.flags.writeable


def flipping_index(spec: CropSpec, height: int, width: int) -> int:
    """Return the first sample index whose plan flips."""
    return next(
        i for i in range(100) if plan_crop(spec, height, width, seed=0, epoch=0, index=i)[1]
    )


# --- CropSpec ----------------------------------------------------------------------------


def test_spec_of_int_is_square() -> None:
    spec = CropSpec.of(224, crop="center")
    assert spec.size == (224, 224)
    assert spec.scale == DEFAULT_SCALE
    assert spec.ratio == DEFAULT_RATIO
    assert (spec.flip, spec.backend) == (False, "pillow")
    assert CropSpec.of((100, 200), crop="resize").size == (100, 200)


def test_spec_normalises_sequences() -> None:
    spec = CropSpec(size=[3, 4], crop="center", scale=[0.5, 1], ratio=(1, 2))  # type: ignore[arg-type]
    assert spec.size == (3, 4)
    assert spec.scale == (0.5, 1.0)
    assert spec.ratio == (1.0, 2.0)
    hash(spec)


def test_spec_is_frozen_and_keyword_only() -> None:
    spec = CropSpec.of(8, crop="center")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.flip = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        CropSpec((8, 8), "center")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"size": (0, 4)}, "size should be positive, but got size=(0, 4)"),
        ({"size": 224}, "size should be a (height, width) pair of ints"),
        ({"size": (1, 2, 3)}, "size should be a (height, width) pair"),
        ({"size": (1.5, 2)}, "size should be a (height, width) pair"),
        ({"crop": "random"}, "crop should be one of"),
        ({"scale": (0.0, 1.0)}, "scale should satisfy 0 < low <= high <= 1.0"),
        ({"scale": (0.5, 0.2)}, "but got scale=(0.5, 0.2)"),
        ({"scale": (0.5, 1.5)}, "scale should satisfy"),
        ({"scale": 0.5}, "scale should be a (low, high) pair, but got scale=0.5"),
        ({"ratio": (0.0, 1.0)}, "ratio should satisfy 0 < low <= high, but got"),
        ({"ratio": (2.0, 1.0)}, "ratio should satisfy"),
        ({"ratio": (1.0, math.inf)}, "ratio should satisfy"),
        ({"ratio": (math.nan, 1.0)}, "ratio should satisfy"),
        ({"flip": 1}, "flip should be a bool, but got flip=1"),
        ({"backend": "cv2"}, "backend should be one of ('pillow', 'opencv'), but got"),
        ({"reducing_gap": 0.5}, "reducing_gap should be None or a number >= 1"),
        ({"reducing_gap": math.inf}, "reducing_gap should be None or a number >= 1"),
        ({"reducing_gap": True}, "reducing_gap should be None or a number >= 1"),
    ],
)
def test_spec_rejects(changes: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"size": (8, 8), "crop": "center", **changes}
    with pytest.raises(OptionsError) as info:
        CropSpec(**fields)
    assert message in str(info.value)


def test_crops_lists_the_literal() -> None:
    assert CROPS == ("random-resized", "center", "resize")


# --- random_resized_box ------------------------------------------------------------------


def fallback_box(height: int, width: int, ratio: tuple[float, float]) -> Box:
    """torchvision's central fallback, spelled out independently."""
    if width / height < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif width / height > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)


@pytest.mark.parametrize(("height", "width"), SHAPES)
def test_random_boxes_inside_and_in_range(height: int, width: int) -> None:
    rng = np.random.default_rng(0)
    scale, ratio = DEFAULT_SCALE, DEFAULT_RATIO
    fallback = fallback_box(height, width, ratio)
    drawn = 0
    for _ in range(2000):
        box = random_resized_box(height, width, scale, ratio, rng)
        top, left, h, w = box
        assert top >= 0
        assert left >= 0
        assert 1 <= h <= height - top
        assert 1 <= w <= width - left
        if box == fallback:
            continue
        drawn += 1
        # The sides are rounded: allow half a pixel on each.
        area = height * width
        assert (w + 0.5) * (h + 0.5) >= scale[0] * area
        assert (w - 0.5) * (h - 0.5) <= scale[1] * area
        assert (w + 0.5) / (h - 0.5) >= ratio[0]
        assert (w - 0.5) / (h + 0.5) <= ratio[1]
    assert drawn > 0


@pytest.mark.parametrize(
    ("height", "width", "expected"),
    [(1000, 100, Box(433, 0, 133, 100)), (100, 1000, Box(0, 433, 100, 133))],
)
def test_random_box_falls_back_to_the_central_box(height: int, width: int, expected: Box) -> None:
    assert fallback_box(height, width, DEFAULT_RATIO) == expected
    rng = np.random.default_rng(1)
    boxes = [
        random_resized_box(height, width, DEFAULT_SCALE, DEFAULT_RATIO, rng) for _ in range(500)
    ]
    share = sum(box == expected for box in boxes) / len(boxes)
    assert 0.3 < share < 1.0  # the fallback happens often, but not always
    # With the whole area asked for, no attempt fits: always the fallback.
    assert all(
        random_resized_box(height, width, (1.0, 1.0), DEFAULT_RATIO, rng) == expected
        for _ in range(20)
    )


def test_random_box_fallback_inside_ratio_is_whole_image() -> None:
    rng = np.random.default_rng(0)
    assert random_resized_box(30, 40, (1.0, 1.0), (0.5, 2.0), rng) == Box(0, 0, 30, 40)


def test_random_box_fallback_never_empty() -> None:
    # torchvision would give a 0-row box here (round(1 / 5) = 0).
    rng = np.random.default_rng(0)
    assert random_resized_box(100, 1, (1.0, 1.0), (5.0, 10.0), rng) == Box(49, 0, 1, 1)


def test_random_box_mean_area_on_a_square() -> None:
    # Expected area fraction of the first accepted draw on a square image: an attempt with
    # aspect a (log-uniform) is kept iff s <= m(a) = min(a, 1 / a), with s ~ U(scale).
    low = DEFAULT_SCALE[0]
    u = np.linspace(math.log(DEFAULT_RATIO[0]), math.log(DEFAULT_RATIO[1]), 100_001)
    m = np.exp(-np.abs(u))
    expected = float(np.mean((m**2 - low**2) / 2) / np.mean(m - low))
    assert 0.47 < expected < 0.49
    rng = np.random.default_rng(2)
    boxes = [random_resized_box(1000, 1000, DEFAULT_SCALE, DEFAULT_RATIO, rng) for _ in range(4000)]
    fractions = np.array([b.height * b.width / 1e6 for b in boxes])
    assert abs(fractions.mean() - expected) < 0.02  # 5 standard errors
    assert fractions.min() >= low * 0.99


def test_random_box_rejects_bad_arguments() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(OptionsError, match="the image should be at least 1x1"):
        random_resized_box(0, 10, DEFAULT_SCALE, DEFAULT_RATIO, rng)
    with pytest.raises(OptionsError, match="scale should satisfy"):
        random_resized_box(10, 10, (0.5, 0.1), DEFAULT_RATIO, rng)


# --- center_box and "resize" -------------------------------------------------------------


@pytest.mark.parametrize(("height", "width"), [*SHAPES, (1, 1), (3, 1000)])
@pytest.mark.parametrize(("out_h", "out_w"), [(224, 224), OUT, (300, 100)])
def test_center_box_is_the_largest_centred_box(
    height: int, width: int, out_h: int, out_w: int
) -> None:
    top, left, h, w = center_box(height, width, out_h, out_w)
    assert h == height or w == width  # largest: it touches two opposite sides
    assert 1 <= h <= height
    assert 1 <= w <= width
    assert (top, left) == ((height - h) // 2, (width - w) // 2)
    # The output's aspect ratio, up to the rounding of one side.
    if h == height:
        assert abs(w - height * out_w / out_h) <= 0.5 or w in (1, width)
    else:
        assert abs(h - width * out_h / out_w) <= 0.5 or h in (1, height)


def test_center_box_examples() -> None:
    assert center_box(500, 375, 224, 224) == Box(62, 0, 375, 375)
    assert center_box(375, 500, 224, 224) == Box(0, 62, 375, 375)
    assert center_box(300, 300, 100, 200) == Box(75, 0, 150, 300)
    assert center_box(300, 300, 200, 100) == Box(0, 75, 300, 150)


def test_center_matches_resize_crop() -> None:
    # The region that resize_image(method="crop") keeps (which resizes first, then cuts).
    pixels = photo(3, (300, 400))
    spec = CropSpec.of(OUT, crop="center")
    box, _ = plan_crop(spec, 300, 400, seed=0, epoch=0, index=0)
    ours = crop_array(pixels, box, OUT)
    reference = resize_image(pixels, OUT, method="crop")
    assert np.abs(ours.astype(np.int16) - reference).mean() < 2.0


def test_resize_plans_the_whole_image() -> None:
    spec = CropSpec.of(OUT, crop="resize")
    assert plan_crop(spec, 37, 91, seed=5, epoch=2, index=7) == (Box(0, 0, 37, 91), False)


# --- determinism -------------------------------------------------------------------------


def test_plan_is_a_pure_function_of_seed_epoch_index() -> None:
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    plans = {
        (seed, epoch, index): plan_crop(spec, 1000, 1000, seed=seed, epoch=epoch, index=index)
        for seed in (0, 1)
        for epoch in (0, 1, 2)
        for index in range(20)
    }
    for (seed, epoch, index), plan in plans.items():
        assert plan_crop(spec, 1000, 1000, seed=seed, epoch=epoch, index=index) == plan
    assert len({box for box, _ in plans.values()}) == len(plans)  # all different


def test_plan_stream_is_fixed() -> None:
    # The stream is part of the contract: a resumed run (or a new h5pack version) must cut
    # the same boxes. Change these values only on purpose (and say so in CHANGELOG.md).
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    assert plan_crop(spec, 500, 375, seed=0, epoch=0, index=0) == (Box(280, 65, 137, 171), False)
    assert plan_crop(spec, 500, 375, seed=7, epoch=3, index=11) == (Box(98, 47, 316, 306), True)


def test_uniforms_seed_modulo_and_validation() -> None:
    a = crop_uniforms(-1, 0, [0, 5])
    np.testing.assert_array_equal(a, crop_uniforms(2**64 - 1, 0, [0, 5]))
    assert a.shape == (2, 23)
    assert ((a >= 0) & (a < 1)).all()
    with pytest.raises(OptionsError, match="epoch and index should be non-negative"):
        crop_uniforms(0, -1, [0])
    with pytest.raises(OptionsError, match="index=-2"):
        crop_uniforms(0, 0, [3, -2])


def test_uniforms_are_uniform_and_independent() -> None:
    draws = crop_uniforms(3, 1, np.arange(20_000))
    assert abs(draws.mean() - 0.5) < 0.005
    assert abs(draws.var() - 1 / 12) < 0.002
    counts = np.histogram(draws[:, 0], bins=10, range=(0, 1))[0]
    assert 1800 < counts.min() <= counts.max() < 2200
    correlations = np.corrcoef(draws.T)[np.triu_indices(draws.shape[1], 1)]
    assert np.abs(correlations).max() < 0.04  # between draws of a sample
    neighbours = np.corrcoef(draws[:-1, 0], draws[1:, 0])[0, 1]
    assert abs(neighbours) < 0.04  # between samples
    assert not np.array_equal(crop_uniforms(3, 2, [0]), crop_uniforms(3, 1, [0]))
    assert not np.array_equal(crop_uniforms(4, 1, [0]), crop_uniforms(3, 1, [0]))


@pytest.mark.parametrize("crop", ["random-resized", "center", "resize"])
@pytest.mark.parametrize("flip", [True, False])
def test_a_sample_s_plan_does_not_depend_on_its_batch(crop, flip) -> None:
    rng = np.random.default_rng(7)
    spec = CropSpec.of((224, 160), crop=crop, flip=flip)
    for trial in range(6):
        heights, widths = rng.integers(1, 700, 64), rng.integers(1, 700, 64)
        if trial % 2:  # elongated: attempts fail, the central fallback
            heights, widths = rng.integers(1, 20, 64), rng.integers(200, 4000, 64)
        indices = rng.integers(0, 2**40, 64)
        seed, epoch = int(rng.integers(-(2**63), 2**63)), int(rng.integers(0, 1000))
        got = plan_crops(spec, heights, widths, seed=seed, epoch=epoch, indices=indices)
        half = plan_crops(
            spec, heights[32:], widths[32:], seed=seed, epoch=epoch, indices=indices[32:]
        )
        assert got[32:] == half
        one = [
            plan_crop(spec, int(h), int(w), seed=seed, epoch=epoch, index=int(i))
            for h, w, i in zip(heights, widths, indices, strict=True)
        ]
        assert got == one
        assert all(type(f) is bool for _, f in got)
        plan_ahead(spec, np.stack([heights, widths], 1), seed=seed, epoch=epoch, indices=indices)
        assert one == [
            plan_crop(spec, int(h), int(w), seed=seed, epoch=epoch, index=int(i))
            for h, w, i in zip(heights, widths, indices, strict=True)
        ]


def test_plan_crops_empty_and_refused() -> None:
    spec = CropSpec.of(8, crop="random-resized", flip=True)
    assert plan_crops(spec, [], [], seed=0, epoch=0, indices=[]) == []
    with pytest.raises(OptionsError, match="at least 1x1"):
        plan_crops(spec, [0], [4], seed=0, epoch=0, indices=[0])
    with pytest.raises(OptionsError, match="non-negative"):
        plan_crops(spec, [4], [4], seed=0, epoch=-1, indices=[0])
    with pytest.raises(OptionsError, match="one entry per sample"):
        plan_crops(spec, [4, 4], [4], seed=0, epoch=0, indices=[0])
    with pytest.raises(OptionsError, match="non-negative"):
        plan_crops(CropSpec.of(8, crop="center"), [4], [4], seed=0, epoch=0, indices=[-1])


def test_flip_rate_is_one_half() -> None:
    spec = CropSpec.of(224, crop="center", flip=True)
    flips = [plan_crop(spec, 50, 50, seed=0, epoch=0, index=i)[1] for i in range(2000)]
    assert 0.45 < np.mean(flips) < 0.55
    no_flip = CropSpec.of(224, crop="center")
    assert not any(plan_crop(no_flip, 50, 50, seed=0, epoch=0, index=i)[1] for i in range(200))


def test_flip_does_not_change_the_box() -> None:
    flipping = CropSpec.of(224, crop="random-resized", flip=True)
    plain = CropSpec.of(224, crop="random-resized")
    for index in range(20):
        a = plan_crop(flipping, 300, 400, seed=0, epoch=0, index=index)[0]
        assert a == plan_crop(plain, 300, 400, seed=0, epoch=0, index=index)[0]


# --- crop_array --------------------------------------------------------------------------


@pytest.mark.parametrize("box", [Box(10, 20, 200, 150), Box(0, 0, 300, 400), Box(5, 7, 40, 30)])
@pytest.mark.parametrize("channels", [1, 3])
def test_crop_array_pillow_is_pillow_crop_resize(box: Box, channels: int) -> None:
    pixels = photo(1, (300, 400))
    if channels == 1:
        pixels = pixels[:, :, :1].copy()
    out = crop_array(pixels, box, OUT)
    check_output(out, (*OUT, channels))
    source = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
    top, left, h, w = box
    expected = source.crop((left, top, left + w, top + h)).resize(
        (OUT[1], OUT[0]), Image.Resampling.BILINEAR
    )
    np.testing.assert_array_equal(out, np.asarray(expected).reshape(*OUT, channels))


@pytest.mark.parametrize("box", [Box(10, 20, 200, 250), Box(5, 7, 40, 30)])
def test_crop_array_opencv_is_cv2_resize(box: Box) -> None:
    pixels = photo(1, (300, 400))
    out = crop_array(pixels, box, OUT, backend="opencv")
    check_output(out, (*OUT, 3))
    top, left, h, w = box
    shrinking = h >= OUT[0] and w >= OUT[1]
    expected = cv2.resize(
        np.ascontiguousarray(pixels[top : top + h, left : left + w]),
        (OUT[1], OUT[0]),
        interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR,
    )
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_crop_array_flip_flips(backend: Backend) -> None:
    pixels = photo(2, (120, 90))
    box = Box(3, 4, 100, 80)
    plain = crop_array(pixels, box, OUT, backend=backend)
    flipped = crop_array(pixels, box, OUT, flip=True, backend=backend)
    check_output(flipped, (*OUT, 3))
    np.testing.assert_array_equal(flipped, np.fliplr(plain))
    assert not np.array_equal(flipped, plain)


def test_crop_array_returns_a_new_array() -> None:
    pixels = photo(2, (OUT[0], OUT[1]))
    out = crop_array(pixels, Box(0, 0, *OUT), OUT)
    np.testing.assert_array_equal(out, pixels)
    assert not np.shares_memory(out, pixels)


@pytest.mark.parametrize(
    "box", [Box(-1, 0, 10, 10), Box(0, 0, 0, 10), Box(0, 0, 31, 10), Box(25, 35, 6, 6)]
)
def test_crop_array_rejects_boxes_outside(box: Box) -> None:
    with pytest.raises(OptionsError, match=r"inside the 40x30 \(WxH\) image, but got"):
        crop_array(np.zeros((30, 40, 3), np.uint8), box, (8, 8))


def test_crop_array_rejects_bad_arrays_and_sizes() -> None:
    with pytest.raises(OptionsError, match="hwc should be a uint8 array of shape"):
        crop_array(np.zeros((30, 40), np.uint8), Box(0, 0, 8, 8), (8, 8))
    with pytest.raises(OptionsError, match="dtype=float32"):
        crop_array(np.zeros((30, 40, 3), np.float32), Box(0, 0, 8, 8), (8, 8))
    with pytest.raises(OptionsError, match="size should be positive"):
        crop_array(np.zeros((30, 40, 3), np.uint8), Box(0, 0, 8, 8), (0, 8))
    with pytest.raises(OptionsError, match="backend should be one of"):
        crop_array(np.zeros((30, 40, 3), np.uint8), Box(0, 0, 8, 8), (8, 8), backend="x")  # type: ignore[arg-type]


# --- kernels into a buffer ----------------------------------------------------------------


def test_the_box_names_are_re_exported_from_boxes() -> None:
    assert CropSpec is boxes.CropSpec
    assert plan_crop is cropplan.plan_crop
    assert scale_box is boxes.scale_box


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flip", [False, True])
def test_crop_into_writes_one_slot_of_a_batch(backend: Backend, flip: bool) -> None:
    pixels = photo(3, (300, 400))
    pixels.flags.writeable = False  # a cached image is read-only
    batch = np.zeros((3, *OUT, 3), dtype=np.uint8)
    box = Box(10, 20, 200, 250)
    crop_into(pixels, box, batch[1], flip=flip, resize=reference_resize(backend))
    np.testing.assert_array_equal(
        batch[1], crop_array(pixels, box, OUT, flip=flip, backend=backend)
    )
    assert not batch[0].any()
    assert not batch[2].any()


def test_crop_into_refuses_other_channels_and_boxes_outside() -> None:
    out = np.zeros((8, 8, 3), dtype=np.uint8)
    with pytest.raises(OptionsError, match="same channels"):
        crop_into(
            np.zeros((20, 20, 1), np.uint8),
            Box(0, 0, 9, 9),
            out,
            flip=False,
            resize=pillow_resize_into,
        )
    with pytest.raises(OptionsError, match="box should lie inside"):
        crop_into(
            np.zeros((20, 20, 3), np.uint8),
            Box(15, 0, 9, 9),
            out,
            flip=False,
            resize=pillow_resize_into,
        )


@pytest.mark.parametrize("shape", [(60, 80, 3), (60, 80, 1), (7, 5, 3)])
def test_flip_in_place(shape: tuple[int, int, int]) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    flipped = pixels.copy()
    flip_in_place(flipped)
    np.testing.assert_array_equal(flipped, pixels[:, ::-1])


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("box", [Box(10, 20, 200, 250), Box(5, 7, 40, 30)])
def test_opencv_kernel_reads_the_strided_box_and_writes_in_place(box: Box, channels: int) -> None:
    pixels = photo(1, (300, 400))[:, :, :channels].copy()
    top, left, h, w = box
    view = pixels[top : top + h, left : left + w]
    out = np.empty((*OUT, channels), dtype=np.uint8)
    address = out.ctypes.data
    opencv_resize_into(view, out)
    assert out.ctypes.data == address
    shrinking = h >= OUT[0] and w >= OUT[1]
    expected = cv2.resize(
        np.ascontiguousarray(view),
        (OUT[1], OUT[0]),
        interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR,
    )
    np.testing.assert_array_equal(out, expected.reshape(out.shape))


def test_reference_resize_refuses_an_unknown_backend() -> None:
    with pytest.raises(OptionsError, match="backend should be one of"):
        reference_resize("x")  # type: ignore[arg-type]


def test_scale_box_rounds_each_edge_within_half_a_pixel() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        height, width = (int(v) for v in rng.integers(1, 3000, 2))
        to = (max(1, int(height / rng.uniform(1, 8))), max(1, int(width / rng.uniform(1, 8))))
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        box = Box(
            top,
            left,
            int(rng.integers(1, height - top + 1)),
            int(rng.integers(1, width - left + 1)),
        )
        got = scale_box(box, (height, width), to)
        assert got.top >= 0
        assert got.left >= 0
        assert got.height >= 1
        assert got.width >= 1
        assert got.top + got.height <= to[0]
        assert got.left + got.width <= to[1]
        sy, sx = to[0] / height, to[1] / width
        thin_y, thin_x = box.height * sy < 1, box.width * sx < 1
        for edge, want, thin in (
            (got.top, box.top * sy, thin_y),
            (got.left, box.left * sx, thin_x),
            (got.top + got.height, (box.top + box.height) * sy, thin_y),
            (got.left + got.width, (box.left + box.width) * sx, thin_x),
        ):  # half a pixel; one more when the box is thinner than a pixel (it keeps one)
            assert abs(edge - want) <= (1.5 if thin else 0.5 + 1e-9)
    assert scale_box(Box(1, 2, 3, 4), (10, 10), (10, 10)) == Box(1, 2, 3, 4)


# --- decode_crop -------------------------------------------------------------------------


def full_path(data: bytes, spec: CropSpec, index: int, **kwargs: Any) -> np.ndarray:
    """decode_image + plan_crop + crop_array: what decode_crop must (nearly) give."""
    pixels = decode_image(data, backend=spec.backend, **kwargs)
    box, flip = plan_crop(spec, *pixels.shape[:2], seed=0, epoch=0, index=index)
    return crop_array(pixels, box, spec.size, flip=flip, backend=spec.backend)


@pytest.mark.parametrize("crop", CROPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_crop_jpeg_close_to_full_decode(crop: str, backend: Backend) -> None:
    data = jpeg(photo(4, (900, 1200)))
    spec = CropSpec.of(OUT, crop=crop, flip=True, backend=backend)  # type: ignore[arg-type]
    for index in range(6):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index, name="a.jpg")
        check_output(out, (*OUT, 3))
        assert_close(out, full_path(data, spec, index))
        box, flip = plan_crop(spec, 900, 1200, seed=0, epoch=0, index=index)
        assert_close(out, pillow_reference(data, box, OUT, flip))


def test_decode_crop_into_fills_a_batch_slot_with_any_kernel() -> None:
    data = jpeg(photo(4, (400, 500)))
    spec = CropSpec.of(OUT, crop="random-resized", flip=True)
    seen: list[tuple[int, ...]] = []

    def kernel(source: np.ndarray, out: np.ndarray) -> None:
        seen.append(source.shape)
        pillow_resize_into(source, out)

    batch = np.zeros((2, *OUT, 3), dtype=np.uint8)
    for index in range(2):
        decode_crop_into(data, spec, batch[index], seed=0, epoch=0, index=index, resize=kernel)
        np.testing.assert_array_equal(
            batch[index], decode_crop(data, spec, seed=0, epoch=0, index=index)
        )
        box, _ = plan_crop(spec, 400, 500, seed=0, epoch=0, index=index)
        assert seen[-1] == (box.height, box.width, 3)  # the box, cut as a view, nothing else


def test_decode_crop_into_refuses_a_wrong_buffer() -> None:
    data = jpeg(photo(4, (40, 50)))
    spec = CropSpec.of(OUT, crop="center")
    for out in (
        np.zeros((*OUT, 2), np.uint8),
        np.zeros((8, 8, 3), np.uint8),
        np.zeros((*OUT, 3), np.float32),
    ):
        with pytest.raises(OptionsError, match="out should be a uint8 array of shape"):
            decode_crop_into(data, spec, out, seed=0, epoch=0, index=0)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_pixels_are_decode_image_pixels(channels: int, backend: Backend) -> None:
    pixels = photo(6, (90, 120))
    files = [
        jpeg(pixels),
        jpeg(pixels, mode="L"),
        jpeg(pixels, orientation=6),
        encode(Image.fromarray(pixels).convert("RGBA"), "PNG"),
        encode(Image.fromarray(pixels).convert("CMYK"), "JPEG"),
    ]
    for data in files:
        got = decode_pixels(data, backend=backend, channels=channels)
        np.testing.assert_array_equal(got, decode_image(data, backend=backend, channels=channels))


def test_jpegs_decode_to_the_same_pixels_through_opencv_and_pillow() -> None:
    # NOTE [ JPEG decoder ]: the pipeline decodes JPEGs with OpenCV whatever the backend.
    for seed, shape in enumerate([(375, 500), (333, 517), (64, 48)]):
        for mode in ("RGB", "L"):
            data = jpeg(photo(seed, shape), mode=mode)
            with Image.open(io.BytesIO(data)) as image:
                pillow = np.asarray(image)
            got = decode_pixels(data, channels=3 if mode == "RGB" else 1)
            np.testing.assert_array_equal(got, pillow.reshape(got.shape))


def test_decode_crop_drafts_big_jpegs_only_as_far_as_the_gap_allows() -> None:
    # A box of 1800 rows/cols and an output of 224: gap 2 reduces by 4 (450 >= 448), gap 1
    # by 8; the coarser reduction loses more detail, so it strays further from the full path.
    data = jpeg(photo(5, (1800, 1800)))
    errors = {}
    for gap in (1.0, 2.0):
        spec = CropSpec.of(224, crop="center", reducing_gap=gap)
        out = decode_crop(data, spec, seed=0, epoch=0, index=0)
        errors[gap] = psnr(out, full_path(data, spec, 0))
    assert errors[2.0] > errors[1.0] > MIN_PSNR_DB


def test_decode_crop_without_reducing_gap_is_exactly_the_full_path() -> None:
    data = jpeg(photo(4, (900, 1200)), orientation=6)
    spec = CropSpec.of(OUT, crop="random-resized", flip=True, reducing_gap=None)
    for index in range(4):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index)
        np.testing.assert_array_equal(out, full_path(data, spec, index))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("crop", ["random-resized", "center"])
def test_decode_crop_exif_orientation(orientation: int, crop: str) -> None:
    stored = photo(6, (600, 1000))  # wide as stored, tall as displayed for 5..8
    data = jpeg(stored, orientation=orientation)
    spec = CropSpec.of(OUT, crop=crop, flip=True)  # type: ignore[arg-type]
    displayed = (1000, 600) if orientation >= 5 else (600, 1000)
    for index in range(4):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index)
        check_output(out, (*OUT, 3))
        box, flip = plan_crop(spec, *displayed, seed=0, epoch=0, index=index)
        assert_close(out, pillow_reference(data, box, OUT, flip))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_stored_box_undoes_the_orientation(orientation: int) -> None:
    stored = np.random.default_rng(0).integers(0, 256, (7, 11, 1), dtype=np.uint8)
    displayed = apply_orientation(stored, orientation)
    for box in [Box(0, 0, 1, 1), Box(1, 2, 3, 4), Box(2, 1, 4, 3), Box(0, 0, *displayed.shape[:2])]:
        top, left, h, w = box
        if top + h > displayed.shape[0] or left + w > displayed.shape[1]:
            continue
        s_top, s_left, s_h, s_w = stored_box(box, orientation, 7, 11)
        cut = stored[s_top : s_top + s_h, s_left : s_left + s_w]
        np.testing.assert_array_equal(
            apply_orientation(cut, orientation), displayed[top : top + h, left : left + w]
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_crop_flip_flips(backend: Backend) -> None:
    data = jpeg(photo(7, (480, 640)), orientation=6)
    flipping = CropSpec.of(OUT, crop="random-resized", flip=True, backend=backend)
    plain = CropSpec.of(OUT, crop="random-resized", backend=backend)
    index = flipping_index(flipping, 640, 480)
    flipped = decode_crop(data, flipping, seed=0, epoch=0, index=index)
    np.testing.assert_array_equal(
        flipped, np.fliplr(decode_crop(data, plain, seed=0, epoch=0, index=index))
    )


def test_decode_crop_gray_jpeg() -> None:
    data = jpeg(photo(8, (700, 900)), mode="L", orientation=3)
    spec = CropSpec.of(OUT, crop="random-resized", flip=True)
    for index in range(4):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index)
        check_output(out, (*OUT, 3))
        assert np.array_equal(out[..., 0], out[..., 1])
        assert np.array_equal(out[..., 0], out[..., 2])
        box, flip = plan_crop(spec, 700, 900, seed=0, epoch=0, index=index)
        assert_close(out, pillow_reference(data, box, OUT, flip))
        gray = decode_crop(data, spec, seed=0, epoch=0, index=index, channels=1)
        check_output(gray, (*OUT, 1))
        np.testing.assert_array_equal(gray[..., 0], out[..., 0])


def test_decode_crop_one_channel_matches_decode_image_luminance() -> None:
    data = jpeg(photo(9, (700, 900)))
    spec = CropSpec.of(OUT, crop="random-resized")
    for index in range(4):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index, channels=1)
        check_output(out, (*OUT, 1))
        assert_close(out, full_path(data, spec, index, channels=1))


def test_decode_crop_cmyk_jpeg() -> None:
    data = jpeg(photo(10, (700, 900)), mode="CMYK")
    with Image.open(io.BytesIO(data)) as image:
        assert image.mode == "CMYK"
    spec = CropSpec.of(OUT, crop="random-resized")
    for index in range(4):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index)
        box, flip = plan_crop(spec, 700, 900, seed=0, epoch=0, index=index)
        assert_close(out, pillow_reference(data, box, OUT, flip))


def test_decode_crop_progressive_jpeg() -> None:
    data = encode(Image.fromarray(photo(17, (900, 1200))), "JPEG", quality=90, progressive=True)
    spec = CropSpec.of(OUT, crop="random-resized", flip=True)
    for index in range(4):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index)
        assert_close(out, full_path(data, spec, index))


def test_decode_crop_mpo_gives_the_first_frame() -> None:
    first, second = photo(11, (600, 800)), np.zeros((600, 800, 3), np.uint8)
    data = encode(
        Image.fromarray(first), "MPO", save_all=True, append_images=[Image.fromarray(second)]
    )
    spec = CropSpec.of(OUT, crop="center")
    out = decode_crop(data, spec, seed=0, epoch=0, index=0)
    assert_close(out, full_path(data, spec, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_crop_png_with_alpha_is_exactly_the_full_path(backend: Backend) -> None:
    rng = np.random.default_rng(12)
    rgba = np.concatenate([photo(12, (300, 400)), rng.integers(0, 256, (300, 400, 1), np.uint8)], 2)
    data = encode(Image.fromarray(rgba, mode="RGBA"), "PNG")
    spec = CropSpec.of(OUT, crop="random-resized", flip=True, backend=backend)
    for index in range(4):
        out = decode_crop(data, spec, seed=0, epoch=0, index=index)
        np.testing.assert_array_equal(out, full_path(data, spec, index))
        box, flip = plan_crop(spec, 300, 400, seed=0, epoch=0, index=index)
        if backend == "pillow":  # within rounding of Pillow's own compositing
            diff = np.abs(out.astype(np.int16) - pillow_reference(data, box, OUT, flip))
            assert diff.max() <= 1


def test_decode_crop_palette_and_16_bit_png_follow_decode_image() -> None:
    gray16 = (np.arange(300 * 400, dtype=np.uint32).reshape(300, 400) % 65536).astype(np.uint16)
    palette = Image.fromarray(photo(13, (300, 400))).convert("P")
    spec = CropSpec.of(OUT, crop="center")
    for data in (encode(Image.fromarray(gray16), "PNG"), encode(palette, "PNG")):
        out = decode_crop(data, spec, seed=0, epoch=0, index=0)
        np.testing.assert_array_equal(out, full_path(data, spec, 0))


def test_decode_crop_small_images_are_enlarged() -> None:
    data = jpeg(photo(14, (50, 70)))
    spec = CropSpec.of(OUT, crop="random-resized")
    out = decode_crop(data, spec, seed=0, epoch=0, index=0)
    check_output(out, (*OUT, 3))
    assert_close(out, full_path(data, spec, 0))


def test_decode_crop_is_thread_safe() -> None:
    files = [jpeg(photo(i, (300, 400)), orientation=1 + i % 8) for i in range(8)]
    spec = CropSpec.of(OUT, crop="random-resized", flip=True)

    def run(index: int) -> np.ndarray:
        return decode_crop(files[index % 8], spec, seed=3, epoch=1, index=index)

    sequential = [run(i) for i in range(32)]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(run, range(32)))
    for a, b in zip(sequential, parallel, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty file"),
        (b"not an image at all", "not a recognised image file"),
        (b"\xff\xd8\xff\xe0" + b"\x00" * 64, "a/b.jpg: "),
    ],
)
def test_decode_crop_corrupt_bytes_name_the_file(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_crop(data, CropSpec.of(8, crop="center"), seed=0, epoch=0, index=0, name="a/b.jpg")
    assert str(info.value).startswith("a/b.jpg: ")
    assert message in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_crop_truncated_jpeg_names_the_file(backend: Backend) -> None:
    data = jpeg(photo(15, (600, 800)))
    spec = CropSpec.of(8, crop="center", backend=backend)
    with pytest.raises(DecodeError, match=r"^x\.jpg: cannot decode JPEG image"):
        decode_crop(data[: len(data) // 2], spec, seed=0, epoch=0, index=0, name="x.jpg")


def test_decode_crop_refuses_bombs_and_bad_arguments() -> None:
    data = jpeg(photo(16, (60, 80)))
    spec = CropSpec.of(8, crop="center")
    with pytest.raises(DecodeError, match=r"^b\.jpg: image is 80x60 = 4800 pixels, over the limit"):
        decode_crop(data, spec, seed=0, epoch=0, index=0, name="b.jpg", max_pixels=4799)
    with pytest.raises(OptionsError, match="channels should be 1 or 3, but got channels=2"):
        decode_crop(data, spec, seed=0, epoch=0, index=0, channels=2)
    with pytest.raises(OptionsError, match="max_pixels should be positive"):
        decode_crop(data, spec, seed=0, epoch=0, index=0, max_pixels=0)
    with pytest.raises(OptionsError, match="epoch and index should be non-negative"):
        decode_crop(data, spec, seed=0, epoch=0, index=-1)


@pytest.mark.parametrize("crop", ["random-resized", "center"])
def test_decode_crop_real_photos(crop: str) -> None:
    if not SHARED_PHOTOS.is_dir():
        pytest.skip(f"no photos folder at {SHARED_PHOTOS}")
    paths = sorted(p for p in SHARED_PHOTOS.iterdir() if p.suffix in (".jpg", ".png"))
    if not paths:
        pytest.skip("the photos folder is empty")
    spec = CropSpec.of(224, crop=crop, flip=True)  # type: ignore[arg-type]
    for index, path in enumerate(paths):
        data = path.read_bytes()
        out = decode_crop(data, spec, seed=0, epoch=0, index=index, name=path.name)
        check_output(out, (224, 224, 3))
        assert_close(out, full_path(data, spec, index))
