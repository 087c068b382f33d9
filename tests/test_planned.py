"""A planned source: chunks of the plan through the read-ahead, the rest as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from h5pack.core.layout import ChunkMap
from h5pack.read.diskcache import DiskCacheOptions, pack_key
from h5pack.read.eviction import Future
from h5pack.read.planned import PlannedSource, ReadPlan, chunk_stream, chunk_uses
from h5pack.training.mapstyle import read_plan
from tests.test_readahead import FakeSource, expect, layout


def test_chunk_stream_keeps_first_uses_per_epoch() -> None:
    chunks, times = chunk_stream(np.array([3, 3, 1, 3, 1, 2]), np.array([0, 0.1, 0.2, 1, 1.5, 1.6]))
    assert chunks.tolist() == [3, 1, 3, 1, 2]
    assert times.tolist() == [0, 0.2, 1, 1.5, 1.6]


def test_chunk_uses_expand_groups_over_their_chunks() -> None:
    cmap = ChunkMap(np.array([0, 2, 3, 6]))
    first, count = np.array([0, 1, 4]), np.array([1, 3, 1])
    chunks, times = chunk_uses(
        np.array([5, 2, 0, 1]), np.array([0.0, 0.1, 0.2, 0.3]), cmap, first, count
    )
    assert chunks.tolist() == [4, 1, 2, 3, 0]
    assert times.tolist() == [0.0, 0.1, 0.1, 0.1, 0.2]


def test_read_plan_splits_batches_by_worker() -> None:
    batches = {
        0: [np.array([0, 1]), np.array([2, 3]), np.array([4])],
        1: [np.array([4, 3, 2, 1, 0])],
    }
    plan = read_plan(lambda e: batches[e], epoch=0, worker=1, num_workers=2)
    assert plan.samples.tolist() == [2, 3]
    assert plan.times.tolist() == [1 / 3, 1 / 3]
    assert plan.future_samples.tolist() == [0, 1, 2, 3, 4, 4, 3, 2, 1, 0]
    assert plan.future_times[-1] == 1.0
    part = plan.restricted(2, 4)
    assert part.samples.tolist() == [0, 1]
    assert part.future_samples.tolist() == [0, 1, 1, 0]


def test_whole_chunks_go_through_the_read_ahead_and_the_cache(tmp_path: Path) -> None:
    data, offsets, sizes = layout(20)
    source = FakeSource(data)
    cache = DiskCacheOptions(directory=tmp_path, budget_bytes=10**6)
    key = pack_key("a" * 32, len(data), '"e"')
    for _ in range(2):
        planned = PlannedSource(source, offsets, sizes, pack=key, cache=cache)
        order = np.random.default_rng(0).permutation(20)
        times = np.arange(20) / 20
        planned.plan(order, times, Future.of(order, times))
        for chunk in order.tolist():
            begin, end = int(offsets[chunk]), int(offsets[chunk] + sizes[chunk])
            (got,) = planned.read_ranges([(begin, end)])
            assert bytes(got) == expect(data, offsets, sizes, chunk)
        # a range that is not a chunk goes to the source as it is
        assert bytes(planned.read_ranges([(0, 10)])[0]) == data[:10]
        planned.close()
    assert len(source.ranges) == 20 + 2  # the second pass read its chunks from the disk


def test_a_read_plan_is_plain_data() -> None:
    plan = ReadPlan(np.arange(3), np.zeros(3), np.arange(3), np.zeros(3))
    assert plan.restricted(0, 3).samples.tolist() == [0, 1, 2]
