"""Padding across ranks, as docs/ARCHITECTURE.md ("Chunk-aware epoch order") states it.

Issue 9.8: with N = 1 and 3 ranks the one sample is served 3 times; the bound the docs
give is checked here for every small N and R.
"""

import collections
import math

import pytest

from h5pack.core.layout import ChunkMap
from h5pack.training.sampler import EpochSpec, plan_epoch


def _servings(num, ranks, chunk):
    counts = collections.Counter()
    for rank in range(ranks):
        spec = EpochSpec(batch_size=2, num_replicas=ranks, rank=rank, seed=1)
        for batch in plan_epoch(ChunkMap.regular(num, chunk), spec, epoch=0):
            counts.update(batch.tolist())
    return counts


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("ranks", range(1, 8))
@pytest.mark.parametrize("num", range(1, 24))
def test_padding_repeats_what_the_docs_say(num, ranks, chunk):
    counts = _servings(num, ranks, chunk)
    assert set(counts) == set(range(num))  # every sample at least once
    repeats = sum(counts.values()) - num
    assert repeats == ranks * math.ceil(num / ranks) - num <= ranks - 1
    if num % ranks == 0:
        assert max(counts.values()) == 1
    elif num >= ranks:
        assert max(counts.values()) == 2  # each repeat a different sample
    else:
        assert max(counts.values()) == math.ceil(ranks / num)


def test_one_sample_and_three_ranks_is_served_three_times():
    assert _servings(1, 3, 1) == {0: 3}
