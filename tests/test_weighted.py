"""The weighted mix as an order (training/weighted.py): exact shares, passes, coverage, resume.

No files: the sources are chunk maps (``MixedSources``); tests/test_mixed.py reads packs.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training.epochs import plan_pieces
from h5pack.training.orders import rest_of
from h5pack.training.sampler import ChunkBatchSampler, EpochSpec, MixedSources, plan_epoch
from h5pack.training.weighted import WeightedMix, shares


def source_counts(mix: WeightedMix, samples: np.ndarray) -> list[int]:
    found = np.searchsorted(mix.offsets, samples, side="right") - 1
    return np.bincount(found, minlength=len(mix.chunk_maps)).tolist()


def served(mix: WeightedMix, spec: EpochSpec, epoch: int, ranks: int = 1) -> np.ndarray:
    """Every rank's samples of ``epoch``, concatenated."""
    out = []
    for rank in range(ranks):
        spec_r = EpochSpec(**{**spec.__dict__, "num_replicas": ranks, "rank": rank})
        out += [b for b in plan_epoch(mix, spec_r, epoch=epoch)]
    return np.concatenate(out)


@st.composite
def mixes(draw: st.DrawFn) -> WeightedMix:
    maps = []
    for _ in range(draw(st.integers(1, 3))):
        sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
        maps.append(ChunkMap(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)))
    weights = draw(st.lists(st.integers(1, 9), min_size=len(maps), max_size=len(maps)))
    total = sum(m.num_samples for m in maps)
    epoch_samples = draw(st.one_of(st.none(), st.integers(1, 4 * total)))
    return WeightedMix(
        tuple(maps), tuple(float(w) for w in weights), epoch_samples, draw(st.booleans())
    )


@given(mixes(), st.integers(0, 2**32), st.integers(0, 40))
@settings(max_examples=80, deadline=None)
def test_an_epoch_holds_each_source_exactly_its_share(mix, seed, epoch) -> None:
    pieces = mix.epoch(seed, epoch)
    assert pieces.num_samples == mix.num_samples
    assert sorted(pieces.order.tolist()) == list(range(len(pieces.sizes)))
    samples = pieces.samples(np.arange(pieces.num_samples))
    counts = source_counts(mix, samples)
    assert counts == mix.takes.tolist()
    exact = np.asarray(mix.weights) / sum(mix.weights) * mix.num_samples
    assert np.all(np.abs(np.asarray(counts) - exact) < 1)
    # every position's sample is in its own source, and the source says so
    assert np.array_equal(
        pieces.sources_of(np.arange(pieces.num_samples)),
        np.searchsorted(mix.offsets, samples, side="right") - 1,
    )
    again = mix.epoch(seed, epoch)
    assert np.array_equal(again.order, pieces.order)
    assert np.array_equal(again.samples(np.arange(pieces.num_samples)), samples)


