"""Shuffle quality of a sample order: MosaicML Streaming's entropy of index jumps.

A sequential order has one jump size (entropy 0); a random permutation of N comes close to
``log2(N - 1)``. A cheap proxy for how random an order looks to SGD, next to throughput.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def jump_entropy(order: Sequence[int] | np.ndarray) -> float:
    """Return the entropy, in bits, of the absolute jumps between consecutive indices.

    Example:
        >>> round(jump_entropy([0, 2, 1, 3]), 3)   # jumps 2, 1, 2
        0.918
    """
    values = np.asarray(order, dtype=np.int64).reshape(-1)
    if values.size < 2:
        return 0.0
    counts = np.bincount(np.abs(np.diff(values)))
    probabilities = counts[counts > 0] / (values.size - 1)
    return float(-np.sum(probabilities * np.log2(probabilities)) + 0.0)
