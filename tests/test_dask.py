"""Sharded conversion on a Dask LocalCluster of 2 worker processes (issue 11.4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from h5pack import Compression, ConvertOptions, TargetExistsError, convert, convert_on_dask
from h5pack.cli.main import cli
from h5pack.core.packset import MANIFEST_NAME, load_manifest, shard_name
from h5pack.synthetic import SampleSpec, make_image_folder
from tests.helpers import contents

distributed = pytest.importorskip("distributed", reason="needs dask[distributed] (h5pack[dask])")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    with cluster, distributed.Client(cluster) as dask_client:
        yield dask_client


def test_a_dask_conversion_equals_one_process(client: Any, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    # several sizes: the plan (probed by Dask tasks) stores raw pixels as a blob
    make_image_folder(
        folder, SampleSpec(num_images=30, num_classes=3, size=(12, 16), size_jitter=0.3)
    )
    convert(folder, tmp_path / "one.h5", ConvertOptions(workers=1))
    report = convert_on_dask(client, folder, tmp_path / "set", ConvertOptions(), shards=3)
    assert report.manifest == str(tmp_path / "set" / MANIFEST_NAME)
    assert [s.status for s in report.shards] == ["written"] * 3
    assert contents(tmp_path / "set") == contents(tmp_path / "one.h5")
    assert load_manifest(tmp_path / "set").num_samples == 30
    again = convert_on_dask(client, folder, tmp_path / "set", ConvertOptions(), shards=3)
    assert [s.status for s in again.shards] == ["reused"] * 3
    # a task's refusal reaches the client, naming the shard
    (tmp_path / "set" / MANIFEST_NAME).unlink()
    other = ConvertOptions(compression=Compression(codec="zstd"))
    with pytest.raises(
        TargetExistsError, match=r"shard-0000[0-2]-of-00003\.h5 exists.*compression"
    ):
        convert_on_dask(client, folder, tmp_path / "set", other, shards=3)


def test_cli_dask_address(client: Any, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    make_image_folder(folder, SampleSpec(num_images=20, num_classes=2, size=(12, 16)))
    convert(folder, tmp_path / "one.h5", ConvertOptions(workers=1, size=(8, 8)))
    address = client.scheduler.address
    args = ["convert", str(folder), str(tmp_path / "set"), "--size", "8", "8", "-q"]
    result = CliRunner().invoke(cli, [*args, "--shards", "2", "--dask", address])
    assert result.exit_code == 0, result.output
    assert f"shard 1/2: written {shard_name(1, 2)}" in result.output
    assert contents(tmp_path / "set") == contents(tmp_path / "one.h5")
    result = CliRunner().invoke(cli, [*args, "--dask", address])
    assert result.exit_code == 2
    assert "add --shards" in result.output


def test_cli_dask_local(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    make_image_folder(folder, SampleSpec(num_images=12, num_classes=2, size=(12, 16)))
    convert(folder, tmp_path / "one.h5", ConvertOptions(workers=1))
    args = ["convert", str(folder), str(tmp_path / "set"), "--shards", "2", "-q"]
    result = CliRunner().invoke(cli, [*args, "--dask", "local", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert f"manifest {tmp_path / 'set' / MANIFEST_NAME}" in result.output
    assert contents(tmp_path / "set") == contents(tmp_path / "one.h5")


def test_dask_into_a_bucket(client: Any, tmp_path: Path, s3_bucket: Any) -> None:
    folder = tmp_path / "images"
    make_image_folder(folder, SampleSpec(num_images=20, num_classes=2, size=(12, 16)))
    convert(folder, tmp_path / "one.h5", ConvertOptions(workers=1))
    url = s3_bucket.url("set/")
    store = {**s3_bucket.storage_options, "read_timeout_s": 30.0}
    report = convert_on_dask(client, folder, url, ConvertOptions(), shards=2, storage_options=store)
    assert report.manifest == url + MANIFEST_NAME
    assert [s.path for s in report.shards] == [url + shard_name(i, 2) for i in range(2)]
    # each task staged its shard on its worker and uploaded it; the client wrote the manifest
    assert contents(s3_bucket.path / "set") == contents(tmp_path / "one.h5")
    again = convert_on_dask(client, folder, url, ConvertOptions(), shards=2, storage_options=store)
    assert [s.status for s in again.shards] == ["reused"] * 2
