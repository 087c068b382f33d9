"""Chunk shapes, compression filters, chunk arithmetic and chunk-cache sizing.

Chunk arithmetic lives here so that the writer, the reader, the samplers and the
benchmarks cannot disagree about which samples live in which chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack.core.format import PackMeta
from h5pack.core.vocabulary import CODECS as CODECS  # re-exported
from h5pack.core.vocabulary import SHUFFLES as SHUFFLES
from h5pack.errors import FormatError, OptionsError

# HDF5 filter ids, as registered with The HDF Group (the plugin ones come from hdf5plugin),
# and what h5pack calls each; the direct chunk path and ``info`` both read this table.
FILTER_DEFLATE, FILTER_SHUFFLE, FILTER_BLOSC, FILTER_LZ4, FILTER_ZSTD = 1, 2, 32001, 32004, 32015
FILTER_NAMES: dict[int, str] = {
    FILTER_DEFLATE: "gzip",
    FILTER_SHUFFLE: "byte shuffle",
    3: "fletcher32",
    32000: "lzf",
    FILTER_BLOSC: "blosc",
    FILTER_LZ4: "lz4",
    32008: "bitshuffle",
    FILTER_ZSTD: "zstd",
    32026: "blosc2",
}
# Filters that only hdf5plugin provides, as ``info`` names them.
PLUGIN_FILTERS: dict[int, str] = {
    FILTER_BLOSC: "Blosc (hdf5plugin)",
    FILTER_LZ4: "LZ4 (hdf5plugin)",
    32008: "Bitshuffle (hdf5plugin)",
    FILTER_ZSTD: "Zstd (hdf5plugin)",
    32026: "Blosc2 (hdf5plugin)",
}

MAX_CHUNK_BYTES = 2**32 - 1  # HDF5 refuses chunks of 4 GiB or more
DEFAULT_CHUNK_BYTES = 8 * 2**20  # docs/ARCHITECTURE.md, "Chunk size"

# (lowest, highest, default) level per codec: a pack is written once and read every
# epoch, and decompression barely depends on the level (docs/decisions/0021).
LEVELS: dict[str, tuple[int, int, int]] = {
    "gzip": (0, 9, 4),
    "zstd": (1, 22, 3),
    "blosc-lz4": (0, 9, 9),
    "blosc-zstd": (0, 9, 3),
}


@dataclass(frozen=True, kw_only=True)
class Compression:
    """A compression choice: codec, level and shuffle, validated (``OptionsError``)."""

    codec: str = "none"
    level: int | None = None
    shuffle: str = "none"

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise OptionsError(
                f"compression should be one of {', '.join(CODECS)}, but got {self.codec!r}"
            )
        if self.shuffle not in SHUFFLES:
            raise OptionsError(
                f"shuffle should be one of {', '.join(SHUFFLES)}, but got {self.shuffle!r}"
            )
        if self.level is not None:
            if self.codec not in LEVELS:
                raise OptionsError(
                    f"--level applies to {', '.join(LEVELS)}, not to compression={self.codec!r}"
                )
            low, high, _ = LEVELS[self.codec]
            if not low <= self.level <= high:
                raise OptionsError(
                    f"level for {self.codec} should be in {low}..{high}, but got level={self.level}"
                )
        if self.codec == "none" and self.shuffle != "none":
            raise OptionsError("shuffle needs a compression codec; add --compression")
        if self.shuffle == "bit" and self.codec in ("gzip", "lzf"):
            raise OptionsError(
                f"bit shuffle applies to lz4, zstd and blosc codecs, not {self.codec}; "
                "use --shuffle-filter byte or another codec"
            )

    @property
    def effective_level(self) -> int | None:
        """The level used: the given one, or the codec's default."""
        if self.codec not in LEVELS:
            return None
        return self.level if self.level is not None else LEVELS[self.codec][2]

    def h5py_kwargs(self) -> dict[str, Any]:
        """Return the ``create_dataset`` keyword arguments for this compression."""
        if self.codec == "none":
            return {}
        import hdf5plugin

        level = self.effective_level
        byte_shuffle = self.shuffle == "byte"
        if self.codec == "gzip":
            return {"compression": "gzip", "compression_opts": level, "shuffle": byte_shuffle}
        if self.codec == "lzf":
            return {"compression": "lzf", "shuffle": byte_shuffle}
        cname: Any = self.codec.removeprefix("blosc-")
        if self.codec in ("lz4", "zstd"):
            if self.shuffle == "bit":
                return dict(hdf5plugin.Bitshuffle(cname=cname, clevel=level or 3))
            plugin = hdf5plugin.LZ4() if self.codec == "lz4" else hdf5plugin.Zstd(clevel=level or 3)
            return {**dict(plugin), "shuffle": byte_shuffle}
        blosc = hdf5plugin.Blosc
        shuffle = {"none": blosc.NOSHUFFLE, "byte": blosc.SHUFFLE, "bit": blosc.BITSHUFFLE}
        return dict(blosc(cname=cname, clevel=level or 0, shuffle=shuffle[self.shuffle]))

    def describe(self) -> str:
        """Return a short human description, e.g. ``"zstd level 3, bit shuffle"``."""
        if self.codec == "none":
            return "none"
        level = self.effective_level
        shuffle = f", {self.shuffle} shuffle" if self.shuffle != "none" else ""
        return self.codec + (f" level {level}" if level is not None else "") + shuffle


