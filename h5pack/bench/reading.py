"""How training reads the images (``TrainingRead``), and what sizes they come in (``SizeSurvey``).

Every access pattern is measured through the loader with ``make_loader``'s ``size=``,
``crop=`` and ``flip=``, so layouts are compared as training will read them.

# NOTE [ Training size by default ]
#
# The loader batches images of several sizes only when it cuts them to one size. So the
# benchmarks' default ("auto") reads images as stored when they share one size, and
# otherwise as an image classifier reads them: random-resized crops of 224x224 with
# flips. The reports say so; an explicit training size (or "as stored") replaces it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.core.decode import load_file, probe_size
from h5pack.core.store import Store, open_store
from h5pack.errors import DecodeError, OptionsError
from h5pack.read.crop import CROPS, Crop, CropSpec
from h5pack.read.packset import PackSource, describe
from h5pack.write.scan import scan

AUTO_SIZE = 224  # what "auto" cuts images of several sizes to (ImageNet's)
SURVEY_FILES = 5000  # headers read at most to survey a folder; beyond, an even sample


@dataclass(frozen=True, kw_only=True)
class TrainingRead:
    """How training reads every image: ``make_loader``'s ``size=`` (H, W), ``crop=``, ``flip=``.

    ``size`` None reads images as stored (then no crop or flip); ``auto``: chosen by the
    "auto" policy (see "Training size by default").
    """

    size: tuple[int, int] | None = None
    crop: Crop = "random-resized"
    flip: bool = False
    auto: bool = False

    def __post_init__(self) -> None:
        size = self.size
        if size is not None:
            if len(size) != 2 or not all(type(s) is int and s > 0 for s in size):
                raise OptionsError(
                    "the training size should be one or two positive integers (--train-size "
                    f"224 or 224,320), but got {size!r}"
                )
            object.__setattr__(self, "size", tuple(size))
        if self.crop not in CROPS:
            raise OptionsError(
                f"crop should be one of {', '.join(CROPS)}, but got crop={self.crop!r}"
            )
        if self.size is None and (self.flip or self.crop != "random-resized"):
            raise OptionsError(
                "--crop and --flip apply to images cut to a training size: add --train-size "
                "(size= in Python)"
            )

    @classmethod
    def of(
        cls,
        size: int | tuple[int, int] | None,
        *,
        crop: Crop = "random-resized",
        flip: bool = False,
    ) -> TrainingRead:
        """Build one, reading an int ``size`` as a square."""
        return cls(size=(size, size) if isinstance(size, int) else size, crop=crop, flip=flip)

    def crop_spec(self) -> CropSpec | None:
        """Return the dataset's ``CropSpec`` (None: as stored)."""
        return None if self.size is None else CropSpec.of(self.size, crop=self.crop, flip=self.flip)

    def describe(self) -> str:
        """Return e.g. ``"random-resized crops of 224x224, flipped"`` or ``"images as stored"``."""
        if self.size is None:
            return "images as stored"
        height, width = self.size
        size = f"{width}x{height}" if height == width else f"{width}x{height} (W x H)"
        text = {
            "random-resized": f"random-resized crops of {size}",
            "center": f"center crops of {size}",
            "resize": f"whole images resized to {size}",
        }[self.crop]
        return text + (", flipped" if self.flip else "")

    def to_json(self) -> dict[str, Any]:
        """Return it as JSON-ready data, with its description."""
        return {
            "size": list(self.size) if self.size else None,
            "crop": self.crop if self.size else None,
            "flip": self.flip,
            "auto": self.auto,
            "description": self.describe(),
        }


TrainChoice = TrainingRead | Literal["auto"]


def parse_train_size(text: str) -> tuple[int, int] | None:
    """Parse ``--train-size``: ``224`` (a square), ``224,320`` (H, W) or ``none`` (as stored)."""
    value = text.strip().lower()
    if value in ("none", "stored"):
        return None
    parts = value.split(",")
    numbers = [int(p) for p in parts] if all(p.strip().isdigit() for p in parts) else []
    numbers *= 2 if len(numbers) == 1 else 1
    if len(numbers) != 2 or min(numbers) < 1:
        raise OptionsError(
            "--train-size should be one positive integer (224), two as H,W (224,320) or "
            f"'none', but got --train-size {text}"
        )
    return numbers[0], numbers[1]


