"""Batches from workers through the ring of reused shared-memory buffers (NOTE [ Batch ring ])."""

import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.multiprocessing

from h5pack import make_loader
from h5pack.training import ring as ring_module
from h5pack.training.ring import BatchRing, RingCollate
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

NUM = 40


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ring")
    rng = np.random.default_rng(3)
    labels = [i % 5 for i in range(NUM)]
    options = ConvertOptions(chunk_bytes=8192, seed=1)
    raw = root / "raw.h5"
    write_arrays(raw, list(rng.integers(0, 256, (NUM, 24, 20, 3), dtype=np.uint8)), labels,
                 options=options)  # fmt: skip
    variable = root / "variable.h5"
    sizes = [(30, 20), (18, 26), (24, 24)]
    arrays = [rng.integers(0, 256, (*sizes[i % 3], 3), dtype=np.uint8) for i in range(NUM)]
    write_arrays(variable, arrays, labels, options=options)
    return {"raw": raw, "variable": variable}


def cross(batch):
    """``batch`` pickled as a worker's result queue pickles it, and unpickled."""
    return pickle.loads(bytes(ForkingPickler.dumps(batch)))


def in_worker(monkeypatch, worker: int = 0) -> None:
    info = SimpleNamespace(id=worker, num_workers=2)
    monkeypatch.setattr(ring_module, "get_worker_info", lambda: info)


def test_a_slot_is_not_handed_out_again_while_its_batch_is_referenced(monkeypatch):
    ring = BatchRing(workers=2, slots=2)
    in_worker(monkeypatch, 1)
    collate = RingCollate(lambda samples: (samples, torch.arange(3)), ring)
    first = collate(ring.buffer((2, 3)).fill_(7))
    second = collate(ring.buffer((2, 3)).fill_(8))
    assert ring.fallbacks == 0
    assert list(ring.states) == [0, 0, 1, 1]  # worker 1's slots, taken
    third = ring.buffer((2, 3))  # no slot free: a fresh buffer, the ring does not block
    assert ring.fallbacks == 1
    assert ring.slot_of(third) is None
    monkeypatch.undo()  # the main process unpickles (same process: the ring is found)
    images_1, labels_1 = cross(first)
    images_2, _ = cross(second)
    assert torch.equal(images_1, torch.full((2, 3), 7, dtype=torch.uint8))
    assert torch.equal(labels_1, torch.arange(3))
    assert ring.held() == {2, 3}
    view = images_1[1:]  # a view keeps the buffer in use
    del images_1
    assert ring.release_unused() == 0
    assert list(ring.states) == [0, 0, 1, 1]
    del view
    assert ring.release_unused() == 1
    assert list(ring.states) == [0, 0, 0, 1]
    in_worker(monkeypatch, 1)
    again = ring.buffer((2, 3))
    assert ring.slot_of(again) == 2  # the freed slot, and its buffer, are reused
    assert torch.equal(images_2, torch.full((2, 3), 8, dtype=torch.uint8))  # untouched


def test_a_buffer_crosses_once_then_only_its_slot(monkeypatch):
    ring = BatchRing(workers=1, slots=1)
    in_worker(monkeypatch)
    collate = RingCollate(lambda samples: (samples,), ring)
    sizes = []
    for _ in range(3):
        batch = collate(ring.buffer((4, 5)))
        sizes.append(len(ForkingPickler.dumps(batch)))
        ring.states[0] = 0  # as the main process does once the batch is released
    assert sizes[1] == sizes[2] < sizes[0]


def kept_epoch(path: Path, workers: int, epoch: int = 1) -> tuple[list, list]:
    """An epoch's batches, every one kept (more than the ring holds), and the main process's."""
    loader = make_loader(path, 2, size=16, flip=True, num_workers=workers, seed=2)
    loader.set_epoch(epoch)
    batches = list(loader)
    ring = loader.dataset.ring
    if workers:  # the first slots' batches came through the ring, the rest in fresh buffers
        assert ring is not None
        assert ring.arrivals == ring.workers * ring.slots < len(batches)
    dataset = loader.dataset
    dataset.set_epoch(epoch)  # the same samples, crops and flips, read here
    expected = [dataset.__getitems__(list(batch)) for batch in loader.batch_sampler]
    return batches, expected


@pytest.mark.parametrize("kind", ["raw", "variable"])
def test_two_workers_give_the_main_process_pixels_even_when_every_batch_is_kept(packs, kind):
    for workers in (0, 2):
        batches, expected = kept_epoch(packs[kind], workers)
        assert len(batches) == len(expected) == NUM // 2
        for (images, labels), want in zip(batches, expected, strict=True):
            assert torch.equal(images, want.images)
            assert torch.equal(labels, want.labels)
        seen = sorted(int(label) for _, labels in batches for label in labels)
        assert seen == sorted(i % 5 for i in range(NUM))  # every sample once


