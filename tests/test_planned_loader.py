"""The loader tells each worker's reader its plan: the same samples, fetched ahead."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5pack.core.layout import Compression
from h5pack.read.readahead import ReadAheadOptions
from h5pack.read.reader import ReaderOptions
from h5pack.training.epochs import EpochSpec
from h5pack.training.loader import make_loader
from tests.helpers import arrays, make_pack, wait_for_a_chunk_get
from tests.s3local import Bucket


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pack") / "p.h5"
    return make_pack(
        path,
        samples=arrays(90, shape=(16, 16, 3)),
        chunk_samples=6,
        compression=Compression(codec="zstd"),
    )


def epochs(loader: object, count: int) -> list[list[tuple[int, bytes]]]:
    found = []
    for epoch in range(count):
        loader.set_epoch(epoch)  # type: ignore[attr-defined]
        seen = []
        for images, labels in loader:  # type: ignore[attr-defined]
            seen.extend(zip(labels.tolist(), [i.numpy().tobytes() for i in images], strict=True))
        found.append(seen)
    return found


@pytest.mark.parametrize("workers", [0, 2])
def test_a_planned_loader_serves_what_the_plain_one_does(
    pack: Path, tmp_path: Path, workers: int
) -> None:
    common = dict(
        batch_size=EpochSpec(batch_size=8, window_chunks=2),  # windows keep no chunk across epochs
        num_workers=workers,
        seed=3,
        multiprocessing_context="fork" if workers else None,
    )
    plain = make_loader(pack, **common)
    planned = make_loader(
        pack,
        **common,
        reader=ReaderOptions(
            read_ahead=ReadAheadOptions(requests_in_flight=3),
            disk_cache_dir=tmp_path / "cache",
            disk_cache_bytes=10**7,
        ),
    )
    assert epochs(planned, 2) == epochs(plain, 2)
    reader = planned.dataset.reader
    if workers == 0:
        assert reader.plans_reads
        ahead = reader.source.ahead()
        assert ahead.stats.off_plan == 0  # every chunk read came from the plan
        assert ahead.stats.served == 30
        assert ahead.stats.cache_hits == 0  # a local file has no disk cache
        assert ahead.stats.requests <= 30


def test_cache_keywords_are_refused_with_a_dataset(pack: Path) -> None:
    from h5pack.errors import OptionsError
    from h5pack.training.dataset import H5ImageDataset

    with pytest.raises(OptionsError, match=r"\['reader'\] apply only when make_loader opens"):
        make_loader(
            H5ImageDataset(pack), 4, num_workers=0, reader=ReaderOptions(disk_cache_dir="/tmp/x")
        )


@pytest.fixture(scope="module")
def contiguous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pack") / "c.h5"
    return make_pack(path, samples=arrays(90, shape=(16, 16, 3)), layout="contiguous")


@pytest.mark.parametrize(("workers", "kind"), [(0, "zstd"), (2, "zstd"), (2, "contiguous")])
def test_a_remote_loader_makes_no_get_in_epoch_two(
    s3_bucket: Bucket, pack: Path, contiguous: Path, tmp_path: Path, workers: int, kind: str
) -> None:
    pack = contiguous if kind == "contiguous" else pack
    url = s3_bucket.put(pack, "p.h5")
    common = dict(
        batch_size=EpochSpec(batch_size=8, window_chunks=2),  # windows keep no chunk across epochs
        num_workers=workers,
        seed=3,
        multiprocessing_context="fork" if workers else None,
    )
    local = epochs(make_loader(pack, **common), 3)
    loader = make_loader(
        url,
        storage_options=s3_bucket.storage_options,
        **common,
        reader=ReaderOptions(disk_cache_dir=tmp_path / "cache", disk_cache_bytes=10**8),
    )
    s3_bucket.proxy.reset_counts()
    found = []
    for epoch in range(3):
        found.extend(epochs_from(loader, epoch))
        gets = s3_bucket.proxy.reset_counts().gets
        if epoch == 0:
            # a GET per chunk (a contiguous pack: per group), 1-2 per open
            assert 0 < gets <= 15 + 2 * max(1, workers)
        else:
            assert gets == 0  # every chunk from the machine's disk cache
    assert found == [s for epoch in local for s in epoch]


def epochs_from(loader: object, epoch: int) -> list[tuple[int, bytes]]:
    loader.set_epoch(epoch)  # type: ignore[attr-defined]
    seen = []
    for images, labels in loader:  # type: ignore[attr-defined]
        seen.extend(zip(labels.tolist(), [i.numpy().tobytes() for i in images], strict=True))
    return seen


def test_bench_takes_the_read_ahead_and_cache_flags(pack: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    args = ["bench", str(pack), "--workers", "0", "--repeats", "1", "--warmup", "0"]
    args += ["--time-budget", "0", "--train-size", "none", "--json", "-q"]
    args += ["--disk-cache-dir", str(tmp_path / "c"), "--disk-cache-bytes", "1MiB"]
    args += ["--disk-cache-eviction", "lru", "--requests-in-flight", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(cli, [*args[:2], "--requests-in-flight", "0"])
    assert bad.exit_code == 2
    old = CliRunner().invoke(cli, [*args[:2], "--cache-dir", str(tmp_path / "c")])
    assert old.exit_code == 2
    assert "'--disk-cache-dir'" in old.output  # click's own suggestion


def test_the_disk_cache_s_old_names_say_where_they_moved() -> None:
    from h5pack.errors import OptionsError

    with pytest.raises(
        OptionsError, match=r"cache_disk_bytes= moved to reader=ReaderOptions\(disk_cache_bytes="
    ):
        ReaderOptions(cache_disk_bytes=0)


def _one_epoch(
    url: str, storage: dict[str, object], disk_cache_dir: str, out: str, verify: bool = True
) -> None:
    loader = make_loader(
        url,
        epoch=EpochSpec(batch_size=8, window_chunks=2),
        num_workers=0,
        seed=3,
        storage_options=storage,
        reader=ReaderOptions(
            disk_cache_dir=disk_cache_dir, disk_cache_bytes=10**8, verify_checksums=verify
        ),
    )
    with open(out, "wb") as sink:
        for images, _labels in loader:
            sink.write(images.numpy().tobytes())


@pytest.mark.slow  # two spawned processes
def test_two_loader_processes_on_one_cache_download_each_chunk_once(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    import itertools
    import multiprocessing

    import h5py

    from h5pack.core.description import HDF5Index
    from h5pack.read.direct import chunk_table

    url = s3_bucket.put(pack, "p.h5")
    ctx = multiprocessing.get_context("spawn")
    s3_bucket.proxy.reset_counts()
    # claims dedupe downloads; a checking reader claims nothing (it puts a chunk once checked,
    # docs/decisions/0110): two of those may both download a chunk wanted at once
    out = [str(tmp_path / str(i)) for i in range(2)]
    procs = [
        ctx.Process(
            target=_one_epoch, args=(url, s3_bucket.storage_options, str(tmp_path / "c"), o, False)
        )
        for o in out
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0
    counts = s3_bucket.proxy.reset_counts()
    with h5py.File(pack, "r") as handle:
        table = chunk_table(HDF5Index(handle, str(pack)))
    assert table is not None
    # the ranged GETs of chunks (or runs of adjacent chunks), not the opens' reads of the
    # pack's head or tail
    first = int(table.offsets.min())
    spans = sorted(
        (lo, hi)
        for lo, hi in (
            tuple(int(x) for x in r.removeprefix("bytes=").split("-"))
            for _, r in counts.ranges
            if r.startswith("bytes=") and not r.startswith("bytes=-")
        )
        if lo >= first
    )
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))  # no byte twice
    assert sum(hi - lo + 1 for lo, hi in spans) == int(table.sizes.sum())  # each chunk once
    assert (tmp_path / "0").read_bytes() == (tmp_path / "1").read_bytes()


def test_a_loader_killed_mid_download_then_a_clean_restart(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    import multiprocessing
    import os
    import signal
    import time

    from tests.s3local import Fault

    url = s3_bucket.put(pack, "p.h5")
    disk_cache_dir = tmp_path / "c"
    delay_s = 3.0
    # every GET waits: the child's first chunk GETs are in flight, its claims in the ledger,
    # when it is killed (a reader that checks claims nothing: it puts a chunk once checked)
    s3_bucket.proxy.inject(Fault("delay", delay_s=delay_s), times=1000)
    patient = {**s3_bucket.storage_options, "read_timeout_s": 60.0}
    proc = multiprocessing.get_context("spawn").Process(
        target=_one_epoch,
        args=(url, patient, str(disk_cache_dir), str(tmp_path / "dead"), False),
    )
    proc.start()
    wait_for_a_chunk_get(lambda: s3_bucket.proxy.counts, pack, proc.is_alive)
    started = time.monotonic()
    assert proc.pid is not None
    assert proc.is_alive()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    s3_bucket.proxy.clear()
    from h5pack.read.diskcache import DiskCache, DiskCacheOptions

    cache = DiskCache(DiskCacheOptions(directory=disk_cache_dir, budget_bytes=10**8))
    assert cache.usage_bytes() == 0  # opening it recovered the dead loader's claims
    assert cache.stats.recovered >= 1
    cache.close()
    _one_epoch(url, s3_bucket.storage_options, str(disk_cache_dir), str(tmp_path / "after"))
    local = tmp_path / "local"
    with open(local, "wb") as sink:
        loader = make_loader(
            pack, epoch=EpochSpec(batch_size=8, window_chunks=2), num_workers=0, seed=3
        )
        for images, _labels in loader:
            sink.write(images.numpy().tobytes())
    assert (tmp_path / "after").read_bytes() == local.read_bytes()  # the same pixels
    assert not list(disk_cache_dir.rglob("*.tmp"))
    # the proxy's delayed answers to the dead process end here, not in another test
    time.sleep(max(0.0, started + delay_s + 2.0 - time.monotonic()))


def test_an_iterable_dataset_reads_ahead_by_its_plan(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    from h5pack.read.reader import ReaderOptions
    from h5pack.training.dataset import H5ImageDataset, H5IterableDataset
    from h5pack.training.sampler import EpochSpec

    url = s3_bucket.put(pack, "p.h5")
    remote = H5ImageDataset(url, reader=ReaderOptions(storage_options=s3_bucket.storage_options))
    spec = EpochSpec(batch_size=8, seed=3, window_chunks=2)
    local = [int(s[1]) for s in H5IterableDataset(H5ImageDataset(pack), spec)]
    stream = H5IterableDataset(remote, spec)
    assert [int(s[1]) for s in stream] == local
    reader = stream._dataset_for(2).reader
    assert reader.plans_reads
    stats = reader.source.ahead().stats
    assert stats.off_plan == 0  # every chunk it read came from the plan
    assert stats.served == 15


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pack") / "q.h5"
    return make_pack(
        path,
        samples=arrays(30, shape=(16, 16, 3), seed=7),
        chunk_samples=6,
        compression=Compression(codec="zstd"),
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_planned_mix_serves_what_the_plain_one_does(
    pack: Path, second: Path, workers: int
) -> None:
    common = dict(
        batch_size=EpochSpec(batch_size=8, window_chunks=2),  # windows keep no chunk across epochs
        weights=[3, 1],
        num_workers=workers,
        seed=3,
        multiprocessing_context="fork" if workers else None,
    )
    plain = make_loader([pack, second], **common)
    planned = make_loader(
        [pack, second],
        **common,
        reader=ReaderOptions(read_ahead=ReadAheadOptions(requests_in_flight=3)),
    )
    assert epochs(planned, 2) == epochs(plain, 2)
    if workers == 0:
        for part in planned.dataset.parts:
            reader = part.reader
            assert reader.plans_reads
            stats = reader.source.ahead().stats
            assert stats.off_plan == 0  # every chunk a source read came from its plan
            assert stats.served > 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_remote_mix_reads_ahead_one_get_per_chunk(
    s3_bucket: Bucket, pack: Path, second: Path, workers: int
) -> None:
    urls = [s3_bucket.put(pack, "mix/p.h5"), s3_bucket.put(second, "mix/q.h5")]
    common = dict(
        batch_size=EpochSpec(batch_size=8, window_chunks=2),  # windows keep no chunk across epochs
        weights=[3, 1],  # 90 + 30 samples: every sample once an epoch
        num_workers=workers,
        seed=3,
        multiprocessing_context="fork" if workers else None,
    )
    local = epochs(make_loader([pack, second], **common), 1)
    loader = make_loader(
        urls,
        storage_options=s3_bucket.storage_options,
        **common,
        reader=ReaderOptions(disk_cache_bytes=0),
    )
    s3_bucket.proxy.reset_counts()
    assert epochs(loader, 1) == local
    counts = s3_bucket.proxy.reset_counts()
    # 15 + 5 chunks, each one ranged GET (read ahead by each source's plan), plus at most
    # two GETs per open of a source, in each worker and in the main process
    assert 20 <= counts.gets <= 20 + 2 * 2 * (1 + workers)
    if workers == 0:
        for part in loader.dataset.parts:
            stats = part.reader.source.ahead().stats
            assert stats.off_plan == 0
            assert stats.served == part.reader.chunk_map.num_chunks
