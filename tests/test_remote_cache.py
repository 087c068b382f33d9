"""The planned read-ahead and the disk cache against the local S3 server (counted GETs)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5pack.core.description import HDF5Index
from h5pack.core.layout import Compression
from h5pack.core.store import open_source
from h5pack.read import ledger
from h5pack.read.direct import chunk_table
from h5pack.read.diskcache import DiskCache, DiskCacheOptions
from h5pack.read.eviction import Future
from h5pack.read.planned import PlannedSource, planned_source
from tests.helpers import arrays, disk_cache_reserve, make_pack, wait_for_a_chunk_get
from tests.s3local import Bucket, Fault

NUM_CHUNKS = 24


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pack") / "p.h5"
    samples = arrays(NUM_CHUNKS * 4, shape=(32, 32, 3))
    return make_pack(path, samples=samples, chunk_samples=4, compression=Compression(codec="lz4"))


def table_of(pack: Path) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(pack, "r") as handle:
        table = chunk_table(HDF5Index(handle, str(pack)))
    assert table is not None
    return table.offsets, table.sizes


def orders(epochs: int) -> list[np.ndarray]:
    return [np.random.default_rng([11, e]).permutation(NUM_CHUNKS) for e in range(epochs)]


def source_for(
    bucket: Bucket, url: str, pack: Path, cache: DiskCacheOptions, **ahead: object
) -> PlannedSource:
    offsets, sizes = table_of(pack)
    remote = open_source(url, storage_options=bucket.storage_options)
    from h5pack.read.readahead import ReadAheadOptions

    planned = planned_source(
        remote,
        offsets,
        sizes,
        pack_id="p" * 32,
        read_ahead=ReadAheadOptions(**ahead),  # type: ignore[arg-type]
        disk_cache=cache,
    )
    assert isinstance(planned, PlannedSource)
    return planned


def read_epoch(planned: PlannedSource, plans: list[np.ndarray], epoch: int, data: bytes) -> None:
    """Read every chunk of the epoch's order through the source, checking its bytes."""
    chunks, times = [], []
    for e in (epoch, epoch + 1):
        if e < len(plans):
            chunks.extend(plans[e].tolist())
            times.extend((e + np.arange(NUM_CHUNKS) / NUM_CHUNKS).tolist())
    order = plans[epoch]
    planned.plan(order, epoch + np.arange(NUM_CHUNKS) / NUM_CHUNKS, Future.of(chunks, times))
    for chunk in order.tolist():
        begin, size = int(planned.offsets[chunk]), int(planned.sizes[chunk])
        (got,) = planned.read_ranges([(begin, begin + size)])
        assert bytes(got) == data[begin : begin + size]


def stored_bytes(pack: Path) -> int:
    return int(table_of(pack)[1].sum())


def test_budget_that_fits_makes_epoch_two_free(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    data = pack.read_bytes()
    budget = disk_cache_reserve(tmp_path) + 2 * len(data)  # whole blocks: ~5% more
    cache = DiskCacheOptions(directory=tmp_path / "cache", budget_bytes=budget)
    planned = source_for(s3_bucket, url, pack, cache)
    plans = orders(3)
    s3_bucket.proxy.reset_counts()
    read_epoch(planned, plans, 0, data)
    first = s3_bucket.proxy.reset_counts()
    # one ranged GET per chunk (or per run of chunks adjacent in the plan and the file)
    assert first.gets <= NUM_CHUNKS
    assert first.body_bytes == stored_bytes(pack)
    for epoch in (1, 2):
        read_epoch(planned, plans, epoch, data)
        assert s3_bucket.proxy.reset_counts().gets == 0
    planned.close()


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_belady_bound_and_lru_against_the_server(
    s3_bucket: Bucket, pack: Path, tmp_path: Path, fraction: float
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    data = pack.read_bytes()
    stored = stored_bytes(pack)
    # stored in whole blocks: a chunk's file takes up to a block more than its bytes
    stored_blocks = int(sum(ledger.cost(int(n)) for n in table_of(pack)[1]))
    budget = disk_cache_reserve(tmp_path) + int(fraction * stored_blocks)
    plans = orders(3)
    downloaded = {}
    for policy in ("belady", "lru"):
        options = DiskCacheOptions(
            directory=tmp_path / policy, budget_bytes=budget, eviction=policy
        )
        planned = source_for(s3_bucket, url, pack, options)
        read_epoch(planned, plans, 0, data)
        s3_bucket.proxy.reset_counts()
        read_epoch(planned, plans, 1, data)
        downloaded[policy] = s3_bucket.proxy.reset_counts().body_bytes
        cache = planned.cache
        assert cache is not None
        assert cache.usage_bytes(on_disk=True) <= budget
        on_disk = sum(p.stat().st_size for p in (tmp_path / policy).rglob("chunks/*/*"))
        assert on_disk <= budget
        planned.close()
    assert downloaded["belady"] <= (1 - fraction) * stored + 0.05 * stored
    assert downloaded["lru"] > downloaded["belady"]


def _read_all(url: str, options: dict[str, object], pack: str, disk_cache_dir: str) -> None:
    planned = source_for_child(url, options, Path(pack), disk_cache_dir)
    data = Path(pack).read_bytes()
    read_epoch(planned, orders(1), 0, data)
    planned.close()


def source_for_child(
    url: str, storage: dict[str, object], pack: Path, disk_cache_dir: str
) -> PlannedSource:
    class Holder:
        storage_options = storage

    return source_for(
        Holder(),  # type: ignore[arg-type]
        url,
        pack,
        DiskCacheOptions(directory=disk_cache_dir, budget_bytes=10**9),
    )


def _context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("spawn")


def test_two_processes_on_one_cache_download_each_chunk_once(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    s3_bucket.proxy.reset_counts()
    args = (url, s3_bucket.storage_options, str(pack), str(tmp_path / "cache"))
    procs = [_context().Process(target=_read_all, args=args) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0
    counts = s3_bucket.proxy.reset_counts()
    ranged = [r for _, r in counts.ranges if r]
    assert len(set(ranged)) == len(ranged)  # no range twice, over both processes
    assert counts.body_bytes == stored_bytes(pack)  # every chunk once


def test_kill_during_a_download_then_a_clean_restart(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    disk_cache_dir = tmp_path / "cache"
    # every GET hangs: the child is killed with its claims (and maybe files) half done
    delay_s = 5.0
    started = time.monotonic()
    s3_bucket.proxy.inject(Fault("delay", delay_s=delay_s), times=100)
    patient = {**s3_bucket.storage_options, "read_timeout_s": 60.0}
    args = (url, patient, str(pack), str(disk_cache_dir))
    proc = _context().Process(target=_read_all, args=args)
    proc.start()
    # its claims are in the ledger, its GETs in flight
    wait_for_a_chunk_get(lambda: s3_bucket.proxy.counts, pack, proc.is_alive)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    s3_bucket.proxy.clear()
    cache = DiskCache(DiskCacheOptions(directory=disk_cache_dir, budget_bytes=10**9))
    assert cache.usage_bytes() == 0  # the dead claims were recovered at open
    cache.close()
    planned = source_for(
        s3_bucket, url, pack, DiskCacheOptions(directory=disk_cache_dir, budget_bytes=10**9)
    )
    read_epoch(planned, orders(1), 0, pack.read_bytes())  # every chunk's bytes checked
    assert not list(disk_cache_dir.rglob("*.tmp"))
    planned.close()
    # The proxy's delayed answers to the dead process fail when their wait ends: let them
    # fail during this test, not in the output of the next one.
    time.sleep(max(0.0, started + delay_s + 1.0 - time.monotonic()))
