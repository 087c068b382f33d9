"""Access patterns over a pack, and what each one costs the storage.

Three orders of one epoch are measured through one dataset and loader (see the note "One
loader for every pattern" in ``h5pack.bench.loaders``):

- ``random``: a full shuffle, batches read through ``H5ImageDataset.__getitems__``;
- ``chunk``: h5pack's chunk-aware order (``ChunkBatchSampler``) through ``make_loader``;
- ``sequential``: pack order through ``make_loader``.

A fourth figure, ``naive``, is a bare h5py read of one sample at a time in a full shuffle
(what a hand-written ``Dataset.__getitem__`` does); it is labelled as such and is not a
basis of comparison.

# NOTE [ Chunk work per sample ]
#
# What an order costs the storage is counted from the pack's shape, not replayed: a chunk
# of k samples read in the chunk-aware order or in pack order is loaded once an epoch (1/k
# loads per sample); a full shuffle served from a window of W of the C chunks finds a
# sample's chunk there with probability about W / C, so it loads ~max(1/k, 1 - W/C) chunks
# per sample. The window is the loader's per-process window, or for a bare h5py read
# h5py's chunk cache (the chunks of ``rdcc_nbytes`` or fewer it holds; none when one chunk
# is larger). An uncompressed pack is read straight from the file, sample by sample: no
# chunk is loaded whole (except by h5py, whose cache holds chunks that fit). The same
# counts at a training set's size are ``compare``'s projection (``bench.scale``).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from h5pack.bench.timing import Count
from h5pack.core import format as fmt
from h5pack.core.decode import Backend
from h5pack.core.format import ArrayStorage, SampleStorage
from h5pack.core.packset import is_packset
from h5pack.core.store import Store, open_store
from h5pack.core.vocabulary import PATTERNS as PATTERNS  # re-exported
from h5pack.core.vocabulary import Pattern as Pattern
from h5pack.errors import OptionsError
from h5pack.read.crop import CropSpec
from h5pack.read.packset import PackSource, describe

NAIVE = "naive"
"""The bare h5py per-sample read, a labelled extra figure."""
MEASURED: tuple[str, ...] = (*PATTERNS, NAIVE)
"""Everything ``measure_pack`` can measure: the loader's patterns and the naive read."""
PATTERN_TITLES = {
    "random": "full shuffle (h5pack loader)",
    "chunk": "chunk-aware (h5pack loader)",
    "sequential": "sequential (h5pack loader)",
    NAIVE: "naive h5py per-sample read",
}


def h5py_cache_bytes() -> int:
    """Return the chunk cache h5py gives a dataset of a file opened without one.

    HDF5's default: 1 MiB up to 1.14, 8 MiB from 2.0.
    """
    import h5py

    return int(h5py.h5p.create(h5py.h5p.FILE_ACCESS).get_cache()[2])


@dataclass(frozen=True)
class ReadCount:
    """What an access order costs the storage (see "Chunk work per sample").

    Attributes:
        samples: Samples delivered.
        chunk_loads: Chunks read whole (and decompressed, when filtered).
        bytes_read: Bytes read from the file (stored sizes).
    """

    samples: int
    chunk_loads: float
    bytes_read: float

    @property
    def chunks_per_sample(self) -> float:
        """Chunk loads per delivered sample."""
        return self.chunk_loads / self.samples if self.samples else 0.0

    @property
    def bytes_per_sample(self) -> float:
        """Bytes read per delivered sample."""
        return self.bytes_read / self.samples if self.samples else 0.0


def loads_per_sample(pattern: str, num_chunks: int, per_chunk: float, window: int) -> float:
    """Chunks loaded per sample by ``pattern`` with a window of ``window`` chunks.

    Example:
        >>> loads_per_sample("random", 100, 10.0, 25), loads_per_sample("chunk", 100, 10.0, 25)
        (0.75, 0.1)
    """
    once = 1.0 / per_chunk if per_chunk > 0 else 1.0
    if pattern in ("chunk", "sequential") or num_chunks <= 0:
        return once
    return max(once, 1.0 - min(window, num_chunks) / num_chunks)


@dataclass(frozen=True, kw_only=True)
class PackShape:
    """What the chunk work of a pack depends on (see "Chunk work per sample").

    Attributes:
        num_samples: Samples in the pack (a set: in all its shards).
        num_chunks: Its chunk groups (0 when contiguous).
        chunk_bytes: Uncompressed bytes of one chunk (0 when contiguous).
        compressed: Whether its images pass through a filter.
        file_bytes: Its size (every shard's).
    """

    num_samples: int
    num_chunks: int
    chunk_bytes: int
    compressed: bool
    file_bytes: int

    def reads(self, pattern: str, samples: int, *, window_chunks: int = 0) -> ReadCount:
        """Return the cost of ``samples`` read by ``pattern`` (``naive``: h5py's cache)."""
        sample_bytes = self.file_bytes / max(1, self.num_samples)
        if self.num_chunks <= 0:
            return ReadCount(samples, 0.0, samples * sample_bytes)
        stored = self.file_bytes / self.num_chunks
        window = window_chunks
        if pattern == NAIVE:
            window = h5py_cache_bytes() // max(1, self.chunk_bytes)
            if not self.compressed and window == 0:  # HDF5 reads the selection alone
                return ReadCount(samples, 0.0, samples * sample_bytes)
        elif not self.compressed:  # the reader reads uncompressed samples as runs
            return ReadCount(samples, 0.0, samples * sample_bytes)
        per_chunk = self.num_samples / self.num_chunks
        loads = samples * loads_per_sample(pattern, self.num_chunks, per_chunk, window)
        return ReadCount(samples, loads, loads * stored)


