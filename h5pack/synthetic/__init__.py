"""Make deterministic, natural-looking image folders for demos, tests and benchmarks.

Benchmark data should decode and compress like photographs, so each image is a random crop
of a photograph (a folder of real ones, else a bank of synthetic scenes made by
:func:`synthesize_photo`), resized and lightly jittered. Image ``i`` is a pure function of
``(spec, photos, i)``. It is written to ``class_KK/img_IIIIII.jpg`` (class ``i %
num_classes``; each class prefers its own photographs), or straight into the target when
``flat``.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageFilter, ImageOps, ImageStat

from h5pack._types import StrPath
from h5pack.errors import OptionsError, SourceError, TargetExistsError
from h5pack.synthetic.photo import synthesize_photo as synthesize_photo  # re-exported

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")  # files read from a photos folder

_FORMATS: dict[str, str] = {"jpeg": ".jpg", "png": ".png"}
_NUM_SYNTHETIC = 12  # photographs in the synthetic bank used without a photos folder
_BANK_TAG = 0x5EED_BA4C  # seeds the synthetic bank; independent of SampleSpec.seed
_PREFERRED_P = 0.8  # probability that an image of class c is cut from c's own photographs
_HEADROOM = 1.5  # working photos' short side: this many times the target's long side
_PNG_LEVEL = 1  # PNG deflate level: fast; PNG of a photo barely shrinks at higher levels


@dataclass(frozen=True, kw_only=True)
class SampleSpec:
    """What image folder to make.

    ``size`` is the base ``(height, width)``; ``size_jitter`` in [0, 1) lets each side vary
    by up to ± that fraction. Image ``i`` has label ``i % num_classes`` and draws from
    ``np.random.default_rng((seed, i))``; ``quality`` is JPEG's; ``flat`` writes no class
    folders.
    """

    num_images: int = 200
    num_classes: int = 4
    size: tuple[int, int] = (375, 500)
    size_jitter: float = 0.0
    fmt: Literal["jpeg", "png"] = "jpeg"
    quality: int = 90
    seed: int = 0
    flat: bool = False

    def __post_init__(self) -> None:
        checks = (
            ("num_images", self.num_images >= 1, "be at least 1"),
            ("num_classes", self.num_classes >= 1, "be at least 1"),
            (
                "size",
                len(self.size) == 2 and min(self.size) >= 1,
                "be two positive integers (height, width)",
            ),
            ("size_jitter", 0.0 <= self.size_jitter < 1.0, "be in [0, 1)"),
            ("fmt", self.fmt in _FORMATS, f"be one of {sorted(_FORMATS)}"),
            ("quality", 1 <= self.quality <= 100, "be in [1, 100]"),
            ("seed", self.seed >= 0, "be non-negative"),
        )
        for name, ok, should in checks:
            if not ok:
                got = getattr(self, name)
                raise OptionsError(f"{name} should {should}, but got {name}={got!r}")

    @property
    def max_size(self) -> tuple[int, int]:
        """The largest ``(height, width)`` any image of this spec can have."""
        return (
            math.ceil(self.size[0] * (1.0 + self.size_jitter)),
            math.ceil(self.size[1] * (1.0 + self.size_jitter)),
        )


def make_image_folder(
    target: StrPath,
    spec: SampleSpec = SampleSpec(),
    *,
    photos: StrPath | Literal[False] | None = None,
    workers: int = 0,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """Write a deterministic folder of natural-looking images; return their paths, sorted.

    Args:
        target: Folder to write into; created if missing; must be empty unless ``overwrite``.
        spec: What to make.
        photos: Folder of photographs to crop from (SourceError when missing or empty);
            None (or False): synthetic photographs.
        workers: Worker processes (0: this one); the files are the same whatever the number.
        overwrite: Allow a non-empty target (TargetExistsError otherwise).
        progress: Called with the number of images just written.
    """
    if workers < 0:
        raise OptionsError(f"workers should be non-negative, but got workers={workers}")
    source = _resolve_source(photos, spec)
    root = Path(target)
    if root.exists() and not root.is_dir():
        raise TargetExistsError(f"{root}: the target exists and is not a folder")
    if root.is_dir() and not overwrite and any(root.iterdir()):
        raise TargetExistsError(f"{root}: the target folder is not empty (pass overwrite=True)")
    paths = [root / image_name(spec, index) for index in range(spec.num_images)]
    if workers == 0:
        _load_bank(source)  # a bad photograph fails here, before any folder is made
    for folder in sorted({path.parent for path in paths}):
        folder.mkdir(parents=True, exist_ok=True)

    if workers == 0:
        batches: Iterator[int] = (_write_batch(source, spec, [item]) for item in enumerate(paths))
    else:
        batches = _write_parallel(source, spec, paths, workers)
    for done in batches:
        if progress is not None:
            progress(done)
    return sorted(paths)


def image_name(spec: SampleSpec, index: int) -> Path:
    """Return ``class_KK/img_IIIIII.ext`` (``img_IIIIII.ext`` when flat) of image ``index``.

    Both numbers are zero-padded (at least 2 and 6 digits) so that names sort in index order.
    """
    image_width = max(6, len(str(spec.num_images - 1)))
    name = f"img_{index:0{image_width}d}{_FORMATS[spec.fmt]}"
    if spec.flat:
        return Path(name)
    class_width = max(2, len(str(spec.num_classes - 1)))
    return Path(f"class_{index % spec.num_classes:0{class_width}d}", name)


@dataclass(frozen=True)
class _Source:
    """A picklable recipe for the bank of photographs, cheap to send to workers."""

    photos: Path | None  # None: synthetic bank
    short_side: int  # working photos are scaled down to at most this short side
    stamp: tuple[tuple[str, int, int], ...] = ()  # (name, bytes, mtime_ns) of each photo


def photos_folder(photos: StrPath | Literal[False] | None = None) -> Path | None:
    """Return the folder :func:`make_image_folder` crops from (resolved), or None: synthetic.

    SourceError when ``photos`` does not exist or holds no photograph.
    """
    if photos is None or photos is False:
        return None
    folder = Path(photos)
    if not folder.is_dir():
        raise SourceError(f"{folder}: the photos folder does not exist")
    if not _photo_files(folder):
        raise SourceError(f"{folder}: the photos folder holds no {'/'.join(PHOTO_SUFFIXES)} file")
    return folder.resolve()


def _resolve_source(photos: StrPath | Literal[False] | None, spec: SampleSpec) -> _Source:
    folder = photos_folder(photos)
    short_side = math.ceil(_HEADROOM * max(spec.max_size))
    if folder is None:
        return _Source(None, short_side)
    # The stamp keys the per-process cache of loaded photographs: edited photos are reloaded.
    stats = [(path.name, path.stat()) for path in _photo_files(folder)]
    stamp = tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats)
    return _Source(folder, short_side, stamp)


def _photo_files(folder: Path) -> list[Path]:
    return sorted(
        (p for p in folder.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES and p.is_file()),
        key=lambda p: p.name,
    )


@lru_cache(maxsize=2)
def _load_bank(source: _Source) -> tuple[Image.Image, ...]:
    """Load (once per process) the photographs images are cut from, at working size."""
    if source.photos is None:
        side = source.short_side
        return tuple(
            Image.fromarray(
                synthesize_photo(np.random.default_rng((_BANK_TAG, j)), (side, side * 3 // 2))
            )
            for j in range(_NUM_SYNTHETIC)
        )
    bank = []
    for path in _photo_files(source.photos):
        try:
            with Image.open(path) as opened:
                # draft() lets libjpeg decode at a reduced scale, never below the size asked.
                opened.draft("RGB", (source.short_side, source.short_side))
                photo = ImageOps.exif_transpose(opened).convert("RGB")
        except OSError as err:
            raise SourceError(f"{path}: cannot read this photograph: {err}") from err
        scale = source.short_side / min(photo.size)
        if scale < 1.0:
            new_size = (max(1, round(photo.width * scale)), max(1, round(photo.height * scale)))
            photo = photo.resize(new_size, Image.Resampling.LANCZOS)
        bank.append(photo)
    return tuple(bank)


def _render_image(photos: tuple[Image.Image, ...], spec: SampleSpec, index: int) -> Image.Image:
    """Return image ``index`` of ``spec``, cut from ``photos`` (random draws in a fixed order)."""
    rng = np.random.default_rng((spec.seed, index))
    height, width = spec.size
    if spec.size_jitter > 0:
        factors = 1.0 + spec.size_jitter * rng.uniform(-1.0, 1.0, size=2)
        height = max(1, round(height * factors[0]))
        width = max(1, round(width * factors[1]))

    # Which photograph: mostly one of the class's own, sometimes any.
    label = index % spec.num_classes
    if spec.num_classes <= len(photos):
        preferred = range(label, len(photos), spec.num_classes)
    else:
        preferred = range(label % len(photos), label % len(photos) + 1)
    if rng.uniform() < _PREFERRED_P:
        photo = photos[preferred[int(rng.integers(len(preferred)))]]
    else:
        photo = photos[int(rng.integers(len(photos)))]

    # Random crop: 30-100 % of the photograph's area, aspect near the target's.
    area = rng.uniform(0.3, 1.0) * photo.width * photo.height
    aspect = (width / height) * math.exp(rng.uniform(-0.15, 0.15))
    crop_w = min(float(photo.width), math.sqrt(area * aspect))
    crop_h = min(float(photo.height), crop_w / aspect)
    crop_w = min(crop_w, crop_h * aspect)
    left = rng.uniform(0.0, photo.width - crop_w)
    top = rng.uniform(0.0, photo.height - crop_h)
    box = (left, top, left + crop_w, top + crop_h)
    image = photo.resize((width, height), Image.Resampling.BILINEAR, box=box)
    if rng.uniform() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    # Colour jitter as one affine map of RGB: brightness, contrast, saturation, hue.
    brightness = 1.0 + rng.uniform(-0.08, 0.08)
    contrast = 1.0 + rng.uniform(-0.08, 0.08)
    saturation = 1.0 + rng.uniform(-0.12, 0.12)
    hue = rng.uniform(-0.04, 0.04) * 2.0 * math.pi
    matrix = _colour_matrix(saturation=saturation, hue=hue) * (brightness * contrast)
    mean = float(np.mean(ImageStat.Stat(image).mean))
    offset = brightness * (1.0 - contrast) * mean
    affine = np.concatenate([matrix, np.full((3, 1), offset, dtype=np.float32)], axis=1)
    image = image.convert("RGB", matrix=tuple(float(x) for x in affine.ravel()))

    # Now and then a little luminance noise or a little defocus.
    effect, strength = rng.uniform(), rng.uniform()
    if effect < 0.2:
        sigma = np.float32(1.0 + 2.0 * strength)
        noise = np.rint(rng.standard_normal((height, width), dtype=np.float32) * sigma)
        pixels = np.asarray(image, dtype=np.int16) + noise.astype(np.int16)[..., None]
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    elif effect < 0.4:
        image = image.filter(ImageFilter.BoxBlur(0.3 + 0.6 * strength))
    return image


def _colour_matrix(*, saturation: float, hue: float) -> npt.NDArray[np.float32]:
    """Return the RGB matrix that scales saturation and rotates hue about the grey axis."""
    grey = np.full((3, 3), 1.0 / 3.0)
    axis = np.ones(3) / math.sqrt(3.0)
    cross = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    rotation = (
        math.cos(hue) * np.eye(3)
        + math.sin(hue) * cross
        + (1.0 - math.cos(hue)) * np.outer(axis, axis)
    )
    chroma = rotation @ (np.eye(3) - grey) * saturation
    return np.asarray(grey + chroma, dtype=np.float32)


def _write_batch(source: _Source, spec: SampleSpec, items: list[tuple[int, Path]]) -> int:
    for index, path in items:
        image = _render_image(_load_bank(source), spec, index)
        if spec.fmt == "jpeg":
            image.save(path, format="JPEG", quality=spec.quality)
        else:
            image.save(path, format="PNG", compress_level=_PNG_LEVEL)
    return len(items)


def _write_parallel(
    source: _Source, spec: SampleSpec, paths: list[Path], workers: int
) -> Iterator[int]:
    """Write ``paths`` in ``workers`` processes; yield how many images each batch wrote."""
    items = list(enumerate(paths))
    batch = max(1, min(64, len(items) // (4 * workers)))
    # Spawn, not fork: fork is unsafe once threads run (torch, BLAS).
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [
            pool.submit(_write_batch, source, spec, items[start : start + batch])
            for start in range(0, len(items), batch)
        ]
        for future in as_completed(futures):
            yield future.result()
