"""Which cached chunk to drop: the known future (Belady's rule) or the least recently used.

NOTE [ Evicting by the known future ]

A loader's sampler knows every epoch's chunk order before the epoch starts (``plan_epoch``
is a pure function of the seed and the epoch), so the disk cache knows when each chunk is
needed next. Belady's rule, evict the chunk whose next use is farthest away, is then
optimal: in steady state each chunk is used once per epoch, and a chunk just used is
needed again only next epoch, later than every chunk still to come in this one. With a
budget of a fraction ``f`` of the pack, the chunks kept at the end of an epoch are those
needed first in the next one and are all hit, so an epoch downloads ``(1 - f)`` of the
pack. A least-recently-used cache keeps exactly the chunks used last, which a new random
order needs at uniformly random times, and evicts each before its use: it re-downloads
nearly everything every epoch.

A future is a :class:`Future`: the times at which chunks are used, in *epochs* (epoch
``e`` plus the fraction of that epoch's batches before the use), so that futures of
several loaders on one machine (ranks, workers, a second job) are comparable: each is
measured from its own owner's ``now``. A chunk no live future names has an unknown next
use; among those the least recently used goes first. The new chunk takes part in the
choice: when every chunk that would have to go is needed sooner than it, it is not cached
at all (the bytes are still served from memory).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from h5pack._types import parse_choice
from h5pack.errors import OptionsError

__all__ = [
    "EVICTION_POLICIES",
    "EvictionPolicy",
    "Future",
    "choose_victims",
    "next_uses",
    "parse_policy",
]

EvictionPolicy = Literal["belady", "lru"]
EVICTION_POLICIES: tuple[EvictionPolicy, ...] = ("belady", "lru")


def parse_policy(value: str) -> EvictionPolicy:
    """Return ``value`` as an :data:`EvictionPolicy` (``OptionsError`` when it is none)."""
    policy = parse_choice(value, EVICTION_POLICIES)
    if policy is None:
        raise OptionsError(
            f"eviction should be one of {', '.join(EVICTION_POLICIES)}, but got eviction={value!r}"
        )
    return policy


@dataclass(frozen=True)
class Future:
    """When a loader uses which chunk of one pack: ``chunks[i]`` at ``times[i]`` (epochs).

    Attributes:
        chunks: Chunk indices (int64), one entry per use, in the order of ``times``.
        times: Time of each use in epochs (float64, non-decreasing).
    """

    chunks: np.ndarray
    times: np.ndarray

    def __post_init__(self) -> None:
        if len(self.chunks) != len(self.times):
            raise ValueError(
                f"a future should have one time per chunk, but got {len(self.chunks)} chunks "
                f"and {len(self.times)} times"
            )

    @classmethod
    def of(cls, chunks: Iterable[int], times: Iterable[float]) -> Future:
        """Return the future of the uses ``chunks`` at ``times``, sorted by time."""
        chunk_array = np.asarray(list(chunks), dtype=np.int64)
        time_array = np.asarray(list(times), dtype=np.float64)
        order = np.argsort(time_array, kind="stable")
        return cls(chunk_array[order], time_array[order])

    def to_bytes(self) -> bytes:
        """Return the future as bytes (for the cache's shared table)."""
        return self.chunks.astype("<i8").tobytes() + self.times.astype("<f8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> Future:
        """Return the future ``to_bytes`` wrote."""
        count = len(data) // 16
        chunks = np.frombuffer(data, dtype="<i8", count=count).astype(np.int64)
        times = np.frombuffer(data, dtype="<f8", count=count, offset=8 * count)
        return cls(chunks, times.astype(np.float64))


def next_uses(futures: Iterable[tuple[Future, float]]) -> dict[int, float]:
    """Return each chunk's distance (epochs) to its next use after its future's ``now``.

    Args:
        futures: ``(future, now)`` pairs of one pack; the nearest use over all of them wins.
    """
    found: dict[int, float] = {}
    for future, now in futures:
        later = future.times > now
        chunks, first = np.unique(future.chunks[later], return_index=True)
        distances = future.times[later][first] - now
        for chunk, distance in zip(chunks.tolist(), distances.tolist(), strict=True):
            if distance < found.get(chunk, math.inf):
                found[chunk] = distance
    return found


@dataclass(frozen=True)
class Candidate:
    """A cached chunk that could be evicted.

    Attributes:
        pack: The pack's cache key.
        chunk: The chunk's index in its pack.
        nbytes: Bytes it takes in the cache.
        used: The cache's clock at its last use (larger: more recent).
    """

    pack: str
    chunk: int
    nbytes: int
    used: int


def _key(
    policy: EvictionPolicy, distance: float | None, used: int
) -> tuple[float, float]:  # larger: evicted first
    if policy == "lru" or distance is None:
        return (math.inf if policy == "belady" else 0.0, -used)
    return (distance, -used)


def choose_victims(
    candidates: Iterable[Candidate],
    *,
    need_bytes: int,
    new_distance: float | None,
    new_used: int,
    distances: Mapping[str, Mapping[int, float]],
    policy: EvictionPolicy,
) -> list[Candidate] | None:
    """Return the chunks to evict so that ``need_bytes`` more fit, or None: do not cache.

    Candidates are taken farthest-first (Belady: the next use farthest away, chunks of
    unknown future first, least recently used among equals; LRU: least recently used)
    while they rank above the new chunk itself; if they do not free enough, the new chunk
    is the one that should not be kept.

    Args:
        candidates: The cached chunks that may go (complete ones, not claims in progress).
        need_bytes: Bytes to free.
        new_distance: Distance in epochs to the new chunk's next use after the current
            one (None: unknown).
        new_used: The cache's clock now (the new chunk's last use).
        distances: Per pack, each chunk's distance to its next use (``next_uses``).
        policy: ``belady`` or ``lru``.
    """
    if need_bytes <= 0:
        return []
    new_key = _key(policy, new_distance, new_used)
    ranked = sorted(
        ((_key(policy, distances.get(c.pack, {}).get(c.chunk), c.used), c) for c in candidates),
        key=lambda item: item[0],
        reverse=True,
    )
    victims: list[Candidate] = []
    freed = 0
    for key, candidate in ranked:
        if key <= new_key:
            break
        victims.append(candidate)
        freed += candidate.nbytes
        if freed >= need_bytes:
            return victims
    return None
