"""Conversion options: one frozen, self-validating object built once at the edge."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

from h5pack.core.decode import BACKENDS, RESIZE_METHODS, Backend, ResizeMethod
from h5pack.core.layout import (
    DEFAULT_CHUNK_BYTES,
    Compression,
    array_chunk_shape,
    check_chunk_bytes,
)
from h5pack.core.machine import available_cores
from h5pack.core.vocabulary import LAYOUT_CHOICES as LAYOUT_CHOICES  # re-exported
from h5pack.core.vocabulary import MODE_CHOICES as MODE_CHOICES
from h5pack.core.vocabulary import LayoutChoice as LayoutChoice
from h5pack.core.vocabulary import ModeChoice as ModeChoice
from h5pack.errors import OptionsError

DEFAULT_QUALITY = 90


def option_name(name: str) -> str:
    """Return how messages name an option, flag first: ``"--chunk-samples (chunk_samples=)"``."""
    return f"--{name.replace('_', '-')} ({name}=)"


def _choice(name: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise OptionsError(
            f"{option_name(name)} should be one of {', '.join(map(str, allowed))}, "
            f"but got {value!r}"
        )


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise OptionsError(f"{option_name(name)} should be a positive integer, but got {value!r}")


def _positives(name: str, value: tuple[int, ...] | None, count: int, what: str) -> None:
    if value is not None and (
        not isinstance(value, tuple)
        or len(value) != count
        or not all(isinstance(s, int) and s > 0 for s in value)
    ):
        raise OptionsError(f"{option_name(name)} should be {what}, but got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """How to convert an image folder into a pack; validated on construction.

    Attributes:
        mode: ``"raw"`` pixels, ``"encoded"`` file bytes, or ``"auto"``: raw when every
            image has one size (or ``size`` is given).
        size: ``(H, W)`` (or N for N x N) to resize raw pixels to, with ``resize``
            (``"stretch"``, ``"crop"`` or ``"pad"``).
        layout: ``"chunked"``, ``"contiguous"`` or ``"auto"`` (contiguous for an
            uncompressed blob without ``chunk_bytes``).
        chunk_samples, chunk_shape, chunk_bytes: At most one; by default the chunk is
            sized from ``layout.DEFAULT_CHUNK_BYTES`` (``plan``, NOTE [ Padding ]).
        shuffle_samples, seed: Store samples in a seeded random order (every chunk mixes
            classes; the source order is kept in the pack).
        max_side, quality: Encoded mode: re-encode larger images to JPEG of this side.
        workers: Processes; None uses every core, 1 runs in this process.
        strict: Stop at the first file that cannot be packed instead of skipping it.
        labels_csv: A manifest of the folder's images (``write.manifest``).
    """

    mode: ModeChoice = "auto"
    size: tuple[int, int] | None = None  # an int N is taken as (N, N)
    resize: ResizeMethod = "stretch"
    channels: int = 3
    backend: Backend = "pillow"
    layout: LayoutChoice = "auto"
    chunk_samples: int | None = None
    chunk_shape: tuple[int, ...] | None = None
    chunk_bytes: int | None = None
    compression: Compression = dataclasses.field(default_factory=Compression)
    shuffle_samples: bool = True
    seed: int = 0
    max_side: int | None = None
    quality: int | None = None
    workers: int | None = None
    strict: bool = False
    labels_csv: str | None = None

    def __post_init__(self) -> None:
        _choice("mode", self.mode, MODE_CHOICES)
        _choice("resize", self.resize, RESIZE_METHODS)
        _choice("channels", self.channels, (1, 3))
        _choice("backend", self.backend, BACKENDS)
        _choice("layout", self.layout, LAYOUT_CHOICES)
        if not isinstance(self.compression, Compression):
            raise OptionsError(
                "compression should be a layout.Compression, e.g. Compression(codec='zstd'), "
                f"but got compression={self.compression!r}"
            )
        if isinstance(self.size, int) and not isinstance(self.size, bool):
            object.__setattr__(self, "size", (self.size, self.size))  # a square, as make_loader
        elif isinstance(self.size, Iterable) and not isinstance(self.size, str):
            object.__setattr__(self, "size", tuple(self.size))
        if self.chunk_shape is not None:
            object.__setattr__(self, "chunk_shape", tuple(self.chunk_shape))
        if self.labels_csv is not None:
            object.__setattr__(self, "labels_csv", os.fspath(self.labels_csv))
        _positives("size", self.size, 2, "two positive integers (height, width)")
        _positive("chunk_samples", self.chunk_samples)
        _positive("chunk_bytes", self.chunk_bytes)
        _positive("max_side", self.max_side)
        _positive("workers", self.workers)
        if self.chunk_bytes is not None:
            check_chunk_bytes(self.chunk_bytes)
        what = "four positive integers (samples, height, width, channels)"
        _positives("chunk_shape", self.chunk_shape, 4, what)
        if self.quality is not None and not (
            isinstance(self.quality, int) and 1 <= self.quality <= 100
        ):
            raise OptionsError(
                f"{option_name('quality')} should be in 1..100, but got {self.quality!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise OptionsError(
                f"{option_name('seed')} should be a non-negative integer, but got {self.seed!r}"
            )
        given = [
            name
            for name in ("chunk_samples", "chunk_shape", "chunk_bytes")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise OptionsError(
                "give one of --chunk-samples, --chunk-shape, --chunk-bytes (chunk_samples=, "
                f"chunk_shape=, chunk_bytes=), but got {' and '.join(map(option_name, given))}"
            )
        if self.layout == "contiguous":
            if self.compression.codec != "none":
                raise OptionsError(
                    "HDF5 compresses only chunked datasets: drop --compression "
                    f"{self.compression.codec} or use --layout chunked (layout='chunked')"
                )
            if given:
                raise OptionsError(
                    f"a contiguous layout has no chunks, so {option_name(given[0])} does not "
                    "apply: drop it or use --layout chunked (layout='chunked')"
                )
        if self.mode == "encoded":
            if self.size is not None:
                raise OptionsError(
                    f"{option_name('size')} applies to raw pixels; encoded mode stores the "
                    "files as they are (use --mode raw --size N (or H,W), or --max-side to bound "
                    "encoded images)"
                )
            if self.chunk_samples is not None or self.chunk_shape is not None:
                raise OptionsError(
                    "encoded images are stored as one byte blob chunked by bytes: use "
                    f"{option_name('chunk_bytes')} instead of --chunk-samples/--chunk-shape"
                )
        if self.max_side is not None and self.mode == "raw":
            raise OptionsError(
                f"{option_name('max_side')} re-encodes oversized files in encoded mode; for "
                "raw pixels use --size N (or H,W)"
            )
        if self.quality is not None and self.max_side is None:
            raise OptionsError(
                f"{option_name('quality')} applies to images re-encoded because of --max-side; "
                "add --max-side (max_side=)"
            )
        if self.size is not None:
            # The sample shape is known: a chunk of 4 GiB or more is refused now.
            array_chunk_shape(
                (*self.size, self.channels),
                chunk_samples=self.chunk_samples,
                chunk_shape=self.chunk_shape,
                chunk_bytes=self.chunk_bytes,
            )

    @property
    def effective_workers(self) -> int:
        """The number of worker processes: ``workers``, or every available core."""
        return self.workers if self.workers is not None else available_cores()

    @property
    def target_chunk_bytes(self) -> int:
        """The byte target of one chunk: ``chunk_bytes`` or the default."""
        return self.chunk_bytes if self.chunk_bytes is not None else DEFAULT_CHUNK_BYTES

    def to_json(self) -> dict[str, Any]:
        """Return the options as JSON-ready data (stored in the pack)."""
        data = dataclasses.asdict(self)
        data["compression"] = dataclasses.asdict(self.compression)
        for key in ("size", "chunk_shape"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data
