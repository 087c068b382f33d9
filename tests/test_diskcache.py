"""The disk chunk cache: budget, Belady against LRU, claims across processes, crashes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from h5pack.errors import OptionsError
from h5pack.read.diskcache import DiskCache, DiskCacheOptions, DiskCacheWarning, pack_key
from h5pack.read.eviction import Candidate, Future, choose_victims, next_uses
from tests.helpers import disk_cache_reserve as reserve

CHUNK = 4096  # a whole block: a chunk's file takes what it holds
ROOM = 1 << 20  # more than the ledger and the rest of a small cache's directory take


PACK = pack_key("p" * 32, 10**6, '"etag"')


def chunk_bytes(chunk: int, nbytes: int = CHUNK) -> np.ndarray:
    return np.random.default_rng(chunk).integers(0, 256, nbytes, dtype=np.uint8)


def orders(num_chunks: int, epochs: int) -> list[np.ndarray]:
    return [np.random.default_rng([7, e]).permutation(num_chunks) for e in range(epochs)]


def future_of(plans: list[np.ndarray], epoch: int) -> Future:
    """This epoch's and the next one's uses, at epoch + position / chunks."""
    chunks, times = [], []
    for e in (epoch, epoch + 1):
        if e < len(plans):
            chunks.extend(plans[e].tolist())
            times.extend(e + np.arange(len(plans[e])) / len(plans[e]))
    return Future.of(chunks, times)


def run_epochs(cache: DiskCache, num_chunks: int, epochs: int, *, sizes: bool = False) -> list[int]:
    """Read every chunk once per epoch through the cache; return the bytes downloaded."""
    plans = orders(num_chunks, epochs)
    downloaded = []
    for epoch, plan in enumerate(plans):
        cache.set_future(PACK, future_of(plans, epoch), now=float(epoch))
        got = 0
        for position, chunk in enumerate(plan.tolist()):
            nbytes = CHUNK * (1 + chunk % 7) if sizes else CHUNK
            claim = cache.claim(PACK, chunk, nbytes, now=epoch + position / num_chunks)
            if claim.kind == "hit":
                assert claim.data is not None
                np.testing.assert_array_equal(claim.data, chunk_bytes(chunk, nbytes))
            else:
                assert claim.kind in ("claimed", "bypass")
                got += nbytes
                if claim.kind == "claimed":
                    cache.store(PACK, chunk, chunk_bytes(chunk, nbytes))
            if cache.budget_bytes:  # 0: no room even for the ledger
                assert cache.usage_bytes(on_disk=True) <= cache.budget_bytes
                assert files_bytes(cache.directory) <= cache.budget_bytes
        downloaded.append(got)
    return downloaded


def files_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in (directory / "chunks").rglob("*") if p.is_file())


def test_options_refuse_bad_values() -> None:
    with pytest.raises(OptionsError, match="disk_cache_bytes"):
        DiskCacheOptions(budget_bytes=-1)
    with pytest.raises(OptionsError, match="eviction"):
        DiskCacheOptions(eviction="fifo")  # type: ignore[arg-type]


def test_pack_key_changes_with_the_etag() -> None:
    assert pack_key("a", 10, '"1"') != pack_key("a", 10, '"2"')
    assert pack_key("a", 10, '"1"') != pack_key("a", 11, '"1"')


def test_a_budget_that_fits_the_pack_makes_epoch_two_free(tmp_path: Path) -> None:
    budget = reserve(tmp_path) + 40 * CHUNK
    cache = DiskCache(DiskCacheOptions(directory=tmp_path / "c", budget_bytes=budget))
    downloaded = run_epochs(cache, 40, 3)
    assert downloaded == [40 * CHUNK, 0, 0]
    assert cache.stats.hits == 80


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_belady_downloads_only_what_does_not_fit(tmp_path: Path, fraction: float) -> None:
    num = 80
    budget = reserve(tmp_path) + int(fraction * num * CHUNK)
    belady = DiskCache(DiskCacheOptions(directory=tmp_path / "b", budget_bytes=budget))
    lru = DiskCache(DiskCacheOptions(directory=tmp_path / "l", budget_bytes=budget, eviction="lru"))
    size = num * CHUNK
    for epoch_bytes in run_epochs(belady, num, 4)[1:]:
        assert epoch_bytes <= (1 - fraction) * size + 0.05 * size
    for epoch_bytes in run_epochs(lru, num, 4)[1:]:
        # LRU keeps the chunks used last, which a new random order needs at random times.
        assert epoch_bytes >= (1 - fraction) * size + 0.1 * size


def test_belady_bound_with_uneven_chunk_sizes(tmp_path: Path) -> None:
    num = 60
    size = sum(CHUNK * (1 + c % 7) for c in range(num))
    budget = reserve(tmp_path) + size // 2
    cache = DiskCache(DiskCacheOptions(directory=tmp_path / "c", budget_bytes=budget))
    for epoch_bytes in run_epochs(cache, num, 3, sizes=True)[1:]:
        assert epoch_bytes <= size // 2 + 0.05 * size


def test_a_zero_budget_caches_nothing(tmp_path: Path) -> None:
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=0))
    assert run_epochs(cache, 5, 2) == [5 * CHUNK, 5 * CHUNK]
    assert cache.stats.bypassed == 10


def test_the_default_budget_is_recorded_once(tmp_path: Path) -> None:
    first = DiskCache(DiskCacheOptions(directory=tmp_path))
    assert first.budget_bytes > 0
    assert DiskCache(DiskCacheOptions(directory=tmp_path)).budget_bytes == first.budget_bytes


def test_next_uses_take_the_nearest_over_futures() -> None:
    a = Future.of([1, 2, 1], [0.1, 0.2, 1.1])
    b = Future.of([2], [0.5])
    assert next_uses([(a, 0.15), (b, 0.0)]) == {1: pytest.approx(0.95), 2: pytest.approx(0.05)}
    assert Future.from_bytes(a.to_bytes()).times.tolist() == a.times.tolist()


def test_victims_rank_above_the_new_chunk_or_none() -> None:
    cands = [Candidate("p", c, 10, used=c) for c in range(3)]
    distances = {"p": {0: 0.9, 1: 0.1, 2: 0.5}}
    choose = dict(distances=distances, policy="belady", new_used=9)
    assert choose_victims(cands, need_bytes=10, new_distance=0.3, **choose) == [cands[0]]
    assert choose_victims(cands, need_bytes=20, new_distance=0.3, **choose) == cands[::2]
    assert choose_victims(cands, need_bytes=30, new_distance=0.3, **choose) is None
    assert choose_victims(
        cands, need_bytes=20, new_distance=0.3, **{**choose, "policy": "lru"}
    ) == [
        cands[0],
        cands[1],
    ]


def test_a_replaced_pack_has_its_own_chunks(tmp_path: Path) -> None:
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=ROOM + 10 * CHUNK))
    assert cache.claim(PACK, 0, CHUNK).kind == "claimed"
    cache.store(PACK, 0, chunk_bytes(0))
    other = pack_key("p" * 32, 10**6, '"new"')
    assert cache.claim(other, 0, CHUNK).kind == "claimed"


def test_a_short_file_is_never_served(tmp_path: Path) -> None:
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=ROOM + 10 * CHUNK))
    assert cache.claim(PACK, 3, CHUNK).kind == "claimed"
    cache.store(PACK, 3, chunk_bytes(3))
    path = tmp_path / "chunks" / PACK / "3"
    path.write_bytes(path.read_bytes()[:10])
    assert cache.claim(PACK, 3, CHUNK).kind == "claimed"
    assert not path.exists()


# -- several processes ------------------------------------------------------------------


def _reader(directory: str, num: int, counts: str, seed: int) -> None:
    cache = DiskCache(DiskCacheOptions(directory=directory, budget_bytes=10**9))
    for chunk in np.random.default_rng(seed).permutation(num).tolist():
        claim = cache.claim(PACK, chunk, CHUNK)
        while claim.kind == "busy":
            claim = cache.wait(PACK, chunk, CHUNK)
        if claim.kind == "claimed":
            with open(counts, "a") as out:  # one line per download
                out.write(f"{chunk}\n")
            cache.store(PACK, chunk, chunk_bytes(chunk))
        else:
            assert claim.kind == "hit"
            assert claim.data is not None
            assert np.array_equal(claim.data, chunk_bytes(chunk))
    cache.close()


def _context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("fork" if os.name == "posix" else "spawn")


def test_processes_download_each_chunk_once(tmp_path: Path) -> None:
    counts = tmp_path / "counts.txt"
    ctx = _context()
    procs = [
        ctx.Process(target=_reader, args=(str(tmp_path / "c"), 30, str(counts), seed))
        for seed in range(3)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    downloads = counts.read_text().split()
    assert sorted(int(c) for c in downloads) == list(range(30))


def _killed_while_storing(directory: str, renamed: bool) -> None:
    cache = DiskCache(DiskCacheOptions(directory=directory, budget_bytes=10**6))
    assert cache.claim(PACK, 5, CHUNK).kind == "claimed"
    temp = Path(directory) / "chunks" / PACK / f".5.{cache._owner}.tmp"
    temp.parent.mkdir(parents=True, exist_ok=True)
    temp.write_bytes(chunk_bytes(5)[:100].tobytes())  # half a chunk
    if renamed:
        os.replace(temp, temp.parent / "5")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("renamed", [False, True])
def test_a_killed_download_is_claimed_again(tmp_path: Path, renamed: bool) -> None:
    proc = _context().Process(target=_killed_while_storing, args=(str(tmp_path), renamed))
    proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=10**6))
    assert cache.claim(PACK, 5, CHUNK).kind == "claimed"  # the dead claim was recovered
    assert cache.stats.recovered == 1
    folder = tmp_path / "chunks" / PACK
    left = [p.name for p in folder.iterdir()] if folder.exists() else []
    assert left == []  # neither the half temporary file nor a half final one
    cache.store(PACK, 5, chunk_bytes(5))
    again = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=10**6))
    hit = again.claim(PACK, 5, CHUNK)
    assert hit.kind == "hit"
    assert hit.data is not None
    np.testing.assert_array_equal(hit.data, chunk_bytes(5))


def test_a_wait_on_a_dead_claim_takes_it_over(tmp_path: Path) -> None:
    proc = _context().Process(target=_killed_while_storing, args=(str(tmp_path), False))
    proc.start()
    proc.join(30)
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=10**6))
    cache._open()  # recovery at open already removed it
    assert cache.wait(PACK, 5, CHUNK).kind == "claimed"


def test_a_cache_pickles_as_its_options(tmp_path: Path) -> None:
    import pickle

    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=10))
    cache._open()
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.options == cache.options
    assert copy.budget_bytes == 10
    cache.close()


def test_opening_retries_sqlites_immediate_database_is_locked(tmp_path, monkeypatch):
    # SQLite may answer "database is locked" at once (no busy wait) while a sibling worker
    # opens or recovers the WAL ledger: opening tries again instead of failing the loader
    real_connect = sqlite3.connect
    refused = []

    class Locked:
        def execute(self, *args, **kwargs):
            raise sqlite3.OperationalError("database is locked")

        def close(self):
            refused.append(True)

    def connect(*args, **kwargs):
        return Locked() if len(refused) < 2 else real_connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    cache = DiskCache(DiskCacheOptions(directory=tmp_path / "c", budget_bytes=1000))
    assert cache.budget_bytes == 1000
    assert len(refused) == 2
    cache.close()


def test_opening_does_not_retry_other_sqlite_errors(tmp_path, monkeypatch):
    class Broken:
        def execute(self, *args, **kwargs):
            raise sqlite3.OperationalError("disk I/O error")

        def close(self):
            pass

    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: Broken())
    cache = DiskCache(DiskCacheOptions(directory=tmp_path / "c", budget_bytes=1000))
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        cache.usage_bytes()
    # a public use warns once and reads on without the cache
    with pytest.warns(DiskCacheWarning, match=r"the disk cache .* cannot be used \(disk I/O"):
        assert cache.claim(PACK, 1, CHUNK).kind == "bypass"
    assert cache.claim(PACK, 2, CHUNK).kind == "bypass"  # no second warning, no error


def _claim_and_store(cache: DiskCache, chunk: int, queue: multiprocessing.Queue[object]) -> None:
    try:
        claim = cache.claim(PACK, chunk, CHUNK)
        if claim.kind == "claimed":
            cache.store(PACK, chunk, chunk_bytes(chunk))
        queue.put((claim.kind, cache._owner))
    except BaseException as err:  # the parent reports it
        queue.put(repr(err))


def test_a_fork_while_a_thread_is_in_a_transaction(tmp_path: Path) -> None:
    # NOTE [ The ledger and fork ]: a parent thread holds the cache (a transaction under way)
    # when a worker is forked; the child inherited a held lock and hung on its first claim
    cache = DiskCache(DiskCacheOptions(directory=tmp_path / "c", budget_bytes=10**6))
    assert cache.claim(PACK, 0, CHUNK).kind == "claimed"
    cache.store(PACK, 0, chunk_bytes(0))
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._lock:
            inside.set()
            leave.wait(0.3)  # the fork below waits for this, never the other way round

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait(10)
    context = _context()
    queue: multiprocessing.Queue[object] = context.Queue()
    child = context.Process(target=_claim_and_store, args=(cache, 1, queue))
    child.start()
    found = queue.get()  # a hang fails here (the tests' time limit)
    child.join()
    holder.join()
    assert isinstance(found, tuple), found
    assert found[0] == "claimed"
    assert found[1] != cache._owner  # the child is its own owner, on its own connection
    owner = cache._owner
    assert cache.claim(PACK, 1, CHUNK).kind == "hit"  # the parent reopened its connection
    assert cache._owner == owner  # the same owner, its lock still held
    assert cache.usage_bytes() == 2 * CHUNK
    cache.close()


def test_opening_sweeps_what_exited_processes_left(tmp_path: Path) -> None:
    cache = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=ROOM + 10 * CHUNK))
    for chunk in (1, 2):
        assert cache.claim(PACK, chunk, CHUNK).kind == "claimed"
        cache.store(PACK, chunk, chunk_bytes(chunk))
    cache.close()
    folder = tmp_path / "chunks" / PACK
    (folder / "2").unlink()  # a row without its file
    (folder / "7").write_bytes(b"x" * 10)  # a file without a row
    (folder / ".8.123-dead.tmp").write_bytes(b"y")  # a dead process's temporary
    (tmp_path / "owners" / "123-dead.lock").touch()  # and its lock file
    again = DiskCache(DiskCacheOptions(directory=tmp_path, budget_bytes=ROOM + 10 * CHUNK))
    assert again.usage_bytes() == CHUNK  # chunk 1 alone
    assert sorted(p.name for p in folder.iterdir()) == ["1"]
    assert [p.name for p in (tmp_path / "owners").iterdir()] == [f"{again._owner}.lock"]
    assert again.stats.swept == 2
    assert again.claim(PACK, 1, CHUNK).kind == "hit"
    assert again.claim(PACK, 2, CHUNK).kind == "claimed"
