"""The loader tells each worker's reader its plan: the same samples, fetched ahead."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5pack.bench.s3local import Bucket
from h5pack.core.layout import Compression
from h5pack.read.readahead import ReadAheadOptions
from h5pack.training.loader import make_loader
from tests.helpers import arrays, make_pack


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
        batch_size=8,
        num_workers=workers,
        seed=3,
        window_chunks=2,  # the windows keep no chunk from one epoch to the next
        multiprocessing_context="fork" if workers else None,
    )
    plain = make_loader(pack, **common)
    planned = make_loader(
        pack,
        read_ahead=ReadAheadOptions(requests_in_flight=3),
        cache_dir=tmp_path / "cache",
        cache_disk_bytes=10**7,
        **common,
    )
    assert epochs(planned, 2) == epochs(plain, 2)
    reader = planned.dataset.reader
    if workers == 0:
        assert reader.plans_reads
        ahead = reader._raw_file.source.ahead()
        assert ahead.stats.off_plan == 0  # every chunk read came from the plan
        assert ahead.stats.served == 30
        assert ahead.stats.cache_hits == 0  # a local file has no disk cache
        assert ahead.stats.requests <= 30


def test_cache_keywords_are_refused_with_a_dataset(pack: Path) -> None:
    from h5pack.errors import OptionsError
    from h5pack.training.dataset import H5ImageDataset

    with pytest.raises(OptionsError, match="cache_dir"):
        make_loader(H5ImageDataset(pack), 4, cache_dir="/tmp/x", num_workers=0)


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
        batch_size=8,
        num_workers=workers,
        seed=3,
        window_chunks=2,
        multiprocessing_context="fork" if workers else None,
    )
    local = epochs(make_loader(pack, **common), 3)
    loader = make_loader(
        url,
        storage_options=s3_bucket.storage_options,
        cache_dir=tmp_path / "cache",
        cache_disk_bytes=10**8,
        **common,
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
    args += ["--cache-dir", str(tmp_path / "c"), "--cache-disk-bytes", "1MiB"]
    args += ["--cache-eviction", "lru", "--requests-in-flight", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(cli, [*args[:2], "--requests-in-flight", "0"])
    assert bad.exit_code == 2
