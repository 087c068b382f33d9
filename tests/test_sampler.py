from __future__ import annotations

import doctest
import itertools
import math
from collections import Counter, OrderedDict
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training import epochs as epochs_module
from h5pack.training import sampler as sampler_module
from h5pack.training.epochs import num_batches, window_for
from h5pack.training.sampler import (
    ChunkBatchSampler,
    ChunkSampler,
    EpochSpec,
    plan_epoch,
    sampler_for_labels,
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
    strata=st.none() | st.integers(1, 5),
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
    strata: int | None,
) -> None:
    n = cmap.num_samples
    # ``strata`` strata in runs of chunks, as a class-ordered pack's dominant labels
    chunk_strata = (
        None
        if strata is None
        else tuple(c * strata // max(1, cmap.num_chunks) for c in range(cmap.num_chunks))
    )
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
                chunk_strata=chunk_strata,
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
    stratified=st.booleans(),
)
def test_order_is_a_pure_function_of_seed_and_epoch(
    cmap: ChunkMap, batch_size: int, seed: int, epoch: int, num_workers: int, stratified: bool
) -> None:
    strata = [c % 3 for c in range(cmap.num_chunks)] if stratified else None

    def order() -> list[list[int]]:
        s = ChunkBatchSampler(
            cmap, batch_size, seed=seed, num_workers=num_workers, chunk_strata=strata
        )
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
    # a state saved before the stratified order existed resumes an unstratified sampler
    older = {k: v for k, v in state.items() if k != "stratified"}
    ChunkBatchSampler(cmap, 10, seed=1).load_state_dict(older)
    stratified = ChunkBatchSampler(cmap, 10, seed=1, chunk_strata=[0] * 5 + [1] * 5)
    with pytest.raises(OptionsError, match="stratified: saved False, now True"):
        stratified.load_state_dict(older)


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
        == epochs_module.DEFAULT_WINDOW_CHUNKS
    )


def test_default_window_floors_and_cap() -> None:
    mib, gib = 2**20, 2**30
    big_machine = 64 * gib

    def window(**kwargs: int | float | None) -> int:
        base: dict[str, int | float | None] = {
            "window_chunks": None,
            "window_bytes": None,
            "group_bytes": 8 * mib,
            "num_workers": 8,
            "machine_bytes": big_machine,
        }
        return window_for(**{**base, **kwargs})  # type: ignore[arg-type]

    # the bytes floor alone: 256 MiB over 8 workers of 8 MiB chunks
    assert window() == 4
    # the pool floor: 8 batches of 256 in chunks of 55 samples (ImageNet-style pack)
    assert window(batch_size=256, chunk_samples=55) == math.ceil(8 * 256 / 55) == 38
    # the labels floor
    assert window(min_window_chunks=100) == 100
    # the cap: an eighth of the machine over the workers
    assert window(min_window_chunks=10_000) == big_machine // 8 // (8 * 8 * mib) == 128
    small_machine = window(machine_bytes=2 * gib, batch_size=256, chunk_samples=55)
    assert small_machine == 2 * gib // 8 // (8 * 8 * mib) == 4
    # an explicit budget is the budget: no floor beyond it
    assert window(window_bytes=64 * mib, batch_size=256, chunk_samples=55) == 1
    # an explicit window wins over everything
    assert window(window_chunks=3, min_window_chunks=100) == 3
    # never more chunks than the pack has
    assert window(batch_size=256, chunk_samples=55, num_chunks=20) == 20
    assert window(batch_size=256, chunk_samples=55, num_workers=0) == 38  # 32 from bytes
    # chunk size unknown (a bare ChunkMap): no cap
    assert window(group_bytes=None, min_window_chunks=10_000) == 10_000


def test_memory_bytes_is_the_machine_or_its_container() -> None:
    from h5pack.core.machine import memory_bytes  # what the window's cap reads

    memory = memory_bytes()
    assert memory is None or memory > 2**20


def test_sampler_window_has_the_pool_floor() -> None:
    cmap = ChunkMap.regular(100_000, 16)
    assert ChunkBatchSampler(cmap, 8).window_chunks == 16  # DEFAULT_WINDOW_CHUNKS
    sampler = ChunkBatchSampler(cmap, 64)
    assert sampler.window_chunks == epochs_module.MIN_POOL_BATCHES * 64 // 16
    assert ChunkBatchSampler(cmap, 64, min_window_chunks=500).window_chunks == 500
    assert ChunkBatchSampler(cmap, 64, window_chunks=2).window_chunks == 2
    assert ChunkBatchSampler(ChunkMap.regular(40, 16), 64).window_chunks == 3  # the pack's


def test_sampler_for_labels_widens_the_default_window_of_an_unmixed_pack() -> None:
    cmap = ChunkMap.regular(4096, 16)
    in_order = np.repeat(np.arange(64), 64)  # 64 classes, 4 chunks each
    spec = EpochSpec(batch_size=4, seed=1)
    plain = ChunkBatchSampler(cmap, spec)
    sampler, report = sampler_for_labels(cmap, spec, in_order)
    assert report is not None
    assert report.chunks_unmixed
    assert plain.window_chunks == 16
    assert sampler.window_chunks == 64  # one chunk of each class per window
    assert report.window_chunks == sampler.window_chunks
    assert report.stratified
    assert not report.window_unmixed
    assert report.warns  # the chunks do not mix: the user should know
    assert sorted(flatten(sampler)) == list(range(4096))
    # every window (64 chunks: 1,024 consecutive samples of the order) holds every class
    windows = np.concatenate(sampler.plan()).reshape(-1, 1024)
    assert all(len(set(in_order[w].tolist())) == 64 for w in windows)