def chunk_samples_for(sample_bytes: int, chunk_bytes: int) -> int:
    """Return how many samples of ``sample_bytes`` fit a chunk of ``chunk_bytes`` (at least 1)."""
    if sample_bytes <= 0 or chunk_bytes <= 0:
        raise OptionsError(
            f"sizes should be positive, but got sample_bytes={sample_bytes}, "
            f"chunk_bytes={chunk_bytes}"
        )
    return max(1, chunk_bytes // sample_bytes)


def array_chunk_shape(
    sample_shape: Sequence[int],
    *,
    chunk_samples: int | None = None,
    chunk_shape: Sequence[int] | None = None,
    chunk_bytes: int | None = None,
) -> tuple[int, ...]:
    """Return the chunk shape of an (N, H, W, C) uint8 array (``chunk_shape``, samples or bytes)."""
    sample_shape = tuple(int(s) for s in sample_shape)
    if chunk_shape is not None:
        shape = tuple(int(s) for s in chunk_shape)
        if len(shape) != len(sample_shape) + 1:
            raise OptionsError(
                f"chunk shape should have {len(sample_shape) + 1} dimensions "
                f"(samples, {', '.join('HWC'[: len(sample_shape)])}), but got {shape}"
            )
        if any(s <= 0 for s in shape):
            raise OptionsError(f"chunk shape should be positive, but got {shape}")
        if any(c > s for c, s in zip(shape[1:], sample_shape, strict=True)):
            raise OptionsError(
                f"chunk shape {shape} is larger than one sample {sample_shape} in H, W or C"
            )
    else:
        if chunk_samples is None:
            sample_bytes = math.prod(sample_shape)
            chunk_samples = chunk_samples_for(sample_bytes, chunk_bytes or DEFAULT_CHUNK_BYTES)
        if chunk_samples <= 0:
            raise OptionsError(
                f"chunk_samples should be positive, but got chunk_samples={chunk_samples}"
            )
        shape = (chunk_samples, *sample_shape)
    check_chunk_bytes(math.prod(shape))
    return shape


def check_chunk_bytes(nbytes: int) -> None:
    """Raise ``OptionsError`` unless ``nbytes`` is a valid HDF5 chunk size."""
    if nbytes <= 0:
        raise OptionsError(f"chunk size should be positive, but got {nbytes} bytes")
    if nbytes > MAX_CHUNK_BYTES:
        raise OptionsError(
            f"a chunk of {nbytes / 2**30:.1f} GiB exceeds HDF5's 4 GiB limit; "
            "use fewer samples per chunk (--chunk-samples or --chunk-bytes)"
        )


@dataclass(frozen=True)
class ChunkMap:
    """Which samples live in which chunk: group ``g`` holds ``starts[g] .. starts[g + 1] - 1``.

    A chunk of a chunked array; for an aligned blob, the samples whose slots start in one
    chunk; for a contiguous layout, a run of about one chunk's bytes.
    """

    starts: np.ndarray

    @classmethod
    def regular(cls, num_samples: int, chunk_samples: int) -> ChunkMap:
        """Return the map of ``num_samples`` samples in chunks of ``chunk_samples``."""
        if chunk_samples <= 0:
            raise OptionsError(
                f"chunk_samples should be positive, but got chunk_samples={chunk_samples}"
            )
        starts = np.arange(0, num_samples + chunk_samples, chunk_samples, dtype=np.int64)
        starts[-1] = num_samples
        return cls(np.unique(starts))  # drops the duplicate end when chunk_samples divides N

    @classmethod
    def for_blob(cls, offsets: np.ndarray, chunk_bytes: int) -> ChunkMap:
        """Return the map of a blob whose sample slots start at ``offsets[:-1]``."""
        offsets = np.asarray(offsets, dtype=np.int64)
        num_samples = len(offsets) - 1
        if num_samples <= 0:
            return cls(np.zeros(1, dtype=np.int64))
        new_group = np.flatnonzero(np.diff(offsets[:-1] // chunk_bytes)) + 1
        return cls(np.concatenate(([0], new_group, [num_samples])).astype(np.int64))

    @property
    def num_chunks(self) -> int:
        """Number of groups."""
        return len(self.starts) - 1

    @property
    def num_samples(self) -> int:
        """Number of samples covered."""
        return int(self.starts[-1])

    def samples(self, chunk: int) -> range:
        """Return the sample indices of group ``chunk``."""
        return range(int(self.starts[chunk]), int(self.starts[chunk + 1]))

    def sizes(self) -> np.ndarray:
        """Return the number of samples in each group."""
        return np.diff(self.starts)

    def chunk_of(self, index: int) -> int:
        """Return the group holding sample ``index``."""
        return int(np.searchsorted(self.starts, index, side="right")) - 1

    def chunks_of(self, indices: np.ndarray) -> np.ndarray:
        """Return the group holding each of ``indices``."""
        return np.searchsorted(self.starts, indices, side="right") - 1


def _run_samples(meta: PackMeta) -> tuple[int, int]:
    """``(sample_bytes, samples)`` of one run of a contiguous array pack."""
    sample_bytes = int(np.prod(meta.images_shape[1:]))
    return sample_bytes, chunk_samples_for(max(1, sample_bytes), DEFAULT_CHUNK_BYTES)


def chunk_map_of(meta: PackMeta) -> ChunkMap:
    """Return the groups of samples read together: HDF5 chunks, or runs of a contiguous pack."""
    if meta.storage == "array":
        per_group = meta.chunks[0] if meta.chunks is not None else _run_samples(meta)[1]
        return ChunkMap.regular(meta.num_samples, per_group)
    if meta.offsets is None:
        raise FormatError(f"{meta.path}: blob storage without offsets")
    group = meta.chunks[0] if meta.chunks is not None else DEFAULT_CHUNK_BYTES
    return ChunkMap.for_blob(meta.offsets, group)


def group_bytes(meta: PackMeta) -> int:
    """Return the uncompressed bytes of one read group: a chunk, or a contiguous pack's run."""
    if meta.chunks is not None:
        return int(np.prod(meta.chunks))
    if meta.storage == "array":
        sample_bytes, samples = _run_samples(meta)
        return sample_bytes * samples
    return DEFAULT_CHUNK_BYTES


def is_compressed(meta: PackMeta) -> bool:
    """Return whether the pack's images pass through an HDF5 filter."""
    return bool(meta.filter_ids)


def next_prime(n: int) -> int:
    """Return the smallest prime >= n."""
    n = max(2, n)
    while any(n % d == 0 for d in range(2, math.isqrt(n) + 1)):
        n += 1
    return n


def cache_settings(
    *, compressed: bool, window_chunks: int, chunk_bytes: int
) -> dict[str, int | float]:
    """Return ``h5py.File`` chunk-cache arguments: none uncompressed, else room for the window."""
    if not compressed:
        return {"rdcc_nbytes": 0, "rdcc_nslots": 1, "rdcc_w0": 1.0}
    window_chunks = max(1, window_chunks)
    return {
        "rdcc_nbytes": int(window_chunks * chunk_bytes * 1.05) + 2**20,
        "rdcc_nslots": next_prime(100 * window_chunks),
        "rdcc_w0": 1.0,
    }


def checked_indices(
    indices: Sequence[int] | np.ndarray, num_samples: int, what: str = "a pack"
) -> np.ndarray:
    """Return ``indices`` as int64, negative ones from the end (``IndexError`` naming ``what``)."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    n = num_samples
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise IndexError(f"index {bad} is out of range for {what} of {n} samples")
    return np.where(idx < 0, idx + n, idx)


def describe_codec(meta: PackMeta) -> str:
    """Return the pack's compression as ``info`` words it (``"none"`` without)."""
    recorded = meta.options.get("compression")
    if isinstance(recorded, dict):
        try:
            compression = Compression(**recorded)
        except (OptionsError, TypeError):
            pass
        else:
            if compression.codec != "none" or not meta.filter_ids:
                return compression.describe()
    if not meta.filter_ids:
        return "none"
    return " + ".join(FILTER_NAMES.get(i, f"filter {i}") for i in meta.filter_ids)
