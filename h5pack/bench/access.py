"""Access patterns over a pack, and what each one costs the storage.

Three orders of one epoch are measured through one dataset and loader (see "One loader
for every pattern" in ``h5pack.bench.loaders``): ``random`` (a full shuffle), ``chunk``
(``ChunkBatchSampler``'s order) and ``sequential`` (pack order).

# NOTE [ Chunk work per sample ]
#
# What an order costs the storage is counted from the pack's shape, not replayed: a chunk
# of k samples read in the chunk-aware order or in pack order is loaded once an epoch (1/k
# loads per sample); a full shuffle served from a window of W of the C chunks finds a
# sample's chunk there with probability about W / C, so it loads ~max(1/k, 1 - W/C) chunks
# per sample. An uncompressed pack is read straight from the file, sample by sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from h5pack.core.store import Store, open_store
from h5pack.core.vocabulary import PATTERNS as PATTERNS  # re-exported
from h5pack.core.vocabulary import Pattern as Pattern
from h5pack.errors import OptionsError
from h5pack.read.packset import PackSource, describe

PATTERN_TITLES = {
    "random": "full shuffle (h5pack loader)",
    "chunk": "chunk-aware (h5pack loader)",
    "sequential": "sequential (h5pack loader)",
}


@dataclass(frozen=True)
class ReadCount:
    """What an access order costs the storage (see "Chunk work per sample")."""

    samples: int  # delivered
    chunk_loads: float  # chunks read whole (and decompressed, when filtered)
    bytes_read: float  # from the file (stored sizes)

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
    """What the chunk work of a pack (a set: all its shards) depends on."""

    num_samples: int
    num_chunks: int  # 0 when contiguous
    compressed: bool
    file_bytes: int

    def reads(self, pattern: str, samples: int, *, window_chunks: int = 0) -> ReadCount:
        """Return the cost of ``samples`` read by ``pattern`` with a window of chunks."""
        if self.num_chunks <= 0 or not self.compressed:  # read as runs of samples
            return ReadCount(samples, 0.0, samples * self.file_bytes / max(1, self.num_samples))
        per_chunk = self.num_samples / self.num_chunks
        loads = samples * loads_per_sample(pattern, self.num_chunks, per_chunk, window_chunks)
        return ReadCount(samples, loads, loads * self.file_bytes / self.num_chunks)


def pack_shape(source: PackSource, store: Store | None = None) -> PackShape:
    """Return the shape of a pack or pack set (read from ``store``; None: ``open_store``)."""
    from h5pack.bench.system import pack_files, source_bytes
    from h5pack.check import pack_info

    store = store or open_store(source)
    info = pack_info(pack_files(source, store)[0], store=store)  # shards share one layout
    chunk_map = describe(source, store=store).chunk_map
    chunked = info.layout != "contiguous"
    return PackShape(
        num_samples=chunk_map.num_samples,
        num_chunks=chunk_map.num_chunks if chunked else 0,
        compressed=info.codec != "none",
        file_bytes=source_bytes(source, store),
    )


def random_order(num_samples: int, *, seed: int, epoch: int = 0) -> np.ndarray:
    """Return a full shuffle of ``num_samples`` indices, a pure function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 7]).permutation(num_samples)


def check_pattern(pattern: str) -> Pattern:
    """Return ``pattern`` if it is a known access pattern, else raise ``OptionsError``."""
    if pattern not in PATTERNS:
        raise OptionsError(f"order should be one of {', '.join(PATTERNS)}, but got {pattern!r}")
    return pattern
