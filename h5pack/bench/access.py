"""Access patterns over a pack, and what each one costs the storage.

Three orders of one epoch are measured through one dataset and loader (see the note "One
loader for every pattern" in ``h5pack.bench.loaders``):

- ``random``: a full shuffle, batches read through ``H5ImageDataset.__getitems__``;
- ``chunk``: h5pack's chunk-aware order (``ChunkBatchSampler``) through ``make_loader``;
- ``sequential``: pack order through ``make_loader``.

A fourth figure, ``naive``, is a bare h5py read of one sample at a time in a full shuffle
(what a hand-written ``Dataset.__getitem__`` does); it is labelled as such and is not a
basis of comparison.

What each order costs is counted by replaying it against the pack's chunk map and the
stored size of every HDF5 chunk (see the note "Replaying reads").

# NOTE [ Replaying reads ]
#
# Chunk loads (a chunk read whole, and decompressed when filtered) and bytes read are
# counted by replaying the access order against the cache of the path that serves it, not
# by sampling OS counters (which a warm page cache and other processes blur):
# - h5py per-sample reads use HDF5's chunk cache: ``rdcc_nbytes`` (1 MiB by default up to
#   HDF5 1.14, 8 MiB from 2.0) and ``rdcc_nslots`` hash slots (521, then 8191); a chunk
#   hashed to ``index % nslots`` evicts the chunk in its slot, and the least recently
#   used chunks leave when the bytes overflow.
#   A filtered chunk is read and decompressed whole on every miss, kept only if it fits;
#   an unfiltered chunk larger than the cache is bypassed (only the selection is read).
# - h5pack's reader keeps a first-in-first-out window of ``window_chunks`` decompressed
#   chunk groups per process and reads uncompressed samples as runs straight from the
#   file (see ``h5pack.read.reader``); each DataLoader worker has its own window and gets the
#   batches b with b mod W equal to its id.
# tests/test_bench.py checks the replay against ``PackReader.loads`` and against the reads
# h5py issues to a counting file object.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.bench.timing import Count
from h5pack.core import format as fmt
from h5pack.core.decode import Backend
from h5pack.core.format import ArrayStorage, SampleStorage
from h5pack.core.layout import ChunkMap, chunk_map_of, is_compressed
from h5pack.core.packset import is_packset
from h5pack.core.vocabulary import PATTERNS as PATTERNS  # re-exported
from h5pack.core.vocabulary import Pattern as Pattern
from h5pack.errors import OptionsError
from h5pack.read.crop import CropSpec
from h5pack.read.packset import PackSource, describe

NAIVE = "naive"
"""The bare h5py per-sample read, a labelled extra figure."""
PATTERN_TITLES = {
    "random": "full shuffle (h5pack loader)",
    "chunk": "chunk-aware (h5pack loader)",
    "sequential": "sequential (h5pack loader)",
    NAIVE: "naive h5py per-sample read",
}


def default_chunk_cache() -> tuple[int, int]:
    """Return ``(bytes, slots)`` of the chunk cache h5py gives a file opened without one.

    HDF5's defaults: 1 MiB and 521 slots up to 1.14, 8 MiB and 8191 slots from 2.0.
    """
    import h5py

    _, slots, nbytes, _ = h5py.h5p.create(h5py.h5p.FILE_ACCESS).get_cache()
    return int(nbytes), int(slots)


@dataclass(frozen=True)
class StorageLayout:
    """Where every sample lives among a pack's HDF5 chunks, for replaying reads.

    Attributes:
        storage: ``"array"`` or ``"blob"``.
        compressed: Whether the images pass through a filter.
        sample_start: Byte offset of each sample in the images dataset, flattened.
        sample_bytes: Stored (uncompressed) bytes of each sample.
        chunk_nbytes: Uncompressed bytes of one HDF5 chunk; 0 for a contiguous layout.
        row_nbytes: Bytes of the flattened images covered by one row of chunks (one chunk,
            unless array chunks split H, W or C); 0 for a contiguous layout.
        tiles: Chunks per row (array chunks that split H, W or C), else 1.
        stored_sizes: Stored (compressed) bytes of each HDF5 chunk, in chunk order.
        groups: The reader's chunk groups (``layout.chunk_map_of``).
        shard_starts: For a pack set, the first sample of each shard and the total
            (int64, shards + 1); None for a pack. A set's shards are laid end to end, each
            starting on a chunk row of its own, so chunk numbers never cross shards.
    """

    storage: str
    compressed: bool
    sample_start: np.ndarray
    sample_bytes: np.ndarray
    chunk_nbytes: int
    row_nbytes: int
    tiles: int
    stored_sizes: np.ndarray
    groups: ChunkMap
    shard_starts: np.ndarray | None = None

    @property
    def chunked(self) -> bool:
        """Whether the images dataset is chunked."""
        return self.chunk_nbytes > 0

    def chunks_of_sample(self, index: int) -> range:
        """Return the HDF5 chunks holding sample ``index`` (empty when contiguous)."""
        if not self.chunked:
            return range(0)
        if self.storage == "array" and self.tiles > 1:
            row = int(self.sample_start[index]) // self.row_nbytes
            return range(row * self.tiles, (row + 1) * self.tiles)
        return self.chunks_of_span(
            int(self.sample_start[index]),
            int(self.sample_start[index]) + int(self.sample_bytes[index]),
        )

    def chunks_of_span(self, begin: int, end: int) -> range:
        """Return the chunks covering bytes ``[begin, end)`` of the flattened images."""
        if end <= begin or not self.chunked:
            return range(0)
        return range(begin // self.row_nbytes, (end - 1) // self.row_nbytes + 1)


def storage_layout(
    source: PackSource, storage_options: Mapping[str, Any] | None = None
) -> StorageLayout:
    """Read the layout of a pack's (or a pack set's) images: sample offsets, chunk sizes.

    A URL's is read with ``storage_options`` (beyond the environment's).

    Raises:
        FileNotFoundError: the pack, or a shard, does not exist.
        FormatError: a file is not a pack, or a shard does not belong to the set.
        OptionsError: the shards of a set are chunked differently (``convert --shards``
            plans one layout for all).
    """
    if not is_packset(source):
        assert isinstance(source, str | os.PathLike)  # is_packset: one path
        return _file_layout(source, storage_options)
    view = describe(source, storage_options=storage_options)
    assert view.shards is not None  # a set's view
    parts = [_file_layout(shard.path, storage_options) for shard in view.shards]
    first = max(parts, key=lambda part: part.row_nbytes)
    row = first.row_nbytes
    for shard, part in zip(view.shards, parts, strict=True):
        same = (part.storage, part.tiles, part.compressed) == (
            first.storage,
            first.tiles,
            first.compressed,
        )
        # a shard of a single row of chunks (a blob shard shorter than one chunk has its
        # chunk cut to its length) fits any row size
        single_row = len(part.stored_sizes) <= part.tiles
        if not same or (part.row_nbytes != row and not single_row):
            raise OptionsError(
                f"{shard.path} is stored in chunks unlike the other shards' "
                f"({part.chunk_nbytes} bytes, not {first.chunk_nbytes}): the benchmarks "
                "measure sets whose shards share one layout, as convert --shards writes them"
            )
    starts, stored, offset = [], [], 0
    for part in parts:
        starts.append(part.sample_start + offset)
        stored.append(part.stored_sizes)
        if row:
            offset += max(1, len(part.stored_sizes) // max(1, part.tiles)) * row
        elif part.sample_start.size:
            offset += int(part.sample_start[-1] + part.sample_bytes[-1])
    counts = [part.sample_start.size for part in parts]
    return StorageLayout(
        storage=first.storage,
        compressed=first.compressed,
        sample_start=np.concatenate(starts),
        sample_bytes=np.concatenate([part.sample_bytes for part in parts]),
        chunk_nbytes=first.chunk_nbytes,
        row_nbytes=row,
        tiles=first.tiles,
        stored_sizes=np.concatenate(stored),
        groups=view.chunk_map,
        shard_starts=np.cumsum([0, *counts]).astype(np.int64),
    )


def _file_layout(path: StrPath, storage_options: Mapping[str, Any] | None) -> StorageLayout:
    """Read the layout of one pack file's images."""
    with fmt.open_h5(path, storage_options=storage_options) as handle:
        meta = fmt.read_meta(handle, os.fspath(path))
        images = handle[fmt.IMAGES]
        if meta.storage == "array":
            sample = int(np.prod(meta.images_shape[1:]))
            starts = np.arange(meta.num_samples, dtype=np.int64) * sample
            sizes = np.full(meta.num_samples, sample, dtype=np.int64)
        else:
            offsets, blob_sizes = meta.blob_slots()
            starts, sizes = offsets[:-1].copy(), blob_sizes.copy()
        chunk_nbytes = row_nbytes = 0
        tiles, stored = 1, np.zeros(0, dtype=np.int64)
        if meta.chunks is not None:
            shape, chunks = meta.images_shape, meta.chunks
            grid = [-(-s // c) for s, c in zip(shape, chunks, strict=True)]
            tiles = int(np.prod(grid[1:]))
            chunk_nbytes = int(np.prod(chunks))
            row_nbytes = int(np.prod(shape[1:])) * chunks[0]
            stored = np.zeros(int(np.prod(grid)), dtype=np.int64)

            def visit(info: object) -> None:
                offset = getattr(info, "chunk_offset")  # noqa: B009  (h5py StoreInfo)
                linear = 0
                for axis, start in enumerate(offset):
                    linear = linear * grid[axis] + int(start) // chunks[axis]
                stored[linear] = int(getattr(info, "size"))  # noqa: B009

            images.id.chunk_iter(visit)
    return StorageLayout(
        storage=meta.storage,
        compressed=is_compressed(meta),
        sample_start=starts,
        sample_bytes=sizes,
        chunk_nbytes=chunk_nbytes,
        row_nbytes=row_nbytes,
        tiles=tiles,
        stored_sizes=stored,
        groups=chunk_map_of(meta),
    )


@dataclass(frozen=True)
class ReadCount:
    """What an access order costs the storage.

    Attributes:
        samples: Samples delivered.
        chunk_loads: Chunks read whole (and decompressed, when filtered).
        bytes_read: Bytes read from the file (stored, compressed sizes).
    """

    samples: int
    chunk_loads: int
    bytes_read: int

    @property
    def chunks_per_sample(self) -> float:
        """Chunk loads per delivered sample."""
        return self.chunk_loads / self.samples if self.samples else 0.0

    @property
    def bytes_per_sample(self) -> float:
        """Bytes read per delivered sample."""
        return self.bytes_read / self.samples if self.samples else 0.0

    def __add__(self, other: ReadCount) -> ReadCount:
        return ReadCount(
            self.samples + other.samples,
            self.chunk_loads + other.chunk_loads,
            self.bytes_read + other.bytes_read,
        )


def replay_h5py(
    layout: StorageLayout,
    order: Sequence[int] | np.ndarray,
    *,
    cache_bytes: int | None = None,
    cache_slots: int | None = None,
) -> ReadCount:
    """Count the reads of h5py per-sample access in ``order`` (see "Replaying reads").

    ``cache_bytes`` and ``cache_slots`` default to h5py's (``default_chunk_cache``).
    """
    default_bytes, default_slots = default_chunk_cache()
    cache_bytes = default_bytes if cache_bytes is None else cache_bytes
    cache_slots = default_slots if cache_slots is None else cache_slots
    indices = np.asarray(order, dtype=np.int64).reshape(-1)
    if layout.shard_starts is not None:  # every shard file has a chunk cache of its own
        shard = np.searchsorted(layout.shard_starts, indices, side="right") - 1
        total = ReadCount(0, 0, 0)
        for number in np.unique(shard).tolist():
            part = replace(layout, shard_starts=None)
            total = total + _replay_h5py_file(
                part, indices[shard == number], cache_bytes, cache_slots
            )
        return total
    return _replay_h5py_file(layout, indices, cache_bytes, cache_slots)


def _replay_h5py_file(
    layout: StorageLayout, indices: np.ndarray, cache_bytes: int, cache_slots: int
) -> ReadCount:
    """``replay_h5py`` on one file (one chunk cache)."""
    if not layout.chunked:
        return ReadCount(indices.size, 0, int(layout.sample_bytes[indices].sum()))
    fits = layout.chunk_nbytes <= cache_bytes
    capacity = max(1, cache_bytes // layout.chunk_nbytes) if fits else 0
    cache: OrderedDict[int, None] = OrderedDict()  # least recently used first
    slots: dict[int, int] = {}
    loads = read = 0
    for i in indices.tolist():
        for chunk in layout.chunks_of_sample(i):
            if chunk in cache:
                cache.move_to_end(chunk)
                continue
            if not layout.compressed and not fits:
                # HDF5 reads the selection straight from the file, bypassing the cache.
                read += _overlap(layout, i, chunk)
                continue
            loads += 1
            read += int(layout.stored_sizes[chunk])
            if not fits:
                continue
            slot = chunk % cache_slots
            if slot in slots:
                cache.pop(slots.pop(slot), None)
            while len(cache) >= capacity:
                evicted, _ = cache.popitem(last=False)
                slots.pop(evicted % cache_slots, None)
            cache[chunk] = None
            slots[slot] = chunk
    return ReadCount(indices.size, loads, read)


def _overlap(layout: StorageLayout, index: int, chunk: int) -> int:
    """Bytes of sample ``index`` inside ``chunk`` (uncompressed)."""
    if layout.storage == "array" and layout.tiles > 1:
        return int(layout.sample_bytes[index]) // layout.tiles
    begin = int(layout.sample_start[index])
    end = begin + int(layout.sample_bytes[index])
    low, high = chunk * layout.row_nbytes, (chunk + 1) * layout.row_nbytes
    return max(0, min(end, high) - max(begin, low))


def replay_reader(
    layout: StorageLayout,
    batches: Sequence[np.ndarray],
    *,
    window_chunks: int,
    num_workers: int = 0,
) -> ReadCount:
    """Count the reads of h5pack's reader serving ``batches`` (see "Replaying reads").

    Args:
        layout: The pack's layout.
        batches: Batches in the order the DataLoader consumes them.
        window_chunks: Chunk groups each process keeps decompressed.
        num_workers: DataLoader workers; batch b is read by worker b mod W.
    """
    workers = max(1, num_workers)
    total = ReadCount(0, 0, 0)
    for worker in range(workers):
        total = total + _replay_one_reader(layout, batches[worker::workers], window_chunks)
    return total


def _replay_one_reader(
    layout: StorageLayout, batches: Sequence[np.ndarray], window_chunks: int
) -> ReadCount:
    groups = layout.groups
    window: OrderedDict[int, None] = OrderedDict()
    samples = loads = read = 0
    for batch in batches:
        idx = np.asarray(batch, dtype=np.int64)
        samples += idx.size
        if not layout.compressed:
            read += _run_bytes(layout, idx)
            continue
        owners = groups.chunks_of(idx)
        _, first = np.unique(owners, return_index=True)
        for group in owners[np.sort(first)].tolist():
            if group in window:
                continue
            lo, hi = int(groups.starts[group]), int(groups.starts[group + 1])
            chunks = _group_chunks(layout, lo, hi)
            loads += len(chunks)
            read += int(layout.stored_sizes[list(chunks)].sum()) if len(chunks) else 0
            window[group] = None
        while len(window) > max(1, window_chunks):
            window.popitem(last=False)
    return ReadCount(samples, loads, read)


def _group_chunks(layout: StorageLayout, lo: int, hi: int) -> range:
    """Return the HDF5 chunks read to load the samples ``lo .. hi - 1`` whole."""
    if layout.storage == "array" and layout.tiles > 1:
        first = layout.chunks_of_sample(lo)
        last = layout.chunks_of_sample(hi - 1)
        return range(first.start, last.stop)
    begin = int(layout.sample_start[lo])
    end = int(layout.sample_start[hi - 1]) + int(layout.sample_bytes[hi - 1])
    return layout.chunks_of_span(begin, end)


def _run_bytes(layout: StorageLayout, idx: np.ndarray) -> int:
    """Bytes read for uncompressed samples ``idx``: runs of consecutive indices."""
    unique = np.unique(idx)
    if unique.size == 0:
        return 0
    gaps = np.diff(unique) > 1
    if layout.shard_starts is not None:  # a run that crosses shards is two reads
        shard = np.searchsorted(layout.shard_starts, unique, side="right")
        gaps |= np.diff(shard) != 0
    breaks = np.flatnonzero(gaps) + 1
    total = 0
    for run in np.split(unique, breaks):
        lo, hi = int(run[0]), int(run[-1])
        end = int(layout.sample_start[hi]) + int(layout.sample_bytes[hi])
        total += end - int(layout.sample_start[lo])
    return total


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
