"""What a worker tells its reader of the plan: its samples in order, and its rank's future.

A remote reader fetches chunks ahead of use and keeps a disk cache that evicts by the
known future (``read/planned.py``). Both come from the sampler: the rank's batches of
this epoch and of the next are pure functions of the seed and the epoch
(``ChunkBatchSampler.plan``), and the DataLoader gives batch ``b`` to worker ``b mod W``.
Times are in epochs: batch ``b`` of ``B`` in epoch ``e`` is used at ``e + b / B``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from h5pack.read.planned import ReadPlan

__all__ = ["read_plan"]


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
