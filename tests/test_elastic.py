"""Elastic resume: a mid-epoch state loaded on other ranks or workers finishes the epoch.

Delivered before the save plus delivered after the load is every sample exactly once (plus
the new topology's documented padding); every rank re-plans alone and identically; a state
of other data is refused.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training.loader import make_loader
from h5pack.training.sampler import ChunkBatchSampler, ChunkSampler, EpochSpec
from tests.test_packset_training import COUNTS, build

NUM = 103


def sampler(ranks: int, rank: int, workers: int = 0, **kwargs: object) -> ChunkBatchSampler:
    settings: dict = {"seed": 4, "window_chunks": 2, **kwargs}
    return ChunkBatchSampler(
        ChunkMap.regular(NUM, 7),
        5,
        num_replicas=ranks,
        rank=rank,
        num_workers=workers,
        **settings,
    )


def run_before(ranks: int, workers: int, steps: int, **kwargs: object) -> tuple[list[int], dict]:
    """Every old rank takes ``steps`` batches of epoch 2; returns them and rank 0's state."""
    served, state = [], None
    for rank in range(ranks):
        s = sampler(ranks, rank, workers, **kwargs)
        s.set_epoch(2)
        it = iter(s)
        served += [i for _ in range(steps) for i in next(it)]
        state = state or s.state_dict()
    assert state is not None
    return served, state


def run_after(state: dict, ranks: int, workers: int, **kwargs: object) -> list[list[list[int]]]:
    """Every new rank loads ``state`` on its own and serves the rest of the epoch."""
    out = []
    for rank in range(ranks):
        s = sampler(ranks, rank, workers, **kwargs)
        s.load_state_dict(state)
        s.set_epoch(2)  # a training loop calls it again: the re-planned epoch is kept
        batches = list(s)
        assert len(batches) == len(s)
        out.append(batches)
    return out


