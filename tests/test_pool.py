"""One pool of reading threads for a mix's sources (read/pool.py): chunk reads counted."""

from __future__ import annotations

import multiprocessing
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from h5pack.core.layout import Compression
from h5pack.errors import OptionsError
from h5pack.read.pool import ReadPool, start_loads
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.epochs import EpochSpec
from h5pack.training.loader import make_loader
from h5pack.training.mixed import H5MixDataset
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

CHUNK = 8  # samples per chunk of every pack here


def _pack(path: Path, count: int, *, seed: int, compressed: bool = True) -> Path:
    rng = np.random.default_rng(seed)
    images = list(rng.integers(0, 256, (count, 6, 6, 3), dtype=np.uint8))
    compression = Compression(codec="zstd" if compressed else "none")
    options = ConvertOptions(chunk_samples=CHUNK, compression=compression)
    write_arrays(path, images, [i % 2 for i in range(count)], options=options, classes=["x", "y"])
    return path


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pool")
    return {
        # 100 % 8 = 4 and 27 % 8 = 3: a short last chunk in each
        "a": _pack(root / "a.h5", 100, seed=1),
        "b": _pack(root / "b.h5", 27, seed=2),
        "plain": _pack(root / "plain.h5", 40, seed=3, compressed=False),
    }


def _reader(path: Path, threads: int = 2, window: int = 4) -> PackReader:
    return PackReader(path, ReaderOptions(threads=threads, window_chunks=window))


