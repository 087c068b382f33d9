"""DecodedCache: round trips, the budget, sharing with DataLoader workers, release of memory."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset

from h5pack.errors import OptionsError
from h5pack.training import cache as cache_module
from h5pack.training.cache import (
    CacheClosedError,
    CacheStats,
    DecodedCache,
    default_cache_bytes,
    shrink,
)

ROOT = Path(__file__).resolve().parents[1]
slow = pytest.mark.slow
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def image(index: int, scale: int = 1) -> np.ndarray:
    """A seeded image whose shape depends on its index (2-D for every seventh)."""
    rng = np.random.default_rng(index)
    shape: tuple[int, ...] = (scale * (3 + index % 5), scale * (4 + index % 7), 3)
    if index % 7 == 6:
        shape = shape[:2]
    return rng.integers(0, 256, shape, dtype=np.uint8)


def checksum(array: np.ndarray) -> int:
    return zlib.crc32(repr(array.shape).encode() + np.ascontiguousarray(array).tobytes())


class CachedDataset(Dataset[tuple[int, int]]):
    """Returns (checksum of the image, 1 if it was 'decoded' here); module level for spawn."""

    def __init__(self, cache: DecodedCache, num: int) -> None:
        self.cache = cache
        self.num = num

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, index: int) -> tuple[int, int]:
        array = self.cache.get(index)
        if array is not None:
            return checksum(array), 0
        array = image(index)  # the decode the cache saves
        self.cache.put(index, array)
        return checksum(array), 1


def fill(cache: DecodedCache, indices: list[int], barrier: Any) -> None:
    """Put big images for ``indices``, starting with the other process (module level)."""
    barrier.wait()
    for index in indices:
        cache.put(index, image(index, scale=8))


def identity(location: str) -> tuple[int, int]:
    st = os.stat(location)
    return st.st_dev, st.st_ino


def holders(key: tuple[int, int]) -> set[int]:
    """Pids of the processes that have the file ``key`` open or mapped."""
    device, inode = key
    mapped = f"{os.major(device):02x}:{os.minor(device):02x} {inode} "
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mapped in (proc / "maps").read_text():
                found.add(int(proc.name))
                continue
            for fd in (proc / "fd").iterdir():
                with_key = os.stat(fd)
                if (with_key.st_dev, with_key.st_ino) == key:
                    found.add(int(proc.name))
                    break
        except OSError:  # gone, or not ours
            continue
    return found


def wait_until(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def cache() -> Iterator[DecodedCache]:
    with DecodedCache(64, 1 << 20) as opened:
        yield opened


# -- one process -------------------------------------------------------------------------------
def test_round_trip_of_mixed_sizes(cache: DecodedCache) -> None:
    arrays = {i: image(i, scale=1 + i % 3) for i in range(0, 64, 3)}
    arrays[1] = image(1, scale=0)  # an empty image
    arrays[2] = np.asfortranarray(image(2))  # any strides
    arrays[4] = image(4)[::2, ::-1]
    for index, array in arrays.items():
        assert cache.put(index, array)
    for index in range(64):
        got = cache.get(index)
        if index not in arrays:
            assert got is None
            continue
        assert got is not None
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, arrays[index])
        assert not got.flags.writeable
    stats = cache.stats()
    assert (stats.entries, stats.hits, stats.misses) == (len(arrays), len(arrays), 64 - len(arrays))


def test_put_twice_keeps_the_first(cache: DecodedCache) -> None:
    assert cache.put(5, image(5))
    assert not cache.put(5, image(6))
    np.testing.assert_array_equal(cache.get(5), image(5))
    assert cache.stats().entries == 1


def test_bad_arguments(cache: DecodedCache) -> None:
    with pytest.raises(IndexError, match="index should be in"):
        cache.get(64)
    with pytest.raises(IndexError):
        cache.put(-1, image(0))
    with pytest.raises(OptionsError, match="uint8"):
        cache.put(0, image(0).astype(np.float32))
    with pytest.raises(OptionsError, match="2-D or 3-D"):
        cache.put(0, image(0)[None])
    with pytest.raises(OptionsError, match="budget_bytes should be at least"):
        DecodedCache(1000, 8000)
    with pytest.raises(OptionsError, match="num_samples"):
        DecodedCache(0, 1 << 20)
    with pytest.raises(OptionsError, match="max_side"):
        DecodedCache(1, 1 << 20, max_side=0)
    assert cache.get(np.int64(3)) is None


def test_budget_is_never_exceeded() -> None:
    budget = 5 * 4096 + 1000  # rounded down to whole pages: the block is 20 KiB
    with DecodedCache(100, budget) as small:
        stored = {i: image(i, scale=2) for i in range(100) if small.put(i, image(i, scale=2))}
        stats = small.stats()
        assert 0 < len(stored) < 100
        assert stats.used_bytes <= budget
        assert os.stat(small.location).st_size <= budget
        assert stats.entries == len(stored)
        assert stats.rejected == 100 - len(stored)
        for index in range(100):
            got = small.get(index)
            if index in stored:
                np.testing.assert_array_equal(got, stored[index])
            else:
                assert got is None


def test_max_side_shrinks_the_shorter_side() -> None:
    big = np.random.default_rng(0).integers(0, 256, (100, 60, 3), dtype=np.uint8)
    with DecodedCache(3, 1 << 20, max_side=30) as small:
        assert small.put(0, big)
        assert small.put(1, big[:20])  # shorter side 20 already: kept as it is
        assert small.put(2, big[:, :, 0])
        assert small.get(0).shape == (50, 30, 3)  # type: ignore[union-attr]
        np.testing.assert_array_equal(small.get(1), big[:20])
        assert small.get(2).shape == (50, 30)  # type: ignore[union-attr]
    one = shrink(np.full((9, 90, 1), 7, dtype=np.uint8), 3)
    assert one.shape == (3, 30, 1)
    assert (one == 7).all()


def test_has_room_says_whether_a_put_would_fit() -> None:
    budget = 5 * 4096  # header and index of 100 samples, then ~11 KiB of records
    with DecodedCache(100, budget) as small:
        assert small.has_room(10_000)
        assert not small.has_room(budget)
        index = 0
        while small.has_room(image(0, scale=4).size):
            assert small.put(index, image(0, scale=4))
            index += 1
        assert index > 0
        assert not small.put(index, image(0, scale=4))  # has_room was right
        assert small.stats().used_bytes <= budget


def test_default_cache_bytes() -> None:
    budget = default_cache_bytes()
    assert 0 < budget < 1 << 50
    assert default_cache_bytes(fraction=1.0) >= budget
    with pytest.raises(OptionsError, match="fraction"):
        default_cache_bytes(fraction=0)


def test_pickle_in_the_same_process(cache: DecodedCache) -> None:
    cache.put(1, image(1))
    twin = pickle.loads(pickle.dumps(cache))
    np.testing.assert_array_equal(twin.get(1), image(1))
    assert twin.put(2, image(2))
    np.testing.assert_array_equal(cache.get(2), image(2))
    twin.close()  # a copy detaches; the block stays
    np.testing.assert_array_equal(cache.get(1), image(1))


def test_closed_cache_raises() -> None:
    closed = DecodedCache(4, 1 << 20)
    closed.put(0, image(0))
    view = closed.get(0)
    closed.close()
    closed.close()
    with pytest.raises(CacheClosedError, match="closed"):
        closed.get(0)
    with pytest.raises(CacheClosedError):
        closed.put(1, image(1))
    with pytest.raises(CacheClosedError):
        pickle.dumps(closed)
    np.testing.assert_array_equal(view, image(0))  # a view outlives the cache


@linux_only
def test_close_and_gc_release_the_memory() -> None:
    closed = DecodedCache(4, 1 << 20)
    closed.put(0, image(0))
    view = closed.get(0)
    key = identity(closed.location)
    closed.close()
    assert os.getpid() in holders(key)  # still mapped for the view
    del view
    assert os.getpid() not in holders(key)

    collected = DecodedCache(4, 1 << 20)
    collected.put(0, image(0))
    key = identity(collected.location)
    finalizer = collected._finalizer
    del collected
    gc.collect()
    assert not finalizer.alive
    assert os.getpid() not in holders(key)


# -- several processes ---------------------------------------------------------------------------
def one_epoch(loader: DataLoader[tuple[int, int]]) -> list[tuple[int, int]]:
    """(checksum, decoded) per sample, in order."""
    return [(int(s), int(d)) for sums, done in loader for s, d in zip(sums, done, strict=True)]


@pytest.mark.parametrize(
    ("context", "persistent"),
    [
        ("fork", True),
        ("fork", False),
        ("spawn", True),
        pytest.param("spawn", False, marks=slow),  # four worker starts: 6 s
        ("forkserver", True),
        pytest.param("forkserver", False, marks=slow),
    ],
)
def test_dataloader_workers_share_the_cache(context: str, persistent: bool) -> None:
    num = 24
    expected = [checksum(image(i)) for i in range(num)]
    with DecodedCache(num, 1 << 20) as shared:
        loader = DataLoader(
            CachedDataset(shared, num),
            batch_size=4,
            num_workers=2,
            multiprocessing_context=context,
            persistent_workers=persistent,
        )
        epochs = [one_epoch(loader)]
        after_first = shared.stats()
        epochs.append(one_epoch(loader))
        after_second = shared.stats()
    assert [s for s, _ in epochs[0]] == expected
    assert [s for s, _ in epochs[1]] == expected
    assert sum(d for _, d in epochs[0]) == num
    assert sum(d for _, d in epochs[1]) == 0  # no decode in epoch 2
    assert (after_first.hits, after_first.misses, after_first.entries) == (0, num, num)
    assert (after_second.hits, after_second.misses, after_second.entries) == (num, num, num)


def check_layout(shared: DecodedCache, expected: dict[int, np.ndarray], budget: int) -> None:
    """Every stored entry reads back exactly, and the space used is theirs, each counted once."""
    stats = shared.stats()
    stored = [i for i in range(shared.num_samples) if shared.get(i) is not None]
    for index in stored:
        np.testing.assert_array_equal(shared.get(index), expected[index])
    records = sum(-(-(32 + expected[i].size) // 64) * 64 for i in stored)
    data_start = -(-(4096 + 8 * shared.num_samples) // 64) * 64
    assert stats.used_bytes == data_start + records <= budget
    assert stats.entries == len(stored)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=slow)])
def test_concurrent_puts_do_not_overlap(context: str) -> None:
    """Two writers race over the same samples while this process reads: no torn entry."""
    num, budget = 120, 256 << 10
    expected = {i: image(i, scale=8) for i in range(num)}
    ctx: Any = multiprocessing.get_context(context)
    with DecodedCache(num, budget) as shared:
        barrier = ctx.Barrier(3)
        order = list(range(num))
        workers = [
            ctx.Process(target=fill, args=(shared, indices, barrier))
            for indices in (order, order[::-1])
        ]
        for worker in workers:
            worker.start()
        barrier.wait()
        while any(worker.is_alive() for worker in workers):
            for index in order:
                got = shared.get(index)
                if got is not None:
                    np.testing.assert_array_equal(got, expected[index])
        for worker in workers:
            worker.join()
            assert worker.exitcode == 0
        assert 0 < shared.stats().entries < num
        check_layout(shared, expected, budget)


def test_concurrent_puts_from_threads() -> None:
    num, budget = 200, 128 << 10
    expected = {i: image(i, scale=4) for i in range(num)}
    with DecodedCache(num, budget) as shared:
        order = list(range(num))
        threads = [
            threading.Thread(target=lambda o=o: [shared.put(i, expected[i]) for i in o])
            for o in (order, order[::-1], order[::2], order[1::2])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert 0 < shared.stats().entries < num
        check_layout(shared, expected, budget)


def test_statistics_slots_of_exited_processes_are_folded() -> None:
    with DecodedCache(4, 1 << 20) as shared:
        words = shared._attached().words
        exited = subprocess.Popen([sys.executable, "-c", ""])
        exited.wait()
        slots = range(cache_module._W_SLOTS, cache_module._W_SLOTS + 3 * cache_module._MAX_SLOTS, 3)
        with cache_module._locked(shared._attached().lock_fd):
            for slot in slots:  # every slot taken: by an exited process, then by a live one
                words[slot], words[slot + 1], words[slot + 2] = exited.pid, 2, 3
            assert cache_module._claim_slot(words, -5) == slots[0]  # folded, then reused
            for slot in slots:
                words[slot] = os.getppid()
            assert cache_module._claim_slot(words, -5) == -1
        shared._slot = -1  # no slot: the shared counters, under the lock
        shared.get(0)
        stats = shared.stats()
        assert (stats.hits, stats.misses) == (2 * len(slots), 3 * len(slots) + 1)


def test_file_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path without memfd (macOS), forced: a temporary file, removed by close."""
    monkeypatch.setattr(cache_module, "_USE_MEMFD", False)
    ctx: Any = multiprocessing.get_context("fork")
    named = DecodedCache(40, 256 << 10)
    backing = Path(named.location)
    try:
        assert not named.location.startswith("/proc")
        named.put(0, image(0))
        twin = pickle.loads(pickle.dumps(named))  # attaches by path
        np.testing.assert_array_equal(twin.get(0), image(0))
        barrier = ctx.Barrier(1)
        worker = ctx.Process(target=fill, args=(twin, list(range(1, 40)), barrier))
        worker.start()
        worker.join()
        assert worker.exitcode == 0
        np.testing.assert_array_equal(named.get(1), image(1, scale=8))
        twin.close()
        np.testing.assert_array_equal(named.get(1), image(1, scale=8))
        assert backing.exists()
    finally:
        named.close()
    assert not backing.exists()