def assert_every_sample_once(before: list[int], after: list[list[list[int]]]) -> None:
    """Every sample once, but for the new ranks' padding (sampler note "Ranks")."""
    ranks = len(after)
    assert len({len(batches) for batches in after}) == 1  # equal batches on every rank
    later = [i for batches in after for b in batches for i in b]
    served = Counter(before + later)
    assert sorted(served) == list(range(NUM))
    left = NUM - len(set(before))
    padding = ranks * -(-left // ranks) - left
    assert sum(served.values()) - NUM == len(before) - len(set(before)) + padding


@pytest.mark.parametrize(
    ("old", "new", "steps"),
    [((1, 0), (2, 0), 3), ((2, 0), (3, 0), 4), ((2, 2), (3, 0), 2), ((1, 0), (1, 2), 5)],
)
def test_the_rest_of_the_epoch_goes_to_the_new_topology(old, new, steps) -> None:
    before, state = run_before(*old, steps)
    after = run_after(state, *new)
    assert_every_sample_once(before, after)
    assert run_after(state, *new) == after  # every rank re-plans alone, identically
    # the next epoch is a whole epoch of the new topology
    fresh = sampler(new[0], 0, new[1])
    fresh.set_epoch(3)
    s = sampler(new[0], 0, new[1])
    s.load_state_dict(state)
    s.set_epoch(2)
    list(s)
    s.set_epoch(3)
    assert list(s) == list(fresh)


def test_the_re_planned_epoch_reads_chunks_not_scattered_samples() -> None:
    _, state = run_before(1, 0, 4)
    (batches,) = run_after(state, 1, 2)
    cmap = ChunkMap.regular(NUM, 7)
    # worker w serves batches w, w + 2, ...: each worker's chunks, mostly its own
    chunks = [set(cmap.chunks_of(np.concatenate(batches[w::2])).tolist()) for w in (0, 1)]
    assert len(chunks[0] & chunks[1]) <= 1


def test_two_changes_in_one_epoch() -> None:
    before, state = run_before(1, 0, 3)
    middle = []
    second = None
    for rank in range(2):
        s = sampler(2, rank)
        s.load_state_dict(state)
        it = iter(s)
        middle += [i for _ in range(2) for i in next(it)]
        second = second or s.state_dict()
    assert second is not None
    assert "base" in second
    after = run_after(second, 3, 2)
    assert_every_sample_once(before + middle, after)


def test_drop_last_serves_every_sample_at_most_once() -> None:
    before, state = run_before(2, 0, 3, drop_last=True)
    after = run_after(state, 3, 0, drop_last=True)
    served = before + [i for batches in after for b in batches for i in b]
    assert len(served) == len(set(served))
    assert all(len(b) == 5 for batches in after for b in batches)


def test_the_same_topology_resumes_as_before_on_any_rank() -> None:
    s = sampler(2, 0)
    s.set_epoch(2)
    it = iter(s)
    [next(it) for _ in range(3)]
    state = s.state_dict()
    for rank in (0, 1):
        full = sampler(2, rank)
        full.set_epoch(2)
        resumed = sampler(2, rank)
        resumed.load_state_dict(state)  # rank 0's checkpoint: every rank is at step 3
        assert list(resumed) == list(full)[3:]
    # a state saved before elastic resume (no unit, fingerprint or base) loads as before
    older = {k: v for k, v in state.items() if k not in ("unit", "fingerprint")}
    resumed = sampler(2, 0)
    resumed.load_state_dict(older)
    assert resumed.resume_position == 3


def test_a_stratified_order_is_re_planned_with_its_strata() -> None:
    strata = [c % 3 for c in range(ChunkMap.regular(NUM, 7).num_chunks)]
    before, state = run_before(1, 0, 4, chunk_strata=strata)
    after = run_after(state, 2, 0, chunk_strata=strata)
    assert_every_sample_once(before, after)
    with pytest.raises(OptionsError, match="stratified: saved True, now False"):
        sampler(2, 0).load_state_dict(state)


def test_chunk_sampler_resumes_elastically_by_samples() -> None:
    cmap = ChunkMap.regular(NUM, 7)
    old = ChunkSampler(cmap, EpochSpec(batch_size=1, seed=1, num_replicas=1, rank=0))
    it = iter(old)
    before = [next(it) for _ in range(40)]
    state = old.state_dict()
    later = []
    for rank in range(2):
        new = ChunkSampler(cmap, EpochSpec(batch_size=1, seed=1, num_replicas=2, rank=rank))
        new.load_state_dict(state)
        got = list(new)
        assert len(got) == len(new) == 32  # ceil(63 / 2)
        later += got
    served = Counter(before + later)
    assert sorted(served) == list(range(NUM))
    assert sum(served.values()) == NUM + 1  # one padding sample


# -- the loader ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("elastic")
    return build(base / "set")[0], build(base / "other", seed=8)[0]


def names(loader, steps: int | None = None) -> list[str]:
    """The source paths of the loader's next ``steps`` batches (default: the rest)."""
    if steps is None:
        return [p for _, _, paths in loader for p in paths]
    it = iter(loader)
    return [p for _ in range(steps) for p in next(it)[2]]


@pytest.mark.parametrize(("old", "new"), [((1, 0), (1, 2)), ((1, 2), (2, 0)), ((2, 0), (3, 2))])
def test_loader_state_moves_to_other_ranks_and_workers(sets, old, new) -> None:
    root, _ = sets

    def loader(ranks: int, rank: int, workers: int):
        return make_loader(
            root,
            EpochSpec(batch_size=3, window_chunks=2, num_replicas=ranks, rank=rank),
            num_workers=workers,
            seed=6,
            return_path=True,
        )

    before, state = [], None
    for rank in range(old[0]):
        first = loader(old[0], rank, old[1])
        first.set_epoch(1)
        before += names(first, steps=2)
        state = state or first.state_dict()
    assert state is not None
    assert state["position"] == 2
    after, lengths = [], set()
    for rank in range(new[0]):
        second = loader(new[0], rank, new[1])
        second.load_state_dict(state)
        again = second.state_dict()  # saved before any batch: the same point of the epoch
        assert again["position"] == 0
        assert again["base"]["position"] == 2
        second.set_epoch(1)
        got = names(second)
        lengths.add((len(second), len(got) // 3 + (len(got) % 3 > 0)))
        after += got
        assert second.state_dict()["position"] == len(second)  # the re-planned epoch, done
    assert len(lengths) == 1
    total = sum(COUNTS)
    served = Counter(before + after)
    assert sorted(served) == sorted(f"img_{i:03d}.png" for i in range(total))
    left = total - len(set(before))
    padding = new[0] * -(-left // new[0]) - left
    assert sum(served.values()) == total + (len(before) - len(set(before))) + padding


def test_a_state_of_another_pack_is_refused(sets) -> None:
    root, other = sets
    first = make_loader(
        root, EpochSpec(batch_size=4, num_replicas=1, rank=0), num_workers=0, seed=1
    )
    state = first.state_dict()
    # the same layout (samples, chunks) and labels: only the fingerprint tells them apart
    wrong = make_loader(
        other, EpochSpec(batch_size=4, num_replicas=1, rank=0), num_workers=0, seed=1
    )
    assert wrong.chunk_sampler.state_dict()["num_chunks"] == state["num_chunks"]
    with pytest.raises(OptionsError, match=r"saved on other data \(fingerprint"):
        wrong.load_state_dict(state)
    make_loader(
        root, EpochSpec(batch_size=4, num_replicas=1, rank=0), num_workers=0, seed=1
    ).load_state_dict(state)
