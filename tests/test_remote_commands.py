"""Remote packs in ``bench`` and ``compare``, and under torch.distributed (issue 17 item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from h5pack.cli.main import cli
from h5pack.core.layout import Compression
from tests.helpers import make_pack
from tests.s3local import Bucket


def storage_flags(bucket: Bucket) -> list[str]:
    flags = []
    for key, value in bucket.storage_options.items():
        flags += ["--storage-option", f"{key}={value}"]
    return flags


@pytest.mark.usefixtures("no_aws_environment")
def test_cli_bench_of_a_remote_pack_takes_storage_options(
    s3_bucket: Bucket, tmp_path: Path
) -> None:
    path = make_pack(tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=8)
    url = s3_bucket.put(path, "a.h5")
    s3_bucket.proxy.reset_counts()
    args = ["bench", url, "--workers", "0", "--repeats", "1", "--warmup", "0", "-q"]
    result = CliRunner().invoke(
        cli, [*args, "--time-budget", "1", "--json", *storage_flags(s3_bucket)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["path"] == url
    # the pack was read through the server the flags name: 37 samples in 5 chunks
    assert s3_bucket.proxy.counts.gets >= 5


@pytest.mark.usefixtures("no_aws_environment")
def test_cli_bench_of_a_remote_mix_takes_storage_options(s3_bucket: Bucket, tmp_path: Path) -> None:
    urls = [
        s3_bucket.put(make_pack(tmp_path / f"{name}.h5", chunk_samples=8), f"{name}.h5")
        for name in ("a", "b")
    ]
    args = ["bench", *urls, "--weights", "1,1", "--workers", "0", "--repeats", "1"]
    result = CliRunner().invoke(
        cli, [*args, "--warmup", "0", "--time-budget", "1", "--json", *storage_flags(s3_bucket)]
    )
    assert result.exit_code == 0, result.output
    assert s3_bucket.proxy.counts.gets >= 2


@pytest.mark.usefixtures("no_aws_environment")
def test_cli_compare_measures_a_remote_pack_beside_the_local_one(
    s3_bucket: Bucket, tmp_path: Path
) -> None:
    path = make_pack(tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=8)
    url = s3_bucket.put(path, "remote.h5")
    s3_bucket.proxy.reset_counts()
    out = tmp_path / "report"
    args = ["compare", url, str(path), "--out", str(out), "-q", "--no-plots", "--json"]
    args += ["--repeats", "1", "--workers", "0", "--batch-size", "8"]
    result = CliRunner().invoke(cli, [*args, *storage_flags(s3_bucket)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    variants = {v["name"]: v for v in report["variants"]}
    assert set(variants) == {"remote", "a"}
    remote, local = variants["remote"], variants["a"]
    for key in ("num_samples", "file_bytes", "chunk_bytes", "codec", "layout", "mode"):
        assert remote[key] == local[key], key
    assert set(remote["patterns"]) == set(local["patterns"]) == {"random", "chunk", "sequential"}
    assert s3_bucket.proxy.counts.gets >= 5  # 37 samples in 5 chunks, read remotely
    # the client's settings (a secret among them) never land in the report
    secret = str(s3_bucket.storage_options["secret_access_key"])
    assert secret not in (out / "report.json").read_text()
    assert secret not in (out / "report.md").read_text()


@pytest.mark.usefixtures("no_aws_environment")
def test_cli_compare_of_a_missing_url_is_one_error(s3_bucket: Bucket, tmp_path: Path) -> None:
    args = ["compare", s3_bucket.url("nope.h5"), "--out", str(tmp_path / "r"), "-q"]
    result = CliRunner().invoke(cli, [*args, *storage_flags(s3_bucket)])
    assert result.exit_code == 1, result.output
    assert "no such object" in result.output
    assert "Traceback" not in result.output
