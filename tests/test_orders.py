"""The order objects (training/orders.py): Hypothesis properties every kind of order keeps."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from h5pack.core.layout import ChunkMap
from h5pack.training.epochs import EpochSpec, plan_epoch, plan_pieces
from h5pack.training.orders import ChunkOrder, Order, rest_of


@st.composite
def chunk_maps(draw: st.DrawFn) -> ChunkMap:
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
    return ChunkMap(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


@st.composite
def orders(draw: st.DrawFn) -> Order:
    cmap = draw(chunk_maps())
    kind = draw(st.sampled_from(["permutation", "stratified", "sequential"]))
    if kind == "permutation":
        return ChunkOrder(cmap)
    if kind == "sequential":
        return ChunkOrder(cmap, shuffle=False)
    strata = draw(st.lists(st.integers(0, 2), min_size=cmap.num_chunks, max_size=cmap.num_chunks))
    return ChunkOrder(cmap, strata=np.asarray(strata, dtype=np.int64))


@given(orders(), st.integers(0, 2**32), st.integers(0, 50))
@settings(max_examples=60, deadline=None)
def test_an_epoch_of_a_chunk_order_is_every_sample_once_and_pure(order, seed, epoch) -> None:
    pieces = order.epoch(seed, epoch)
    assert sorted(pieces.order.tolist()) == list(range(len(pieces.sizes)))
    assert pieces.num_samples == order.num_samples
    every = pieces.samples(np.arange(pieces.num_samples))
    assert sorted(every.tolist()) == list(range(order.num_samples))
    again = order.epoch(seed, epoch)
    assert np.array_equal(again.order, pieces.order)


@given(
    orders(),
    st.integers(0, 1000),
    st.integers(1, 3),
    st.integers(0, 2),
    st.integers(1, 5),
    st.data(),
)
@settings(max_examples=60, deadline=None)
def test_the_rest_of_an_epoch_serves_every_remaining_position_once(
    order, seed, ranks, workers, batch, data
) -> None:
    delivered = np.asarray(
        data.draw(st.lists(st.booleans(), min_size=order.num_samples, max_size=order.num_samples))
    )
    rest = rest_of(order, seed, 1, delivered)
    remaining = set(np.flatnonzero(~delivered).tolist())
    positions: Counter[int] = Counter()
    lengths = set()
    for rank in range(ranks):
        spec = EpochSpec(
            batch_size=batch,
            seed=seed,
            window_chunks=2,
            num_workers=workers,
            num_replicas=ranks,
            rank=rank,
        )
        batches = plan_pieces(rest, spec, epoch=1)
        lengths.add(len(batches))
        for b in batches:
            positions.update(rest.top_positions(b).tolist())
    assert len(lengths) == 1  # every rank the same number of batches
    assert set(positions) == remaining
    padding = ranks * -(-len(remaining) // ranks) - len(remaining) if remaining else 0
    assert sum(positions.values()) - len(remaining) == padding


@given(chunk_maps(), st.integers(0, 1000), st.booleans())
@settings(max_examples=40, deadline=None)
def test_plan_epoch_of_an_order_is_plan_epoch_of_its_chunk_map(cmap, seed, shuffle) -> None:
    spec = EpochSpec(batch_size=3, seed=seed, shuffle=shuffle, window_chunks=2)
    order: Order = ChunkOrder(cmap, shuffle=shuffle)
    by_map = plan_epoch(cmap, spec, epoch=4)
    by_order = plan_epoch(order, spec, epoch=4)
    assert [b.tolist() for b in by_map] == [b.tolist() for b in by_order]
