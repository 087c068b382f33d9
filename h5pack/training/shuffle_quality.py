"""Shuffle quality of a sample order: MosaicML Streaming's entropy of index jumps.

The measure takes the jumps between consecutive indices of an order, ``|order[t+1] -
order[t]|``, and returns the Shannon entropy (bits) of their distribution. A sequential
order has one jump size (entropy 0); a uniformly random permutation of N spreads jumps
over 1..N-1 and comes close to its ceiling, ``log2(N - 1)``. It is a cheap, published
proxy (MosaicML Streaming's ``shuffle_quality`` simulations) for how random an order
looks to SGD, reported next to throughput; it does not replace checking that training
accuracy matches a full shuffle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def jump_entropy(order: Sequence[int] | np.ndarray) -> float:
    """Return the entropy, in bits, of the absolute jumps between consecutive indices.

    Example:
        >>> jump_entropy(range(100))
        0.0
        >>> round(jump_entropy([0, 2, 1, 3]), 3)   # jumps 2, 1, 2
        0.918
    """
    values = np.asarray(order, dtype=np.int64).reshape(-1)
    if values.size < 2:
        return 0.0
    counts = np.bincount(np.abs(np.diff(values)))
    probabilities = counts[counts > 0] / (values.size - 1)
    return float(-np.sum(probabilities * np.log2(probabilities)) + 0.0)


def relative_jump_entropy(order: Sequence[int] | np.ndarray, *, seed: int = 0) -> float:
    """Return ``jump_entropy(order)`` over that of a random permutation of the same indices.

    1.0 means as random as a full shuffle by this measure; 0.0 means sequential.
    """
    values = np.asarray(order, dtype=np.int64).reshape(-1)
    reference = jump_entropy(np.random.default_rng(seed).permutation(values))
    if reference == 0.0:
        return 1.0 if jump_entropy(values) == 0.0 else math.inf
    return jump_entropy(values) / reference


# NOTE [ Batch-pair repetition ]
#
# Jump entropy looks at one epoch's order; SGD also cares about which samples share a
# batch, epoch after epoch. Two samples of one chunk meet in a batch far more often under
# a chunk-aware order than under a full shuffle, and pack order puts the same samples
# together every epoch. ``pair_repetition`` counts, over the pairs of samples delivered in
# one batch in every epoch after the first, the fraction that already met in a batch in an
# earlier epoch. Under a full shuffle a given pair meets in one epoch with probability
# p = sum_k b_k (b_k - 1) / (N (N - 1)) (batches of sizes b_k), independently across epochs,
# so a pair meeting in epoch e met before with probability 1 - (1 - p)^e:
# ``expected_pair_repetition`` averages that over the epochs. Pack order gives 1.0.


def _batch_pairs(batches: Sequence[np.ndarray], keep: np.ndarray | None, num: int) -> np.ndarray:
    """Return the distinct pairs ``i * num + j`` (i < j) of samples sharing a batch."""
    codes = []
    for batch in batches:
        values = np.unique(np.asarray(batch, dtype=np.int64))
        if keep is not None:
            values = values[keep[values]]
        if values.size < 2:
            continue
        first, second = np.triu_indices(values.size, k=1)
        codes.append(values[first] * num + values[second])
    return np.unique(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)


def pair_repetition(
    epochs: Sequence[Sequence[np.ndarray]], *, max_pairs: int = 4_000_000, seed: int = 0
) -> float:
    """Return how often two samples that share a batch already shared one in an earlier epoch.

    See the note "Batch-pair repetition". When the epochs hold more than ``max_pairs``
    pairs, only pairs among a random subset of the samples are counted (an unbiased
    estimate of the same fraction).

    Args:
        epochs: Each epoch's batches (arrays of sample indices), in epoch order.
        max_pairs: Pairs counted at most, over all epochs.
        seed: Seed of the subset of samples, when one is needed.

    Returns:
        The fraction in [0, 1]; 0.0 with fewer than two epochs.

    Example:
        >>> batches = [np.array([0, 1]), np.array([2, 3])]
        >>> pair_repetition([batches, batches])       # the same batches every epoch
        1.0
        >>> pair_repetition([batches, [np.array([0, 2]), np.array([1, 3])]])
        0.0
    """
    if len(epochs) < 2:
        return 0.0
    num = 1 + max((int(np.max(b)) for epoch in epochs for b in epoch if len(b)), default=0)
    total = sum(len(b) * (len(b) - 1) // 2 for epoch in epochs for b in epoch)
    keep = None
    if total > max_pairs:
        share = math.sqrt(max_pairs / total)
        keep = np.random.default_rng([seed, 0x9A1F]).random(num) < share
    seen = _batch_pairs(epochs[0], keep, num)
    repeated = counted = 0
    for epoch in epochs[1:]:
        pairs = _batch_pairs(epoch, keep, num)
        repeated += int(np.isin(pairs, seen, assume_unique=True).sum())
        counted += pairs.size
        seen = np.union1d(seen, pairs)
    return repeated / counted if counted else 0.0


def expected_pair_repetition(batch_sizes: Sequence[int], num_epochs: int) -> float:
    """Return ``pair_repetition``'s expectation under a full shuffle each epoch.

    Args:
        batch_sizes: The sizes of one epoch's batches (they sum to the samples N).
        num_epochs: Epochs compared (at least 2 for a non-zero answer).

    Example:
        >>> round(expected_pair_repetition([2, 2], 2), 4)     # N = 4: p = 2 * 2 / 12
        0.3333
    """
    sizes = np.asarray(batch_sizes, dtype=np.float64)
    num = float(sizes.sum())
    if num_epochs < 2 or num < 2:
        return 0.0
    meet = float(np.sum(sizes * (sizes - 1)) / (num * (num - 1)))
    return float(np.mean([1 - (1 - meet) ** e for e in range(1, num_epochs)]))
