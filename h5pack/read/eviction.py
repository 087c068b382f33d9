"""Which cached chunk to drop: the known future (Belady's rule) or the least recently used.

NOTE [ Evicting by the known future ]

A sampler knows each epoch's chunk order before it starts (``plan_epoch``: a pure function
of seed and epoch), so the disk cache knows when each chunk is needed next, and Belady's
rule (evict the chunk needed farthest ahead) is optimal: with a budget of a fraction ``f``
of the pack, an epoch downloads ``(1 - f)`` of it, where LRU re-downloads nearly all
(docs/decisions/0018). Times are in *epochs* (epoch plus the share of its batches before
the use), so futures of several loaders on one machine compare, each from its owner's
``now``. A chunk no live future names goes first, least recently used first. The new chunk
takes part: when every chunk that would have to go is needed sooner, it is not cached.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from h5pack._types import parse_choice
from h5pack.errors import OptionsError

EvictionPolicy = Literal["belady", "lru"]
EVICTION_POLICIES: tuple[EvictionPolicy, ...] = ("belady", "lru")
_SAME_USE = 1e-9  # epochs: two futures' uses this close are one use


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
    """When a loader uses which chunk of one pack: ``chunks[i]`` at ``times[i]`` (epochs)."""

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
    """Return each chunk's distance (epochs) to its nearest next use over ``(future, now)``."""
    found: dict[int, float] = {}
    for future, now in futures:
        later = future.times > now
        chunks, first = np.unique(future.chunks[later], return_index=True)
        distances = future.times[later][first] - now
        for chunk, distance in zip(chunks.tolist(), distances.tolist(), strict=True):
            if distance < found.get(chunk, math.inf):
                found[chunk] = distance
    return found


def new_distance(
    futures: Iterable[tuple[Future, float]], chunk: int, at: float | None
) -> float | None:
    """Return the distance to ``chunk``'s next use after the one at ``at`` (None: unknown).

    The use at ``at`` is skipped in every future: a rank's workers record the same uses.
    """
    found: float | None = None
    for future, now in futures:
        times = future.times[future.chunks == chunk]
        later = times[times > now]
        if at is not None:
            later = later[np.abs(later - at) > _SAME_USE]
        if len(later):
            distance = float(later[0]) - now
            found = distance if found is None else min(found, distance)
    return found


@dataclass(frozen=True)
class Candidate:
    """A cached chunk that could be evicted (``used``: the cache's clock at its last use)."""

    pack: str
    chunk: int
    nbytes: int
    used: int


def _key(policy: EvictionPolicy, distance: float | None, used: int) -> tuple[float, float]:
    """Rank a chunk: larger is evicted first."""
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

    Candidates go farthest-first while they rank above the new chunk itself.

    Args:
        candidates: The ready chunks that may go.
        need_bytes: Bytes to free.
        new_distance: The new chunk's distance to its next use (None: unknown).
        new_used: The cache's clock now.
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
