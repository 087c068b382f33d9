"""Chunks decompressed per sample as a large pack would meet them (``compare --dataset-size``).

# NOTE [ Why the gain is invisible on small data ]
#
# A pack that fits in the shuffle window is all in the window: a full shuffle then reads
# each chunk once, as the chunk-aware order does, and ``compare`` measures no difference
# between them (issue 20: "random" at or above "chunk-aware" on a 302-photo folder). A
# training set does not fit: with C chunks of k samples, a worker keeping W of them
# decompressed (the window ``make_loader`` gives a pack that size by default, at least the
# pool floor) serves a full shuffle from its window with probability about W / C per
# sample, so it decompresses ~1 - W / C chunks per sample, against 1 / k for the
# chunk-aware order (each chunk once an epoch) and for pack order. A bare h5py read has
# h5py's chunk cache (1 MiB, 8 MiB from HDF5 2.0), which holds no chunk larger. These
# are counts of work, not rates: how much time a chunk costs is what ``compare`` measures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from h5pack.bench.access import h5py_cache_bytes, loads_per_sample
from h5pack.bench.options import CompareOptions
from h5pack.bench.ranking import VariantResult
from h5pack.errors import OptionsError

IMAGENET_TRAIN = 1_281_167
"""The default size projected to: ImageNet-1k's training set."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_UNIT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_dataset_size(text: str) -> int:
    """Return a sample count from ``"1281167"``, ``"500k"`` or ``"1.28M"``.

    Raises:
        OptionsError: not a positive count.

    Example:
        >>> parse_dataset_size("1.28M")
        1280000
    """
    match = _SIZE.match(text)
    value = float(match[1]) * _UNIT[match[2].lower()] if match else 0.0
    if value < 1:
        raise OptionsError(
            "--dataset-size (dataset_size=) should be a positive number of samples, e.g. "
            f"1281167, 500k or 1.28M, but got {text!r}"
        )
    return round(value)


@dataclass(frozen=True, kw_only=True)
class ScaleProjection:
    """One variant's chunk work per sample at ``num_samples`` (see the note above).

    Attributes:
        name: The variant.
        num_samples: The dataset size projected to.
        num_chunks: Its chunks at the variant's samples per chunk.
        window_chunks: Chunks one worker keeps decompressed (``make_loader``'s default).
        chunks_per_sample: Chunks decompressed per sample, by access pattern (``random``,
            ``chunk``, ``sequential``, ``naive``).
    """

    name: str
    num_samples: int
    num_chunks: int
    window_chunks: int
    chunks_per_sample: dict[str, float]

    @property
    def gain(self) -> float:
        """How many times fewer chunks the chunk-aware order decompresses than a full shuffle."""
        chunk = self.chunks_per_sample["chunk"]
        return self.chunks_per_sample["random"] / chunk if chunk > 0 else math.inf


def project(
    variant: VariantResult,
    num_samples: int,
    *,
    batch_size: int,
    workers: int,
    machine_bytes: int | None = None,
) -> ScaleProjection | None:
    """Return ``variant``'s chunk work per sample at ``num_samples``; None when contiguous.

    Args:
        variant: A measured variant (its chunk shape and chunk bytes are used).
        num_samples: The dataset size to project to.
        batch_size: Samples per batch (for the pool floor of the window).
        workers: DataLoader workers (0: the main process).
        machine_bytes: The machine's memory (the window's cap); default this machine's.
    """
    from h5pack.training.sampler import window_for  # torch: not when bench is imported

    per_chunk = variant.samples_per_chunk
    if variant.layout == "contiguous" or per_chunk <= 0 or variant.chunk_bytes <= 0:
        return None
    num_chunks = max(1, math.ceil(num_samples / per_chunk))
    window = window_for(
        window_chunks=None,
        window_bytes=None,
        group_bytes=variant.chunk_bytes,
        num_workers=workers,
        batch_size=batch_size,
        chunk_samples=per_chunk,
        num_chunks=num_chunks,
        machine_bytes=machine_bytes,
    )
    windows = {"naive": h5py_cache_bytes() // variant.chunk_bytes}
    return ScaleProjection(
        name=variant.name,
        num_samples=num_samples,
        num_chunks=num_chunks,
        window_chunks=window,
        chunks_per_sample={
            pattern: loads_per_sample(pattern, num_chunks, per_chunk, windows.get(pattern, window))
            for pattern in ("random", "chunk", "sequential", "naive")
        },
    )


def projections_of(
    ranked: Sequence[VariantResult], options: CompareOptions
) -> tuple[ScaleProjection, ...]:
    """Return each chunked variant's chunk work per sample at the dataset size.

    See the note "Why the gain is invisible on small data" in ``bench.scale``.
    """
    largest = max((v.num_samples for v in ranked), default=0)
    size = options.dataset_size or max(IMAGENET_TRAIN, largest)
    found = []
    for variant in ranked:
        measured = variant.patterns.get("chunk")
        workers = measured.workers if measured is not None else 0
        projection = project(variant, size, batch_size=options.measure.batch_size, workers=workers)
        if projection is not None:
            found.append(projection)
    return tuple(found)
