"""What a worker tells its reader of the plan: its samples in order, and its rank's future.

A remote reader fetches chunks ahead of use and keeps a disk cache that evicts by the
known future (``read/planned.py``). Both come from the sampler: the rank's batches of
this epoch and of the next are pure functions of the seed and the epoch
(``ChunkBatchSampler.plan``), and the DataLoader gives batch ``b`` to worker ``b mod W``.
Times are in epochs: batch ``b`` of ``B`` in epoch ``e`` is used at ``e + b / B``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from h5pack.read.planned import ReadPlan

__all__ = ["SourcePlan", "read_plan"]


def _uses(batches: Sequence[np.ndarray], epoch: int) -> tuple[np.ndarray, np.ndarray]:
    if not batches:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    samples = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches])
    counts = np.array([len(b) for b in batches])
    times = np.repeat(epoch + np.arange(len(batches)) / len(batches), counts)
    return samples, times


def read_plan(
    plan: Callable[[int], Sequence[np.ndarray]],
    *,
    epoch: int,
    worker: int,
    num_workers: int,
) -> ReadPlan:
    """Return worker ``worker``'s read plan of ``epoch``.

    Args:
        plan: The rank's batches of an epoch (``ChunkBatchSampler.plan``).
        epoch: The epoch being read.
        worker: This DataLoader worker (0 in the main process).
        num_workers: The DataLoader's workers (0 or 1: one stream).
    """
    now, later = plan(epoch), plan(epoch + 1)
    workers = max(1, num_workers)
    all_samples, all_times = _uses(now, epoch)
    next_samples, next_times = _uses(later, epoch + 1)
    counts = np.array([len(b) for b in now], dtype=np.int64)
    owner = np.repeat(np.arange(len(now)) % workers, counts)
    mine = owner == worker
    return ReadPlan(
        samples=all_samples[mine],
        times=all_times[mine],
        future_samples=np.concatenate([all_samples, next_samples]),
        future_times=np.concatenate([all_times, next_times]),
    )


@dataclass(frozen=True)
class SourcePlan:
    """One source's part of a mix's plan: a planner (``read_plan``'s ``plan``) for that source.

    The mix's batches of an epoch keep only the global indices ``low .. high - 1`` (source
    s's samples), renumbered from 0; a batch without any stays, empty, so that batch ``b``
    is still worker ``b mod W``'s and its time is still ``e + b / B``. A repeating source's
    later passes in the same epoch are later uses of the same chunks: the read-ahead fetches
    a chunk at its first use of an epoch, the disk cache serves its next ones if it kept it.

    Attributes:
        plan: The mix's batches of an epoch, in global indices (``ChunkBatchSampler.plan``).
        low: The source's first global index.
        high: One past its last.
    """

    plan: Callable[[int], Sequence[np.ndarray]]
    low: int
    high: int

    def __call__(self, epoch: int) -> list[np.ndarray]:
        """Return the source's part of every batch of ``epoch``, in its own indices."""
        parts = []
        for batch in self.plan(epoch):
            batch = np.asarray(batch, dtype=np.int64)
            parts.append(batch[(batch >= self.low) & (batch < self.high)] - self.low)
        return parts
