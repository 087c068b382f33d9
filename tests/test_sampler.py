from __future__ import annotations

import doctest
import itertools
from collections import Counter, OrderedDict
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training import sampler as sampler_module
from h5pack.training.sampler import (
    ChunkBatchSampler,
    ChunkSampler,
    EpochSpec,
    num_batches,
    plan_epoch,
    window_for,
)


def flatten(batches: Iterable[list[int]]) -> list[int]:
    return list(itertools.chain.from_iterable(batches))


def irregular_map(sizes: list[int]) -> ChunkMap:
    return ChunkMap(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


chunk_maps = st.one_of(
    st.builds(ChunkMap.regular, st.integers(0, 300), st.integers(1, 40)),
    st.lists(st.integers(1, 30), min_size=1, max_size=25).map(irregular_map),
)


def fifo_loads(cmap: ChunkMap, batches: list[np.ndarray], capacity: int) -> Counter[int]:
    """Count chunk loads of one process that keeps its last ``capacity`` chunks (FIFO)."""
    cache: OrderedDict[int, None] = OrderedDict()
    loads: Counter[int] = Counter()
    for batch in batches:
        chunks = cmap.chunks_of(batch)
        # chunks in order of first appearance, as H5ImageDataset loads them
        _, first = np.unique(chunks, return_index=True)
        for chunk in (int(c) for c in chunks[np.sort(first)]):
            if chunk not in cache:
                loads[chunk] += 1
                cache[chunk] = None
        while len(cache) > capacity:
            cache.popitem(last=False)
    return loads


@settings(max_examples=150, deadline=None)
@given(
    cmap=chunk_maps,
    batch_size=st.integers(1, 50),
    num_replicas=st.integers(1, 4),
    num_workers=st.integers(0, 3),
    window=st.integers(1, 6),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 1000),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_epoch_covers_every_sample_with_equal_batches_per_rank(
    cmap: ChunkMap,
    batch_size: int,
    num_replicas: int,
    num_workers: int,
    window: int,
    seed: int,
    epoch: int,
    drop_last: bool,
    shuffle: bool,
) -> None:
    n = cmap.num_samples
    per_rank = [
        plan_epoch(
            cmap,
            EpochSpec(
                batch_size=batch_size,
                seed=seed,
                shuffle=shuffle,
                window_chunks=window,
                drop_last=drop_last,
                num_replicas=num_replicas,
                rank=rank,
                num_workers=num_workers,
            ),
            epoch=epoch,
        )
        for rank in range(num_replicas)
    ]
    expected_batches = num_batches(n, batch_size, num_replicas=num_replicas, drop_last=drop_last)
    assert [len(b) for b in per_rank] == [expected_batches] * num_replicas
    seen = Counter(int(i) for batches in per_rank for b in batches for i in b)
    assert all(0 <= i < n for i in seen)
    for batches in per_rank:
        sizes = [len(b) for b in batches]
        assert all(s == batch_size for s in sizes[:-1])
        if sizes:
            assert 1 <= sizes[-1] <= batch_size
            if drop_last:
                assert sizes[-1] == batch_size
    if drop_last:
        # every sample at most once; only the tail that does not divide evenly is dropped
        assert max(seen.values(), default=1) == 1
        assert n - sum(seen.values()) < num_replicas * batch_size + num_replicas
    else:
        # every sample at least once; padding repeats fewer than num_replicas samples
        assert set(seen) == set(range(n))
        padded = sum(seen.values()) - n
        assert padded == (-n) % num_replicas
        if n >= num_replicas:
            assert all(c <= 2 for c in seen.values())

    # Each worker of each rank reads its own chunks: with a FIFO cache of K chunks per
    # worker, a chunk is decompressed once per epoch, except the few that sit on a boundary
    # between ranks or workers.
    total_loads: Counter[int] = Counter()
    workers = max(1, num_workers)
    for batches in per_rank:
        for w in range(workers):
            loads = fifo_loads(cmap, batches[w::workers], window)
            assert max(loads.values(), default=1) == 1
            total_loads.update(loads)
    extra = sum(total_loads.values()) - len(total_loads)
    assert extra <= (num_replicas - 1) + num_replicas * (workers - 1) + (
        num_replicas if not drop_last else 0
    )


@settings(max_examples=60, deadline=None)
@given(cmap=chunk_maps, batch_size=st.integers(1, 20), window=st.integers(1, 4))
def test_single_process_reads_each_chunk_exactly_once(
    cmap: ChunkMap, batch_size: int, window: int
) -> None:
    batches = plan_epoch(
        cmap, EpochSpec(batch_size=batch_size, seed=7, window_chunks=window), epoch=1
    )
    loads = fifo_loads(cmap, batches, window)
    assert sorted(loads) == [c for c in range(cmap.num_chunks) if len(cmap.samples(c))]
    assert set(loads.values()) <= {1}


@settings(max_examples=60, deadline=None)
@given(
    cmap=chunk_maps,
    batch_size=st.integers(1, 20),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    num_workers=st.integers(0, 3),
)
def test_order_is_a_pure_function_of_seed_and_epoch(
    cmap: ChunkMap, batch_size: int, seed: int, epoch: int, num_workers: int
) -> None:
    def order() -> list[list[int]]:
        s = ChunkBatchSampler(cmap, batch_size, seed=seed, num_workers=num_workers)
        s.set_epoch(epoch)
        return list(s)

    assert order() == order()


def test_next_epoch_and_other_seed_give_other_orders() -> None:
    cmap = ChunkMap.regular(1000, 16)
    s = ChunkBatchSampler(cmap, 32, seed=3)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert first != second
    assert sorted(flatten(first)) == sorted(flatten(second)) == list(range(1000))
    assert list(ChunkBatchSampler(cmap, 32, seed=4)) != first


def test_batches_mix_several_chunks() -> None:
    cmap = ChunkMap.regular(4096, 64)
    s = ChunkBatchSampler(cmap, 64, seed=0, window_chunks=16)
    chunks_per_batch = [len(np.unique(cmap.chunks_of(np.array(b)))) for b in s]
    assert np.median(chunks_per_batch) >= 12


def test_shuffle_false_is_pack_order_in_one_process() -> None:
    cmap = ChunkMap.regular(103, 10)
    s = ChunkBatchSampler(cmap, 8, shuffle=False)
    assert flatten(s) == list(range(103))


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_resume_mid_epoch_continues_with_the_rest_of_the_order(num_workers: int) -> None:
    cmap = ChunkMap.regular(500, 16)
    s = ChunkBatchSampler(cmap, 24, seed=11, num_workers=num_workers, window_chunks=3)
    s.set_epoch(2)
    full = list(s)
    it = iter(s)
    consumed = [next(it) for _ in range(7)]
    state = s.state_dict()
    assert consumed == full[:7]
    assert state["epoch"] == 2
    assert state["position"] == 7

    resumed = ChunkBatchSampler(cmap, 24, seed=11, num_workers=num_workers, window_chunks=3)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # a training loop calls set_epoch again: the position is kept
    assert list(resumed) == full[7:]
    # the following iteration is the whole epoch again; the next epoch starts from 0
    assert list(resumed) == full
    resumed.set_epoch(3)
    assert len(list(resumed)) == len(s)


def test_state_dict_position_override_and_mismatch() -> None:
    cmap = ChunkMap.regular(100, 10)
    s = ChunkBatchSampler(cmap, 10, seed=1)
    full = list(s)
    state = s.state_dict(position=4)
    assert list(s) == full  # a new iteration starts the epoch again
    other = ChunkBatchSampler(cmap, 10, seed=1)
    other.load_state_dict(state)
    assert list(other) == full[4:]
    with pytest.raises(OptionsError, match="seed: saved 1, now 2"):
        ChunkBatchSampler(cmap, 10, seed=2).load_state_dict(state)


def test_chunk_sampler_yields_the_batches_laid_end_to_end() -> None:
    cmap = ChunkMap.regular(77, 8)
    flat = ChunkSampler(cmap, EpochSpec(batch_size=5, seed=2, num_workers=2, window_chunks=2))
    batches = ChunkBatchSampler(cmap, 5, seed=2, num_workers=2, window_chunks=2)
    order = list(flat)
    assert order == flatten(batches)
    assert len(flat) == 77 == len(order)
    it = iter(flat)
    head = [next(it) for _ in range(10)]
    state = flat.state_dict()
    again = ChunkSampler(cmap, EpochSpec(batch_size=5, seed=2, num_workers=2, window_chunks=2))
    again.load_state_dict(state)
    assert head + list(again) == order


def test_chunk_sampler_len_with_ranks() -> None:
    cmap = ChunkMap.regular(10, 3)
    lengths = [
        len(list(ChunkSampler(cmap, EpochSpec(batch_size=1, num_replicas=3, rank=r))))
        for r in range(3)
    ]
    assert lengths == [4, 4, 4]
    assert len(ChunkSampler(cmap, EpochSpec(batch_size=1, num_replicas=3, rank=0))) == 4


def test_window_from_memory_budget() -> None:
    mib = 2**20

    def window(chunks: int | None, budget: int | None, chunk: int | None, workers: int) -> int:
        return window_for(
            window_chunks=chunks, window_bytes=budget, group_bytes=chunk, num_workers=workers
        )

    assert window(5, None, mib, 4) == 5
    assert window(None, 64 * mib, mib, 0) == 64
    assert window(None, 64 * mib, mib, 4) == 16
    assert window(None, mib, 8 * mib, 2) == 1
    assert (
        window_for(window_chunks=None, window_bytes=None, group_bytes=None, num_workers=0)
        == sampler_module.DEFAULT_WINDOW_CHUNKS
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size should be >= 1"),
        ({"num_workers": -1}, "num_workers should be >= 0"),
        ({"window_chunks": 0}, "window_chunks should be >= 1"),
        ({"window_bytes": 0}, "window_bytes should be positive"),
        ({"num_replicas": 2, "rank": 2}, "rank should be in 0..1"),
        ({"num_replicas": 0, "rank": 0}, "num_replicas should be >= 1"),
    ],
)
def test_bad_arguments(kwargs: dict[str, int], message: str) -> None:
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(OptionsError, match=message):
        ChunkBatchSampler(ChunkMap.regular(10, 2), **args)


def test_bad_source() -> None:
    with pytest.raises(OptionsError, match="source should be a ChunkMap"):
        ChunkBatchSampler(42, 4)  # type: ignore[arg-type]


def test_empty_map() -> None:
    s = ChunkBatchSampler(ChunkMap.regular(0, 4), 3)
    assert len(s) == 0
    assert list(s) == []


def test_docstring_examples() -> None:
    result = doctest.testmod(sampler_module, extraglobs={"ChunkMap": ChunkMap})
    assert result.attempted >= 3
    assert result.failed == 0
