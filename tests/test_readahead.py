"""Planned read-ahead against a fake byte source: requests, bytes, depth, merging, cache."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from h5pack.errors import OptionsError
from h5pack.read.diskcache import DiskCache, DiskCacheOptions, pack_key
from h5pack.read.readahead import ReadAhead, ReadAheadOptions

KEY = pack_key("x" * 32, 1, None)


class FakeSource:
    """An object in memory that counts its ranged reads and the most at once."""

    url = "fake://bucket/pack.h5"
    remote = True

    def __init__(self, data: bytes, *, gate: threading.Event | None = None) -> None:
        self.data = data
        self.gate = gate
        self.ranges: list[tuple[int, int]] = []
        self.active = 0
        self.most_active = 0
        self.lock = threading.Lock()

    def close(self) -> None:
        pass

    def read_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return [self.read_range(start, end - start) for start, end in ranges]

    def read_range(self, offset: int, size: int) -> bytes:
        with self.lock:
            self.ranges.append((offset, size))
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            self.active -= 1
        return self.data[offset : offset + size]


def layout(num: int, *, gap: int = 7) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``num`` chunks of uneven sizes, ``gap`` bytes apart (0: adjacent)."""
    sizes = np.array([100 + 13 * (c % 5) for c in range(num)], dtype=np.int64)
    offsets = np.concatenate([[64], 64 + np.cumsum(sizes + gap)[:-1]]).astype(np.int64)
    data = np.random.default_rng(0).integers(0, 256, int(offsets[-1] + sizes[-1]) + 64)
    return data.astype(np.uint8).tobytes(), offsets, sizes


def expect(data: bytes, offsets: np.ndarray, sizes: np.ndarray, chunk: int) -> bytes:
    return data[int(offsets[chunk]) : int(offsets[chunk] + sizes[chunk])]


def test_options_refuse_bad_values() -> None:
    with pytest.raises(OptionsError, match="requests_in_flight"):
        ReadAheadOptions(requests_in_flight=0)
    with pytest.raises(OptionsError, match="merge_bytes"):
        ReadAheadOptions(merge_bytes=-1)


def test_one_request_per_chunk_and_only_its_bytes() -> None:
    data, offsets, sizes = layout(50)
    source = FakeSource(data)
    ahead = ReadAhead(source, offsets, sizes)
    plan = np.random.default_rng(1).permutation(50)
    ahead.plan(plan)
    for chunk in plan.tolist():
        assert ahead.get(chunk).tobytes() == expect(data, offsets, sizes, chunk)
    ahead.close()
    assert ahead.stats.requests == 50
    assert sorted(source.ranges) == sorted(zip(offsets.tolist(), sizes.tolist(), strict=True))
    assert ahead.stats.fetched_bytes == int(sizes.sum())
    assert ahead.stats.off_plan == 0


def test_requests_go_out_ahead_of_use_with_several_in_flight() -> None:
    data, offsets, sizes = layout(20)
    gate = threading.Event()
    source = FakeSource(data, gate=gate)
    ahead = ReadAhead(source, offsets, sizes, options=ReadAheadOptions(requests_in_flight=5))
    ahead.plan(range(20))
    for _ in range(1000):  # the threads start their requests before anything is asked
        if source.most_active == 5:
            break
        threading.Event().wait(0.001)
    assert source.most_active == 5
    gate.set()
    for chunk in range(20):
        ahead.get(chunk)
    ahead.close()
    assert source.most_active == 5  # never more than the depth
    assert ahead.stats.most_in_flight == 5


def test_adjacent_chunks_of_the_plan_are_merged() -> None:
    data, offsets, sizes = layout(40, gap=0)
    source = FakeSource(data)
    merge = int(sizes[:10].sum())
    ahead = ReadAhead(source, offsets, sizes, options=ReadAheadOptions(merge_bytes=merge))
    ahead.plan(range(40))
    for chunk in range(40):
        assert ahead.get(chunk).tobytes() == expect(data, offsets, sizes, chunk)
    ahead.close()
    assert ahead.stats.requests < 10
    assert ahead.stats.fetched_bytes == int(sizes.sum())
    assert max(size for _, size in source.ranges) <= merge


def test_memory_ahead_stays_under_the_budget() -> None:
    data, offsets, sizes = layout(30)
    gate = threading.Event()
    source = FakeSource(data, gate=gate)
    budget = int(sizes[:3].sum())
    options = ReadAheadOptions(requests_in_flight=10, ahead_bytes=budget)
    ahead = ReadAhead(source, offsets, sizes, options=options)
    ahead.plan(range(30))
    assert ahead._held_bytes <= budget
    gate.set()
    for chunk in range(30):
        ahead.get(chunk)
        assert ahead._held_bytes <= budget
    ahead.close()


def test_off_plan_and_skipped_chunks_are_still_served() -> None:
    data, offsets, sizes = layout(200)
    source = FakeSource(data)
    ahead = ReadAhead(source, offsets, sizes, options=ReadAheadOptions(requests_in_flight=4))
    ahead.plan(range(100))
    assert ahead.get(150).tobytes() == expect(data, offsets, sizes, 150)  # not planned
    assert ahead.get(120 - 100).tobytes() == expect(data, offsets, sizes, 20)  # a jump
    for chunk in range(21, 100):  # a resumed epoch carries on from there
        assert ahead.get(chunk).tobytes() == expect(data, offsets, sizes, chunk)
    assert ahead.get(3).tobytes() == expect(data, offsets, sizes, 3)  # dropped as skipped
    assert ahead.get(30).tobytes() == expect(data, offsets, sizes, 30)  # asked again
    ahead.close()
    assert ahead.stats.off_plan == 3
    assert ahead.stats.requests <= 80 + 3 + 2 * 4 + 2  # the chunks before the jump: few wasted