def test_batches_released_each_step_reuse_the_slots_and_keep_their_pixels(packs):
    loader = make_loader(packs["raw"], 4, size=16, flip=True, num_workers=2, seed=2)
    dataset = loader.dataset
    for epoch in (0, 1, 2):
        loader.set_epoch(epoch)
        plan = [list(batch) for batch in loader.batch_sampler]
        loader.set_epoch(epoch)
        got = [(images.clone(), labels) for images, labels in loader]  # each batch let go
        dataset.set_epoch(epoch)
        for (images, labels), batch in zip(got, plan, strict=True):
            want = dataset.__getitems__(batch)
            assert torch.equal(images, want.images)
            assert torch.equal(labels, want.labels)
    ring = dataset.ring
    assert ring is not None
    assert ring.arrivals == 3 * NUM // 4  # every batch through a slot: none fell back


def test_a_loader_s_dataset_pickled_outside_a_process_start_has_its_ring_off(packs, monkeypatch):
    loader = make_loader(packs["raw"], 4, size=16, num_workers=2, seed=2)
    copy = pickle.loads(pickle.dumps(loader.dataset))
    assert copy.ring.states is None
    in_worker(monkeypatch)
    buffer = copy.ring.buffer((2, 3))  # a fresh segment: the ring never hands out a slot
    assert copy.ring.fallbacks == 1
    assert copy.ring.slot_of(buffer) is None


@pytest.mark.slow  # spawned workers import torch again
def test_spawned_workers_share_the_ring(packs):
    loader = make_loader(
        packs["raw"], 4, size=16, num_workers=2, seed=2, multiprocessing_context="spawn"
    )
    plan = [list(batch) for batch in loader.batch_sampler]
    got = [(images.clone(), labels) for images, labels in loader]
    dataset = loader.dataset
    for (images, _), batch in zip(got, plan, strict=True):
        assert torch.equal(images, dataset.__getitems__(batch).images)
    assert dataset.ring.arrivals == len(plan)  # every batch through a slot


def test_local_batches_reuse_a_buffer_only_once_nothing_references_it():
    pool = ring_module.LocalBatches()
    first = pool.take((4, 5))
    address = first.data_ptr()
    view = first.permute(1, 0)
    array = first.numpy()
    del first
    assert pool.take((4, 5)).data_ptr() != address  # a view still holds it
    del view
    assert pool.take((4, 5)).data_ptr() != address  # and a numpy array of it
    del array
    again = pool.take((4, 5))
    assert again.data_ptr() == address  # nothing left: reused
    held = [pool.take((4, 5)) for _ in range(5)]  # more than it keeps: fresh ones
    assert len({t.data_ptr() for t in [again, *held]}) == 6
    assert pool.take((2, 2)).shape == (2, 2)


def test_where_torch_cannot_count_references_every_batch_gets_a_fresh_buffer(packs, monkeypatch):
    """The fallback of the use count (a torch internal), and its report."""
    from h5pack.bench.system import machine_info

    monkeypatch.setattr(ring_module, "_STORAGE_USE_COUNT", None)
    pool = ring_module.LocalBatches()
    first = pool.take((4, 5))
    address = first.data_ptr()
    del first
    assert pool.take((4, 5)).data_ptr() != address  # never found unreferenced
    assert "fresh buffers" in machine_info().describe()
    loader = make_loader(packs["raw"], 4, size=16, flip=True, num_workers=2, seed=2)
    plan = [list(batch) for batch in loader.batch_sampler]
    got = [(images.clone(), labels) for images, labels in loader]  # each batch let go
    for (images, labels), batch in zip(got, plan, strict=True):
        want = loader.dataset.__getitems__(batch)
        assert torch.equal(images, want.images)
        assert torch.equal(labels, want.labels)


def test_in_process_batches_kept_by_the_loop_are_never_overwritten(tmp_path):
    """Every batch of two epochs kept in a list: each still holds its own pixels."""
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (12, 12, 3), dtype=np.uint8) for _ in range(40)]
    path = tmp_path / "raw.h5"
    write_arrays(path, images, [0] * 40, options=ConvertOptions(chunk_samples=8))
    loader = make_loader(path, 4, size=8, flip=True, num_workers=0, seed=2)
    kept, copies = [], []
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch, _ in loader:
            kept.append(batch)
            copies.append(batch.clone())
    assert all(torch.equal(a, b) for a, b in zip(kept, copies, strict=True))
    released = []  # and when the loop drops them, the buffers come round again
    for batch, _ in loader:
        released.append(batch.data_ptr())
        del batch
    assert len(set(released)) < len(released)
