"""What a worker tells its remote reader of the plan: its samples, and its rank's future.

The rank's batches of this epoch and the next are pure functions of the seed and epoch,
and the DataLoader gives batch ``b`` to worker ``b mod W``; batch ``b`` of ``B`` in epoch
``e`` is used at time ``e + b / B`` (``read/planned.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from h5pack.read.planned import ReadPlan


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
    """Return worker ``worker``'s read plan of ``epoch``; ``plan`` gives the rank's batches."""
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