def test_measured_depth_follows_latency_and_demand() -> None:
    data, offsets, sizes = layout(4)
    ahead = ReadAhead(FakeSource(data), offsets, sizes)
    assert ahead.depth() == 4  # nothing measured yet
    # 10 ms per request of 100 bytes; the reader takes 100 bytes per ms: 10 x 1.5 + 1.
    ahead._request_s, ahead._request_bytes, ahead._measured = 1.0, 10_000, 100
    ahead._busy_s, ahead._consumed_bytes = 1.0, 100_000
    assert ahead.depth() == 16
    ahead._busy_s = 100.0  # a slow reader needs few
    assert ahead.depth() == 2


def test_a_failed_request_raises_in_the_reader() -> None:
    class Broken(FakeSource):
        def read_range(self, offset: int, size: int) -> bytes:
            raise OSError("connection reset")

    data, offsets, sizes = layout(5)
    ahead = ReadAhead(Broken(data), offsets, sizes)
    ahead.plan(range(5))
    with pytest.raises(OSError, match="connection reset"):
        ahead.get(0)
    ahead.close()


def test_a_short_read_is_never_served() -> None:
    class Short(FakeSource):
        def read_range(self, offset: int, size: int) -> bytes:
            return super().read_range(offset, size)[:-1]

    data, offsets, sizes = layout(3)
    ahead = ReadAhead(Short(data), offsets, sizes)
    ahead.plan(range(3))
    with pytest.raises(OSError, match="returned"):
        ahead.get(0)
    ahead.close()


def test_the_disk_cache_serves_the_second_pass(tmp_path: Path) -> None:
    data, offsets, sizes = layout(30)
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=10**6))
    source = FakeSource(data)
    for _ in range(2):
        ahead = ReadAhead(source, offsets, sizes, cache=cache, pack=KEY)
        plan = np.random.default_rng(3).permutation(30)
        ahead.plan(plan)
        for chunk in plan.tolist():
            assert ahead.get(chunk).tobytes() == expect(data, offsets, sizes, chunk)
        ahead.close()
    assert len(source.ranges) == 30  # the second pass made no request
    assert ahead.stats.cache_hits == 30


def test_a_failed_download_releases_its_claim(tmp_path: Path) -> None:
    class Broken(FakeSource):
        def read_range(self, offset: int, size: int) -> bytes:
            raise OSError("reset")

    data, offsets, sizes = layout(2)
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=10**6))
    ahead = ReadAhead(Broken(data), offsets, sizes, cache=cache, pack=KEY)
    ahead.plan([0])
    with pytest.raises(OSError, match="reset"):
        ahead.get(0)
    ahead.close()
    assert cache.usage_bytes() == 0
    assert cache.claim(KEY, 0, int(sizes[0])).kind == "claimed"


def test_off_plan_chunks_asked_together_are_fetched_together() -> None:
    data, offsets, sizes = layout(10)
    gate = threading.Event()
    source = FakeSource(data, gate=gate)
    ahead = ReadAhead(source, offsets, sizes)
    threading.Timer(0.5, gate.set).start()  # released once all are under way (or not)
    got = ahead.get_many([7, 2, 5])  # no plan: all three off-plan
    assert [g.tobytes() for g in got] == [expect(data, offsets, sizes, c) for c in (7, 2, 5)]
    assert source.most_active == 3
    assert ahead.stats.off_plan == 3
    ahead.close()


def test_read_aheads_of_a_process_share_one_pool_of_threads() -> None:
    # NOTE [ One read-ahead pool per process ]: loaders and shards come and go, the threads stay
    data, offsets, sizes = layout(12)
    before = {t.name for t in threading.enumerate() if t.name.startswith("h5pack-readahead")}
    for _ in range(3):  # three loaders, one after the other
        aheads = [ReadAhead(FakeSource(data), offsets, sizes) for _ in range(4)]  # a set's shards
        for ahead in aheads:
            ahead.plan(np.arange(12))
        for ahead in aheads:
            for chunk in range(12):
                assert ahead.get(chunk).tobytes() == expect(data, offsets, sizes, chunk)
            ahead.close()
    threads = {t.name for t in threading.enumerate() if t.name.startswith("h5pack-readahead")}
    assert len(threads - before) <= ReadAheadOptions().threads
    assert aheads[0]._executor() is aheads[1]._executor()


def test_close_cancels_only_its_own_queued_requests() -> None:
    data, offsets, sizes = layout(8)
    gate = threading.Event()
    slow = ReadAhead(FakeSource(data, gate=gate), offsets, sizes)
    slow.plan(np.arange(8))
    other = ReadAhead(FakeSource(data), offsets, sizes)
    other.plan(np.arange(8))
    gate.set()
    slow.close()  # waits for its running requests, cancels its queued ones
    assert not slow._tasks
    for chunk in range(8):  # the shared pool still serves the other reader
        assert other.get(chunk).tobytes() == expect(data, offsets, sizes, chunk)
    other.close()
