"""Synthetic photographs: "1/f" scenes of soft blobs (``make_image_folder``'s default bank)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt


def synthesize_photo(rng: np.random.Generator, size: tuple[int, int]) -> npt.NDArray[np.uint8]:
    """Return a natural-looking ``(height, width, 3)`` uint8 image drawn from ``rng``.

    A landscape-like scene: a sky-to-ground backdrop, a few soft-edged objects, and ``1/f``
    textures (the statistics of natural images), so that it compresses like a photograph.
    """
    height, width = size
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    cols = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]

    # Backdrop: sky above a horizon, ground below, each with a gentle gradient.
    horizon = rng.uniform(0.25, 0.75) + 0.1 * (cols - 0.5) * rng.uniform(-1.0, 1.0)
    steepness = height / rng.uniform(1.5, 6.0)  # the horizon is a few pixels wide
    ground = 1.0 / (1.0 + np.exp(np.clip((horizon - rows) * steepness, -30.0, 30.0)))
    sky, earth = _natural_colour(rng, _SKY_COLOURS), _natural_colour(rng)
    shade = (1.0 + 0.25 * (rows - 0.5) * rng.uniform(-1.0, 1.0))[..., None]
    image = (sky + (earth - sky) * ground[..., None]) * shade

    # Objects: blobs with outlines made irregular by a smooth random field.
    outline = _pink_noise(rng, size, exponent=2.0)
    for _ in range(int(rng.integers(3, 8))):
        _paint_blob(rng, image, outline, _natural_colour(rng))

    # Texture on everything (stronger on the ground), then colour variation and grain.
    texture = _pink_noise(rng, size, exponent=rng.uniform(0.9, 1.2))
    strength = rng.uniform(0.08, 0.16) * (0.6 + 0.8 * ground)
    image *= (1.0 + strength * texture)[..., None]
    tint = 0.03 * _pink_noise(rng, size, exponent=1.8)
    image[..., 0] += tint
    image[..., 2] -= tint
    grain = rng.standard_normal((height, width), dtype=np.float32)
    image += (0.004 * grain)[..., None]
    return np.asarray(np.clip(image * 255.0 + 0.5, 0.0, 255.0), dtype=np.uint8)


def _paint_blob(
    rng: np.random.Generator,
    image: npt.NDArray[np.float32],
    outline: npt.NDArray[np.float32],
    colour: npt.NDArray[np.float32],
) -> None:
    """Paint one object of ``colour`` into ``image`` in place, touching only its box."""
    height, width = image.shape[:2]
    cy, cx = rng.uniform(0.0, 1.0) * height, rng.uniform(0.0, 1.0) * width
    ry = rng.uniform(0.04, 0.3) * height
    rx = rng.uniform(0.04, 0.3) * width
    angle = rng.uniform(0.0, np.pi)
    softness = rng.uniform(0.4, 1.5)  # edge width in pixels
    reach = 1.5 * max(rx, ry) + 4.0 * softness
    y0, y1 = max(0, int(cy - reach)), min(height, int(cy + reach) + 1)
    x0, x1 = max(0, int(cx - reach)), min(width, int(cx + reach) + 1)
    if y0 >= y1 or x0 >= x1:
        return
    dy = np.arange(y0, y1, dtype=np.float32)[:, None] - cy
    dx = np.arange(x0, x1, dtype=np.float32)[None, :] - cx
    cos, sin = math.cos(angle), math.sin(angle)
    u = (dx * cos + dy * sin) / rx
    v = (dy * cos - dx * sin) / ry
    radius = 1.0 + 0.2 * outline[y0:y1, x0:x1]
    distance = (np.sqrt(u * u + v * v) - radius) * min(rx, ry)
    mask = 1.0 / (1.0 + np.exp(np.clip(distance / softness, -30.0, 30.0)))
    # Light from above: objects are a little brighter at the top.
    light = 1.0 + 0.15 * np.clip(-dy / ry, -1.0, 1.0)
    region = image[y0:y1, x0:x1]
    region += mask[..., None] * (colour * light[..., None] - region)


def _pink_noise(
    rng: np.random.Generator, size: tuple[int, int], *, exponent: float
) -> npt.NDArray[np.float32]:
    """Return a zero-mean, unit-std field whose amplitude spectrum falls as ``1/f**exponent``."""
    height, width = size
    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :]
    frequency_sq = fy * fy + fx * fx
    frequency_sq[0, 0] = 1.0
    amplitude = frequency_sq ** np.float32(-exponent / 2.0)
    amplitude[0, 0] = 0.0  # zero mean
    # Complex gaussian coefficients: random phases, Rayleigh-distributed magnitudes.
    spectrum = np.empty(amplitude.shape, dtype=np.complex64)
    spectrum.real = rng.standard_normal(amplitude.shape, dtype=np.float32) * amplitude
    spectrum.imag = rng.standard_normal(amplitude.shape, dtype=np.float32) * amplitude
    field = np.fft.irfft2(spectrum, s=(height, width)).astype(np.float32, copy=False)
    std = float(field.std())
    if std > 0:
        field /= np.float32(std)
    return field


# Colours of common scene elements (RGB in [0, 1]): foliage, grass, sky, cloud, water,
# soil, sand, rock, bark, brick, flowers, paint.
_PALETTE = np.array(
    [
        [0.25, 0.38, 0.15],
        [0.45, 0.55, 0.22],
        [0.52, 0.66, 0.85],
        [0.82, 0.84, 0.86],
        [0.18, 0.32, 0.42],
        [0.42, 0.32, 0.22],
        [0.80, 0.70, 0.52],
        [0.50, 0.49, 0.46],
        [0.30, 0.22, 0.16],
        [0.62, 0.30, 0.22],
        [0.85, 0.75, 0.20],
        [0.70, 0.15, 0.20],
        [0.60, 0.35, 0.60],
        [0.12, 0.12, 0.14],
    ],
    dtype=np.float32,
)


_SKY_COLOURS = (0, 2, 2, 3, 4, 7)  # what the top of a scene mostly is: trees, sky, water, rock


def _natural_colour(
    rng: np.random.Generator, choices: tuple[int, ...] | None = None
) -> npt.NDArray[np.float32]:
    """Return a colour of a common scene element (one of ``choices``), slightly varied."""
    if choices is None:
        base = _PALETTE[int(rng.integers(len(_PALETTE)))]
    else:
        base = _PALETTE[choices[int(rng.integers(len(choices)))]]
    varied = base * rng.uniform(0.8, 1.2) + rng.normal(0.0, 0.03, size=3)
    return np.asarray(np.clip(varied, 0.02, 0.98), dtype=np.float32)