def test_stratified_order_is_a_pure_permutation_and_balances_windows() -> None:
    cmap = ChunkMap.regular(2560, 64)
    in_order = np.repeat(np.arange(5), 512)  # the benchmark's class-ordered pack
    strata = tuple(int(s) for s in np.repeat(np.arange(5), 8))
    sampler = ChunkBatchSampler(cmap, 32, seed=3, window_chunks=5, chunk_strata=strata)
    again = ChunkBatchSampler(cmap, 32, seed=3, window_chunks=5, chunk_strata=strata)
    assert list(sampler) == list(again)
    sampler.set_epoch(1)
    epoch = list(sampler)
    assert sorted(flatten(epoch)) == list(range(2560))
    # a window of 5 chunks holds 4 or 5 classes: a random order often holds 2 or 3
    per_window = [len(set(in_order[flatten(epoch[i : i + 10])].tolist())) for i in range(0, 80, 10)]
    assert min(per_window) >= 4
    assert sampler.state_dict()["stratified"]
    with pytest.raises(OptionsError, match="chunk_strata should have one entry per chunk"):
        ChunkBatchSampler(cmap, 32, chunk_strata=(0, 1)).plan()


def test_sampler_for_labels_keeps_an_explicit_window_and_reports() -> None:
    cmap = ChunkMap.regular(4096, 16)
    in_order = np.repeat(np.arange(16), 256)
    sampler, report = sampler_for_labels(cmap, EpochSpec(batch_size=4, window_chunks=2), in_order)
    assert sampler.window_chunks == 2
    assert sampler.spec.chunk_strata is not None  # the order is stratified all the same
    assert report is not None
    assert report.warns
    assert report.window_needed == 16


def test_sampler_for_labels_with_a_budget_too_small_still_warns() -> None:
    cmap = ChunkMap.regular(4096, 16)
    in_order = np.repeat(np.arange(16), 256)

    class Pack:  # a source whose chunks have a size: the budget applies
        chunk_map = cmap
        group_bytes = 2**20

    spec = EpochSpec(batch_size=4, window_bytes=2 * 2**20)
    sampler, report = sampler_for_labels(Pack(), spec, in_order)
    assert sampler.window_chunks == 2
    assert report is not None
    assert report.warns


def test_sampler_for_labels_mixed_unlabelled_and_unshuffled() -> None:
    cmap = ChunkMap.regular(4096, 16)
    spec = EpochSpec(batch_size=4)
    mixed = np.random.default_rng(0).permutation(np.repeat(np.arange(16), 256))
    sampler, report = sampler_for_labels(cmap, spec, mixed)
    assert report is not None
    assert not report.warns
    assert sampler.window_chunks == ChunkBatchSampler(cmap, spec).window_chunks
    _, unlabelled = sampler_for_labels(cmap, spec, np.full(4096, -1))
    assert unlabelled is not None
    assert unlabelled.exempt
    assert not unlabelled.warns
    _, unchecked = sampler_for_labels(cmap, EpochSpec(batch_size=4, shuffle=False), mixed)
    assert unchecked is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size should be an integer >= 1"),
        ({"num_workers": -1}, "num_workers should be an integer >= 0"),
        ({"window_chunks": 0}, "window_chunks should be an integer >= 1"),
        ({"window_bytes": 0}, "window_bytes should be an integer >= 1"),
        ({"min_window_chunks": 0}, "min_window_chunks should be an integer >= 1"),
        ({"num_replicas": 2, "rank": 2}, "rank should be in 0..1"),
        ({"num_replicas": 0, "rank": 0}, "num_replicas should be an integer >= 1"),
        # issue 20 A and F: not integers, or a seed torch.Generator refuses
        ({"batch_size": 2.5}, r"batch_size should be an integer >= 1, but got batch_size=2\.5"),
        ({"batch_size": "8"}, "batch_size should be an integer >= 1, but got batch_size='8'"),
        ({"batch_size": None}, "batch_size should be an integer >= 1, but got batch_size=None"),
        ({"batch_size": True}, "batch_size should be an integer"),
        ({"seed": 2**70}, r"seed should be an integer in -2\*\*63 \.\. 2\*\*64 - 1"),
        ({"seed": 1.5}, "seed should be an integer"),
        ({"shuffle": "yes"}, "shuffle should be True or False"),
        ({"window_chunks": 2.0}, "window_chunks should be an integer >= 1 or None"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
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
    from h5pack.training import epochs

    result = doctest.testmod(sampler_module, extraglobs={"ChunkMap": ChunkMap})
    assert result.attempted >= 3
    assert result.failed == 0
    planned = doctest.testmod(epochs, extraglobs={"ChunkMap": ChunkMap})
    assert planned.attempted >= 2  # plan_epoch, epoch_spec
    assert planned.failed == 0
