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