@pytest.fixture
def loaded_groups(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, int]]:
    """Count every group decompressed, by (pack, group): chunk reads, never time."""
    counts: Counter[tuple[str, int]] = Counter()
    load = PackReader._load_group

    def counted(self: PackReader, group: int, *args: object) -> np.ndarray:
        counts[(Path(self.path).name, group)] += 1
        return load(self, group, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(PackReader, "_load_group", counted)
    return counts


def test_loading_together_serves_the_next_read_without_a_load(packs) -> None:
    pool = ReadPool(2)
    a, b = _reader(packs["a"]), _reader(packs["b"])
    a.use_pool(pool)
    b.use_pool(pool)
    picks_a, picks_b = np.array([3, 17, 9, 30, 2]), np.array([26, 0])  # chunks 0, 2, 1, 3; 3, 0
    loading = start_loads(pool, [(a, picks_a), (b, picks_b)])
    assert [(Path(x.reader.path).name, x.group) for x in loading.loads] == [
        ("a.h5", 0),
        ("a.h5", 2),
        ("a.h5", 1),
        ("a.h5", 3),
        ("b.h5", 3),
        ("b.h5", 0),
    ]
    assert loading.finish() == 6
    assert (a.loads, b.loads) == (4, 2)
    out_a = np.empty((5, 6, 6, 3), dtype=np.uint8)
    out_b = np.empty((2, 6, 6, 3), dtype=np.uint8)
    a.read_into(picks_a, out_a)
    b.read_into(picks_b, out_b)
    assert (a.loads, b.loads) == (4, 2)  # served from the held groups
    with _reader(packs["a"], threads=0) as fresh_a, _reader(packs["b"], threads=0) as fresh_b:
        assert np.array_equal(out_a, np.stack(fresh_a.read_images(picks_a)))
        assert np.array_equal(out_b, np.stack(fresh_b.read_images(picks_b)))
    # groups already in the window are not loaded again; nothing for an uncompressed pack
    with _reader(packs["plain"]) as plain:
        assert start_loads(pool, [(a, picks_a), (plain, np.arange(10))]).finish() == 0
    a.close()
    b.close()
    assert pool.map(abs, [-1, -2]) == [1, 2]  # the readers left the shared threads up
    pool.close()


def test_the_window_and_the_loads_are_those_of_reading_alone(packs) -> None:
    """Loading ahead changes nothing of the window's order: the same chunks, the same times."""
    rng = np.random.default_rng(4)
    batches = [rng.choice(100, size=int(rng.integers(1, 30)), replace=False) for _ in range(40)]
    pool = ReadPool(2)
    alone, ahead = _reader(packs["a"], window=3), _reader(packs["a"], window=3)
    ahead.use_pool(pool)
    for batch in batches:
        out_alone = np.empty((batch.size, 6, 6, 3), dtype=np.uint8)
        out_ahead = np.empty_like(out_alone)
        alone.read_into(batch, out_alone)
        start_loads(pool, [(ahead, batch)]).finish()
        ahead.read_into(batch, out_ahead)
        assert np.array_equal(out_alone, out_ahead)
        assert alone.loads == ahead.loads
        assert list(alone._window.window) == list(ahead._window.window)
    alone.close()
    ahead.close()
    pool.close()


def test_a_held_group_that_no_read_took_is_dropped_at_the_next_loads(packs) -> None:
    pool = ReadPool(2)
    reader = _reader(packs["a"])
    reader.use_pool(pool)
    assert start_loads(pool, [(reader, np.array([0, 8]))]).finish() == 2  # held, never read
    assert start_loads(pool, [(reader, np.array([0, 16]))]).finish() == 2  # 0 again: not held now
    out = np.empty((2, 6, 6, 3), dtype=np.uint8)
    reader.read_into(np.array([0, 16]), out)
    assert reader.loads == 4
    reader.close()
    pool.close()


@pytest.mark.parametrize(
    ("weights", "epoch_samples", "passes"),
    [
        ((100, 27), 127, (1, 1)),  # every sample of both sources once
        ((1, 3), 108, (None, 3)),  # 27 of a (a part of a pass), 81 of b: 3 whole passes
    ],
)
def test_a_mix_decompresses_each_chunk_once_per_pass(
    packs, loaded_groups, weights, epoch_samples, passes
) -> None:
    """With the shared pool, each chunk of a source once per pass of that source."""
    loader = make_loader(
        [packs["a"], packs["b"]],
        EpochSpec(batch_size=16, epoch_samples=epoch_samples, window_chunks=2),
        weights=list(weights),
        num_workers=0,
        seed=5,
        reader=ReaderOptions(threads=2),
    )
    dataset = loader.dataset
    assert isinstance(dataset, H5MixDataset)
    assert dataset.pool is not None
    assert dataset.pool.threads == 2
    chunks = {"a.h5": 13, "b.h5": 4}  # ceil(100 / 8), ceil(27 / 8)
    for epoch in range(3):
        loaded_groups.clear()
        loader.set_epoch(epoch)
        assert sum(len(labels) for _, labels in loader) == epoch_samples
        for (name, count), each in zip(chunks.items(), passes, strict=True):
            loads = [loaded_groups[(name, group)] for group in range(count)]
            # never twice in a pass (a chunk still in the window from the pass, or the
            # epoch, before is not loaded again)
            assert max(loads) <= (each or 1)
            if epoch == 0 and each is not None:  # fresh readers: every chunk, once a pass
                assert min(loads) >= 1
                if each == 1:
                    assert loads == [1] * count
    for part in dataset.parts:
        reader = part.reader
        assert isinstance(reader, PackReader)
        assert reader._window.shared is dataset.pool  # the sources' threads are the mix's
        assert reader._window.own is None  # and no reader started its own


def test_the_shared_pool_changes_no_pixel_and_no_load(packs, loaded_groups) -> None:
    def loader(pool: bool):
        built = make_loader(
            [packs["a"], packs["b"]],
            16,
            weights=[2, 1],
            num_workers=0,
            seed=3,
            reader=ReaderOptions(threads=2),
        )
        if not pool:  # each source on its own threads, as before the shared pool
            built.dataset.pool = None
            for part in built.dataset.parts:
                part.pool = None
        return built

    runs = []
    for pool in (True, False):
        built = loader(pool)
        loaded_groups.clear()
        batches = []
        for epoch in range(2):
            built.set_epoch(epoch)
            batches += [(images.clone(), labels.clone()) for images, labels in built]
        runs.append((batches, Counter(loaded_groups)))
    (shared, shared_loads), (alone, alone_loads) = runs
    assert shared_loads == alone_loads
    assert len(shared) == len(alone)
    for (images, labels), (images_alone, labels_alone) in zip(shared, alone, strict=True):
        assert np.array_equal(images.numpy(), images_alone.numpy())
        assert np.array_equal(labels.numpy(), labels_alone.numpy())


def test_a_pool_travels_without_its_threads_and_restarts_after_fork(packs) -> None:
    pool = ReadPool(2)
    assert pool.map(abs, [-3, -4]) == [3, 4]
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.threads == 2
    assert copy._executor is None
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as child:  # the parent's executor has no threads in the child
        assert child.apply(_map_in_child, (pool,)) == [5, 6]
    pool.close()
    with pytest.raises(OptionsError, match="threads should be >= 1"):
        ReadPool(0)


def _map_in_child(pool: ReadPool) -> list[int]:
    return pool.map(abs, [-5, -6])


def test_one_thread_and_workers_need_no_shared_pool(packs) -> None:
    one = make_loader(
        [packs["a"], packs["b"]], 8, weights=[1, 1], num_workers=0, reader=ReaderOptions(threads=1)
    )
    assert one.dataset.pool is None
    workers = make_loader([packs["a"], packs["b"]], 8, weights=[1, 1], num_workers=2)
    assert workers.dataset.pool is None  # a worker reads on its own thread
    assert sum(len(labels) for _, labels in workers) == 127


def test_workers_with_threads_share_a_pool_each(packs) -> None:
    """Each DataLoader worker makes its own threads for the shared pool (after fork)."""

    def batches(pool: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        loader = make_loader(
            [packs["a"], packs["b"]],
            8,
            weights=[2, 1],
            num_workers=2,
            seed=4,
            reader=ReaderOptions(threads=2),
        )
        assert loader.dataset.pool is not None
        if not pool:  # each source's reader on its own threads
            loader.dataset.pool = None
            for part in loader.dataset.parts:
                part.pool = None
        loader.set_epoch(1)
        return [(images.numpy().copy(), labels.numpy().copy()) for images, labels in loader]

    shared, alone = batches(True), batches(False)
    assert len(shared) == len(alone) == -(-127 // 8)
    for (images, labels), (images_alone, labels_alone) in zip(shared, alone, strict=True):
        assert np.array_equal(images, images_alone)
        assert np.array_equal(labels, labels_alone)