def pack_shape(source: PackSource, store: Store | None = None) -> PackShape:
    """Return the shape of a pack or pack set (read from ``store``; None: ``open_store``)."""
    from h5pack.bench.system import pack_files, source_bytes
    from h5pack.check import pack_info

    # a set's shards share one layout
    store = store or open_store(source)
    info = pack_info(pack_files(source, store)[0], store=store)
    chunk_map = describe(source, store=store).chunk_map
    chunked = info.layout != "contiguous"
    return PackShape(
        num_samples=chunk_map.num_samples,
        num_chunks=chunk_map.num_chunks if chunked else 0,
        chunk_bytes=info.chunk_bytes if chunked else 0,
        compressed=info.codec != "none",
        file_bytes=source_bytes(source, store),
    )


def random_order(num_samples: int, *, seed: int, epoch: int = 0) -> np.ndarray:
    """Return a full shuffle of ``num_samples`` indices, a pure function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 7]).permutation(num_samples)


def read_per_sample(
    path: PackSource,
    order: Sequence[int] | np.ndarray,
    *,
    budget_s: float | None = None,
    min_samples: int = 8,
    backend: Backend = "pillow",
    crop: CropSpec | None = None,
    seed: int = 0,
) -> Count:
    """Read samples one by one in ``order`` with h5py and its default chunk cache.

    This is what a naive ``Dataset.__getitem__`` does: one h5py selection per sample, then
    the decode of an encoded sample, then (with ``crop``) the crop and resize of the whole
    decoded image. The file is opened afresh, so HDF5's cache starts empty; a pack set's
    shards are opened as their samples come up and stay open (at most ``MAX_NAIVE_OPEN``).

    Args:
        path: The pack, or a pack set.
        order: Sample indices to read, in order.
        budget_s: Stop after this many seconds (once ``min_samples`` are read); the rate of
            per-sample reads does not change over an epoch, so a prefix measures it.
        min_samples: Samples read at least, whatever the budget.
        backend: Decoder of encoded samples.
        crop: The training read's crop, applied to each decoded image (epoch 0's boxes).
        seed: Seed of the crops.

    Returns:
        The images read and their decoded bytes.
    """
    from h5pack.core.decode import decode_image
    from h5pack.read.crop import crop_array, plan_crop

    indices = np.asarray(order, dtype=np.int64).reshape(-1).tolist()
    images = nbytes = 0
    layouts: dict[int, SampleStorage] = {}  # each pack's, built once
    started = time.perf_counter()
    with _Files(path) as files:
        for index in indices:
            meta, dataset, i = files.locate(index)
            layout = layouts.setdefault(id(meta), meta.sample_storage)
            if isinstance(layout, ArrayStorage):
                pixels: np.ndarray = dataset[i]
            else:
                begin, size = layout.slot(i)
                stored = dataset[begin : begin + size]
                if meta.mode == "raw":
                    pixels = stored.reshape(tuple(int(s) for s in meta.shapes[i]))
                else:
                    pixels = decode_image(
                        stored.tobytes(),
                        name=f"{meta.path}[{i}]",
                        backend=backend,
                        channels=meta.channels,
                    )
            if crop is not None:
                box, flip = plan_crop(crop, *pixels.shape[:2], seed=seed, epoch=0, index=index)
                pixels = crop_array(pixels, box, crop.size, flip=flip, backend=backend)
            images += 1
            nbytes += pixels.nbytes
            if (
                budget_s is not None
                and images >= min_samples
                and time.perf_counter() - started > budget_s
            ):
                break
    return Count(images, nbytes)


# Shard files ``read_per_sample`` keeps open at once over a pack set.
MAX_NAIVE_OPEN = 64


class _Files:
    """The open files of a pack or pack set for ``read_per_sample``: global index -> file."""

    def __init__(self, source: PackSource) -> None:
        if is_packset(source):
            view = describe(source)
            assert view.shards is not None
            self.paths = [shard.path for shard in view.shards]
            counts = [shard.num_samples for shard in view.shards]
        else:
            assert isinstance(source, str | os.PathLike)
            self.paths = [Path(source)]
            counts = [-1]
        self.starts = np.cumsum([0, *counts[:-1]])
        self.open: OrderedDict[int, tuple[Any, fmt.PackMeta, Any]] = OrderedDict()

    def locate(self, index: int) -> tuple[fmt.PackMeta, Any, int]:
        """Return the metadata and images dataset of sample ``index``'s file, and its index."""
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        if shard not in self.open:
            handle = fmt.open_h5(self.paths[shard])
            meta = fmt.read_meta(handle, os.fspath(self.paths[shard]))
            self.open[shard] = (handle, meta, handle[fmt.IMAGES])
            while len(self.open) > MAX_NAIVE_OPEN:
                self.open.popitem(last=False)[1][0].close()
        self.open.move_to_end(shard)
        _, meta, dataset = self.open[shard]
        return meta, dataset, index - int(self.starts[shard])

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle, _, _ in self.open.values():
            handle.close()
        self.open.clear()


def check_pattern(pattern: str) -> Pattern:
    """Return ``pattern`` if it is a known access pattern.

    Raises:
        OptionsError: an unknown pattern.
    """
    if pattern not in PATTERNS:
        raise OptionsError(f"order should be one of {', '.join(PATTERNS)}, but got {pattern!r}")
    return pattern