@given(mixes(), st.integers(0, 1000), st.integers(1, 3), st.integers(0, 2), st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_ranks_and_workers_split_a_mixed_epoch(mix, seed, ranks, workers, batch) -> None:
    spec = EpochSpec(batch_size=batch, seed=seed, window_chunks=2, num_workers=workers)
    lengths, got = set(), Counter()
    for rank in range(ranks):
        spec_r = EpochSpec(**{**spec.__dict__, "num_replicas": ranks, "rank": rank})
        pieces = mix.epoch(seed, 3)
        batches = plan_pieces(pieces, spec_r, epoch=3)
        lengths.add(len(batches))
        for b in batches:
            got.update(b.tolist())
    assert len(lengths) == 1
    num = mix.num_samples
    assert set(got) == set(range(num))  # every position of the epoch
    assert sum(got.values()) - num == ranks * -(-num // ranks) - num


@given(mixes(), st.integers(0, 1000), st.integers(1, 3), st.integers(0, 2), st.data())
@settings(max_examples=60, deadline=None)
def test_the_rest_of_a_mixed_epoch_serves_each_remaining_position_once(
    mix, seed, ranks, workers, data
) -> None:
    num = mix.num_samples
    delivered = np.asarray(data.draw(st.lists(st.booleans(), min_size=num, max_size=num)))
    rest = rest_of(mix, seed, 2, delivered)
    got: Counter[int] = Counter()
    lengths = set()
    for rank in range(ranks):
        spec = EpochSpec(
            batch_size=3, seed=seed, window_chunks=2, num_workers=workers, num_replicas=ranks
        )
        batches = plan_pieces(rest, EpochSpec(**{**spec.__dict__, "rank": rank}), epoch=2)
        lengths.add(len(batches))
        for b in batches:
            got.update(rest.top_positions(b).tolist())
    remaining = set(np.flatnonzero(~delivered).tolist())
    assert len(lengths) == 1
    assert set(got) == remaining
    left = len(remaining)
    assert sum(got.values()) - left == (ranks * -(-left // ranks) - left if left else 0)
    # a position's sample is the whole epoch's sample at that position
    whole = mix.epoch(seed, 2)
    every = np.asarray(sorted(remaining), dtype=np.int64)
    if every.size:
        assert np.array_equal(rest.samples(np.arange(every.size)), whole.samples(every))


def test_shares_are_the_largest_remainder_rounding() -> None:
    assert shares([3, 1], 256).tolist() == [192, 64]
    assert shares([1, 1, 1], 100).tolist() == [34, 33, 33]
    assert shares([2, 1], 1).tolist() == [1, 0]


@pytest.mark.parametrize(
    ("weights", "epoch_samples"), [((3, 1), None), ((1, 1), 700), ((1, 10), 990), ((5, 3, 2), 600)]
)
def test_twenty_epochs_hold_the_shares_exactly(weights, epoch_samples) -> None:
    maps = tuple(ChunkMap.regular(n, 16) for n in (500, 40, 260)[: len(weights)])
    mix = WeightedMix(maps, tuple(float(w) for w in weights), epoch_samples)
    spec = EpochSpec(batch_size=32, seed=1, window_chunks=4, num_workers=2)
    for epoch in range(20):
        counts = source_counts(mix, served(mix, spec, epoch))
        assert counts == shares(weights, mix.num_samples).tolist()


def test_no_sample_twice_in_an_epoch_when_no_source_repeats() -> None:
    mix = WeightedMix((ChunkMap.regular(300, 16), ChunkMap.regular(200, 10)), (1.0, 1.0), 300)
    spec = EpochSpec(batch_size=25, seed=2, window_chunks=3, num_workers=2)
    for epoch in range(6):
        samples = served(mix, spec, epoch)
        assert len(samples) == len(set(samples.tolist())) == 300


def test_a_repeating_source_sees_each_sample_once_per_pass() -> None:
    # the small source's share (3 x 40 + 10 = 130 samples) is over three times its size
    small = ChunkMap.regular(40, 8)
    mix = WeightedMix((ChunkMap.regular(390, 16), small), (3.0, 1.0), 520)
    assert mix.takes.tolist() == [390, 130]
    where = mix.positions(0)[1]
    assert (where.passes, where.part) == (3, 10)
    local, sizes = mix.source_pieces(5, 0, 1)
    stream = np.concatenate([np.arange(a, a + n) for a, n in zip(local, sizes, strict=True)])
    for p in range(3):  # each whole pass: every sample once, chunk by chunk
        one = stream[p * 40 : (p + 1) * 40]
        assert sorted(one.tolist()) == list(range(40))
        assert len(np.flatnonzero(np.diff(small.chunks_of(one)))) == small.num_chunks - 1
    counts = Counter(stream.tolist())
    assert set(counts.values()) <= {3, 4}
    assert sum(counts.values()) == 130


def test_a_subsampled_source_is_covered_by_successive_epochs() -> None:
    big = ChunkMap.regular(1000, 20)
    mix = WeightedMix((big, ChunkMap.regular(100, 10)), (1.0, 1.0), 400)  # 200 of 1000
    spec = EpochSpec(batch_size=50, seed=3, window_chunks=4)
    seen: list[int] = []
    for epoch in range(5):
        samples = served(mix, spec, epoch)
        seen += [int(i) for i in samples if i < 1000]
    assert sorted(seen) == list(range(1000))  # five epochs: each of the 1,000 once
    sixth = [int(i) for i in served(mix, spec, 5) if i < 1000]
    assert len(set(sixth)) == 200  # the next cycle: a fresh permutation


def longest_run_without(batches: list[np.ndarray], mix: WeightedMix, source: int) -> int:
    """The most batches in a row that hold no sample of ``source``."""
    longest = run = 0
    for batch in batches:
        run = 0 if source_counts(mix, batch)[source] else run + 1
        longest = max(longest, run)
    return longest


@pytest.mark.parametrize("workers", [0, 2, 4])
@pytest.mark.parametrize(
    ("weights", "sizes", "chunk"),
    [
        ((3, 1), (300, 400), 300),  # one chunk a source: a repeats, b is subsampled
        ((3, 1), (300, 400), 16),
        ((5, 3, 2), (3000, 1800, 1200), 64),
        ((1, 1), (50, 5000), 100),
        ((9, 1), (2000, 2000), 7),
    ],
)
def test_a_mix_is_spread_through_the_epoch_and_every_batch(weights, sizes, chunk, workers):
    """Issue 29.2: no bunching; each batch holds the shares to within one sample."""
    maps = tuple(ChunkMap.regular(n, chunk) for n in sizes)
    mix = WeightedMix(maps, tuple(float(w) for w in weights))
    share = np.asarray(weights) / sum(weights)
    for epoch in range(3):
        spec = EpochSpec(batch_size=16, seed=epoch, window_chunks=2, num_workers=workers)
        batches = plan_epoch(mix, spec, epoch=epoch)
        for w in range(max(1, workers)):  # each worker's batches, and so all of them
            mine = batches[w :: max(1, workers)]
            for source in np.flatnonzero(share * 16 >= 1).tolist():
                assert longest_run_without(mine, mix, source) < 3
        for batch in batches[:-1]:  # and so spread through the whole epoch
            counts = np.asarray(source_counts(mix, batch))
            assert np.abs(counts - 16 * share).max() <= 1.0
        assert source_counts(mix, np.concatenate(batches)) == mix.takes.tolist()


def test_the_rest_of_a_mixed_epoch_keeps_its_served_order() -> None:
    mix = WeightedMix((ChunkMap.regular(90, 9), ChunkMap.regular(20, 5)), (2.0, 1.0))
    delivered = np.zeros(mix.num_samples, dtype=bool)
    delivered[::3] = True
    rest = rest_of(mix, 4, 1, delivered)
    whole = mix.epoch(4, 1)
    served_at = np.empty(len(whole.order), dtype=np.int64)
    served_at[whole.order] = np.arange(len(whole.order))
    parents = np.searchsorted(np.cumsum(whole.sizes), rest.top[rest.starts], side="right")
    assert np.all(np.diff(served_at[parents[rest.order]]) > 0)


def sampler(ranks: int, rank: int, workers: int, **kwargs: object) -> ChunkBatchSampler:
    sources = MixedSources((ChunkMap.regular(80, 8), ChunkMap.regular(12, 4)))
    return ChunkBatchSampler(
        sources,
        6,
        seed=9,
        window_chunks=3,
        num_replicas=ranks,
        rank=rank,
        num_workers=workers,
        weights=(3, 1),
        epoch_samples=100,
        **kwargs,
    )


@pytest.mark.parametrize(("ranks", "workers"), [(1, 0), (1, 2), (3, 0), (3, 2)])
def test_resume_equals_an_uninterrupted_run(ranks, workers) -> None:
    for rank in range(ranks):
        whole = sampler(ranks, rank, workers)
        whole.set_epoch(2)
        expected = list(whole)
        first = sampler(ranks, rank, workers)
        first.set_epoch(2)
        it = iter(first)
        before = [next(it) for _ in range(4)]
        state = first.state_dict()
        assert state["order"] == "weighted"
        assert [p["passes"] for p in state["source_positions"]] == [0, 2]
        again = sampler(ranks, rank, workers)
        again.load_state_dict(state)
        assert before + list(again) == expected


@pytest.mark.parametrize(("old", "new"), [((2, 0), (3, 0)), ((2, 2), (3, 1)), ((1, 0), (1, 2))])
def test_elastic_resume_of_a_mix_serves_every_position_once(old, new) -> None:
    # the positions of epoch 2 (a source repeats: a sample may be served at two positions)
    reference = WeightedMix((ChunkMap.regular(80, 8), ChunkMap.regular(12, 4)), (3.0, 1.0), 100)
    expected = Counter(reference.epoch(9, 2).samples(np.arange(100)).tolist())
    before: Counter[int] = Counter()
    state = None
    for rank in range(old[0]):
        s = sampler(old[0], rank, old[1])
        s.set_epoch(2)
        it = iter(s)
        for _ in range(3):
            before.update(next(it))
        state = state or s.state_dict()
    after: Counter[int] = Counter()
    lengths = set()
    for rank in range(new[0]):
        s = sampler(new[0], rank, new[1])
        s.load_state_dict(state)
        batches = list(s)
        lengths.add(len(batches))
        for b in batches:
            after.update(b)
    assert len(lengths) == 1
    total = before + after
    assert set(total) == set(expected)
    assert all(total[i] >= expected[i] for i in expected)
    left = 100 - sum(before.values())
    assert sum(total.values()) - 100 == new[0] * -(-left // new[0]) - left


def test_a_state_of_other_weights_is_refused() -> None:
    s = sampler(1, 0, 0)
    state = s.state_dict()
    other = ChunkBatchSampler(
        MixedSources((ChunkMap.regular(80, 8), ChunkMap.regular(12, 4))),
        6,
        seed=9,
        window_chunks=3,
        weights=(1, 1),
        epoch_samples=100,
    )
    with pytest.raises(OptionsError, match="sources"):
        other.load_state_dict(state)


def test_weights_need_several_sources() -> None:
    with pytest.raises(OptionsError, match="one weight per source"):
        ChunkBatchSampler(MixedSources((ChunkMap.regular(8, 4),)), 2, weights=(1, 2))
    with pytest.raises(OptionsError, match="mix several sources"):
        ChunkBatchSampler(ChunkMap.regular(8, 4), 2, weights=(1, 2))
    with pytest.raises(OptionsError, match="positive"):
        EpochSpec(batch_size=2, weights=(1, -1))