KILLED = """
import os, sys
sys.path.insert(0, {root!r})
from torch.utils.data import DataLoader
from h5pack.training.cache import DecodedCache
from tests.test_cache import CachedDataset

if __name__ == "__main__":
    cache = DecodedCache(32, 4 << 20)
    loader = DataLoader(CachedDataset(cache, 32), batch_size=4, num_workers=2,
                        persistent_workers=True, multiprocessing_context={context!r})
    assert sum(int(d.sum()) for _, d in loader) == 32
    print(os.getpid(), cache.location, cache.stats().entries, flush=True)
    sys.stdin.read()  # until the test kills this process
"""


def shm_mapped_by(pids: set[int]) -> set[Path]:
    """Files under /dev/shm that the processes ``pids`` map (e.g. the loader's semaphores)."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if " /dev/shm/" in line:
                    found.add(Path(line[line.index("/dev/shm/") :].removesuffix(" (deleted)")))
    return found


@linux_only
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=slow)])
def test_kill_9_leaves_nothing(tmp_path: Path, context: str) -> None:
    """The owner is killed; once its orphaned workers exit, the memory is gone."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED.format(root=str(ROOT), context=context))
    command = [sys.executable, str(script)]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            pid, location, entries = proc.stdout.readline().split()
            assert (int(pid), int(entries)) == (proc.pid, 32)
            key = identity(location)
            users = holders(key)
            assert proc.pid in users
            assert len(users) == 3  # the owner and its two workers
            named = shm_mapped_by(users)  # the DataLoader's own semaphores, if any
            assert not any("h5pack" in path.name for path in named)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
    # Orphaned workers notice within their status interval (5 s) and exit; the memfd has no
    # name, so then nothing holds it and the kernel frees it. The waits are generous: a busy
    # machine may take long to run the workers' checks and exits.
    assert wait_until(lambda: not holders(key), timeout_s=300), holders(key)
    # Nothing of ours stays in /dev/shm (the resource tracker removes the loader's semaphores).
    assert wait_until(lambda: not any(path.exists() for path in named), timeout_s=300), named


def test_stats_is_a_frozen_dataclass(cache: DecodedCache) -> None:
    stats = cache.stats()
    assert isinstance(stats, CacheStats)
    with pytest.raises(AttributeError):
        stats.hits = 3  # type: ignore[misc]