@dataclass(frozen=True)
class SizeSurvey:
    """How many images of each ``(H, W)``, of ``images`` surveyed among ``total``."""

    counts: dict[tuple[int, int], int]
    images: int
    total: int

    @classmethod
    def of(cls, sizes: Iterable[tuple[int, int]], total: int | None = None) -> SizeSurvey:
        """Count ``sizes`` (``(H, W)`` pairs)."""
        counts = Counter((int(h), int(w)) for h, w in sizes)
        images = sum(counts.values())
        return cls(dict(counts), images, images if total is None else total)

    @property
    def uniform(self) -> bool:
        """Whether every image surveyed has one size."""
        return len(self.counts) <= 1

    def describe(self) -> str:
        """Return e.g. ``"one size, 500x375 (W x H)"`` or ``"187 sizes (widths 344 to ...)"``."""
        if not self.counts:
            return "no readable images"
        if len(self.counts) == 1:
            height, width = next(iter(self.counts))
            return f"one size, {width}x{height} (W x H)"
        heights, widths = zip(*self.counts, strict=True)
        sampled = f" in a sample of {self.images}" if self.images < self.total else ""
        return (
            f"{len(self.counts)} sizes{sampled} (widths {min(widths)} to {max(widths)}, "
            f"heights {min(heights)} to {max(heights)} pixels)"
        )


def _probe(path: str) -> tuple[int, int] | None:
    try:
        return probe_size(load_file(path), name=path)
    except DecodeError:
        return None


def survey_folder(folder: StrPath, *, max_files: int = SURVEY_FILES) -> SizeSurvey:
    """Read the image sizes of a folder from the headers of (an even sample of) its files."""
    files = scan(folder).files
    chosen = files
    if len(files) > max_files:
        picks = np.linspace(0, len(files) - 1, max_files).round().astype(np.int64)
        chosen = tuple(files[i] for i in np.unique(picks).tolist())
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        sizes = [s for s in pool.map(_probe, [os.fspath(f.path) for f in chosen]) if s]
    return SizeSurvey.of(sizes, total=len(files))


def survey_pack(path: PackSource, store: Store | None = None) -> SizeSurvey:
    """Return the image sizes a pack (or a pack set) records (read from ``store``)."""
    shapes = describe(path, store=store or open_store(path)).meta.shapes
    return SizeSurvey.of((int(s[0]), int(s[1])) for s in shapes)


def resolve_training_read(choice: TrainChoice, survey: SizeSurvey) -> TrainingRead:
    """Return how training reads images of ``survey`` (see "Training size by default")."""
    if isinstance(choice, TrainingRead):
        return choice
    if choice != "auto":
        raise OptionsError(f"train should be a TrainingRead or 'auto', but got train={choice!r}")
    if survey.uniform:
        return TrainingRead(auto=True)
    return TrainingRead(size=(AUTO_SIZE, AUTO_SIZE), flip=True, auto=True)


def auto_note(train: TrainingRead, survey: SizeSurvey) -> str:
    """Return one line saying how images are read and, for "auto", why."""
    if not train.auto:
        return f"Read as training will read them: {train.describe()}."
    if train.size is None:
        return (
            f"Read as stored: the images have {survey.describe()}, so the loader batches "
            "them as they are (--train-size N measures them cut to N x N instead)."
        )
    return (
        f"Read as an image classifier reads them ({train.describe()}): the images have "
        f"{survey.describe()}, and the loader batches images of several sizes only at one "
        "size. --train-size sets another size; --train-size none reads them as stored."
    )


def batch_problem(survey: SizeSurvey, train: TrainingRead) -> str | None:
    """Return why the loader cannot stack images of ``survey`` read with ``train``, or None."""
    if train.size is not None or survey.uniform:
        return None
    return (
        f"its images have {survey.describe()} and are read without a training size, so the "
        "loader cannot stack them into batches"
    )
