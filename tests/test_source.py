"""Byte sources (core.source, core.s3) against the local S3 server, through the fault proxy."""

from __future__ import annotations

import builtins
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from h5pack.core import s3
from h5pack.core.source import LocalSource, SourceChangedError
from h5pack.core.store import MissingExtraError, is_url, open_source, split_url
from h5pack.errors import FormatError, OptionsError, PackNotFoundError, RemoteError, install_line
from tests.s3local import Bucket, Fault

DATA = np.random.default_rng(0).integers(0, 255, 300_000, dtype=np.uint8).tobytes()


@pytest.fixture
def remote(s3_bucket: Bucket, tmp_path: Path) -> tuple[Bucket, str]:
    local = tmp_path / "blob.bin"
    local.write_bytes(DATA)
    return s3_bucket, s3_bucket.put(local, "dir/blob.bin")


def test_urls_are_told_from_paths() -> None:
    assert is_url("s3://bucket/key.h5")
    assert not is_url("/data/pack.h5")
    assert not is_url("C://windows")  # one letter: a drive, not a scheme
    assert split_url("s3://bucket/set/a.h5") == ("s3", "bucket", "set/a.h5")
    with pytest.raises(FormatError, match="names no bucket"):
        split_url("s3:///key")
    with pytest.raises(FormatError, match="not hdfs://"):
        open_source("hdfs://bucket/key")


def test_local_source_reads_ranges(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(DATA)
    source = open_source(path)
    assert isinstance(source, LocalSource)
    assert source.size() == len(DATA)
    got = source.read_ranges([(0, 10), (1000, 5000)])
    assert [bytes(g) for g in got] == [DATA[:10], DATA[1000:5000]]
    tail, start = source.read_tail(100)
    assert (bytes(tail), start) == (DATA[-100:], len(DATA) - 100)
    clone = pickle.loads(pickle.dumps(source))
    assert bytes(clone.read(5, 9)) == DATA[5:9]


def test_s3_source_one_get_per_range(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    source = open_source(url, storage_options=bucket.storage_options)
    tail, start = source.read_tail(1000)
    assert (bytes(tail), start) == (DATA[-1000:], len(DATA) - 1000)
    assert bucket.proxy.counts.total == 1  # the size and ETag came with the tail
    ranges = [(i * 7000, i * 7000 + 5000) for i in range(20)]
    got = source.read_ranges(ranges)
    assert [bytes(g) for g in got] == [DATA[a:b] for a, b in ranges]
    assert bucket.proxy.counts.gets == 21
    assert bucket.proxy.counts.body_bytes == 1000 + 20 * 5000
    buffer = np.empty(300, dtype=np.uint8)
    source.read_into(buffer, 12)
    assert buffer.tobytes() == DATA[12:312]
    assert source.identity().size == len(DATA)


def test_s3_source_pickles_its_identity(remote: tuple[Bucket, str], tmp_path: Path) -> None:
    bucket, url = remote
    source = open_source(url, storage_options=bucket.storage_options)
    source.read(0, 10)
    clone = pickle.loads(pickle.dumps(source))
    assert bytes(clone.read(10, 20)) == DATA[10:20]
    other = tmp_path / "other.bin"
    other.write_bytes(DATA[::-1])
    bucket.put(other, "dir/blob.bin")  # replaced under the same key
    with pytest.raises(SourceChangedError, match="was replaced"):
        clone.read(0, 10)
    with pytest.raises(SourceChangedError, match=r"dir/blob\.bin"):
        source.read_ranges([(0, 10), (10, 20)])


@pytest.mark.parametrize(
    "fault",
    [
        Fault("reset"),
        Fault("status", status=503),
        Fault("status", status=500),
        Fault("truncate", keep_bytes=100),
    ],
    ids=["reset", "503", "500", "truncated"],
)
def test_s3_faults_are_retried(remote: tuple[Bucket, str], fault: Fault) -> None:
    bucket, url = remote
    source = open_source(url, storage_options=bucket.storage_options)
    source.read(0, 10)
    bucket.proxy.reset_counts()
    bucket.proxy.inject(fault, times=2)
    assert bytes(source.read(1000, 9000)) == DATA[1000:9000]
    assert bucket.proxy.counts.gets == 3  # two faults, then the answer
    assert bucket.proxy.counts.faults == 2


def test_s3_timeout_is_retried(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    # The delay outlasts the timeout by far, and the retry's answer (~15 ms) has the whole
    # timeout: the count holds on a busy machine too.
    options = {**bucket.storage_options, "read_timeout_s": 2.0}
    source = open_source(url, storage_options=options)
    source.read(0, 10)
    bucket.proxy.reset_counts()
    bucket.proxy.inject(Fault("delay", delay_s=6.0))
    assert bytes(source.read(50, 60)) == DATA[50:60]
    assert bucket.proxy.counts.gets == 2


def test_s3_faults_past_the_retries_are_one_error(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    options = {**bucket.storage_options, "attempts": 3}
    source = open_source(url, storage_options=options)
    bucket.proxy.inject(Fault("status", status=503), times=3)
    with pytest.raises(
        RemoteError,
        match=r"from http://\S+ \(set by the storage option endpoint .*\): gave up after 3 "
        r"attempts over \d+\.\d s .*; last cause: HTTP 503 SlowDown",
    ) as e:
        source.read(0, 10)
    assert url in str(e.value)
    assert bucket.proxy.counts.gets == 3


def test_missing_object_bucket_and_denied(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    options = bucket.storage_options
    with pytest.raises(PackNotFoundError, match="no such object"):
        open_source(bucket.url("nope.h5"), storage_options=options).read_tail(10)
    with pytest.raises(PackNotFoundError, match="no bucket 'no-such-bucket'"):
        open_source("s3://no-such-bucket/a.h5", storage_options=options).read_tail(10)
    denied = {**options, "secret_access_key": "wrong"}
    with pytest.raises(RemoteError, match="access denied") as e:
        open_source(url, storage_options=denied).read_tail(10)
    assert "AWS_ACCESS_KEY_ID" in str(e.value)


def test_missing_credentials_and_profile_are_one_error(
    remote: tuple[Bucket, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bucket, url = remote
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = {"endpoint": bucket.storage_options["endpoint"], "attempts": 3}
    with pytest.raises(RemoteError, match="no credentials") as err:
        open_source(url, storage_options=options).read_tail(10)
    assert "AWS_ACCESS_KEY_ID" in str(err.value)
    assert bucket.proxy.counts.total == 0  # refused before any request, never retried
    with pytest.raises(RemoteError, match="check AWS_PROFILE"):
        open_source(url, storage_options={**options, "profile": "nope"}).read_tail(10)


def test_missing_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_boto(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith(("boto3", "botocore")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_boto)
    with pytest.raises(MissingExtraError, match=re.escape(install_line("s3"))):
        open_source("s3://b/k.h5", storage_options={"endpoint": "http://127.0.0.1:1"}).read(0, 1)


def test_options_from_the_environment_and_storage_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environ = {
        "AWS_ENDPOINT_URL": "http://e:1",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_REGION": "eu-west-3",
        "AWS_PROFILE": "p",
    }
    assert s3.S3Options.from_environment(environ) == {
        "endpoint": "http://e:1",
        "access_key_id": "id",
        "secret_access_key": "secret",
        "region": "eu-west-3",
        "profile": "p",
    }
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://from-env:1")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    options = s3.S3Store.of({"endpoint_url": "http://given:2", "attempts": "2"}).options
    assert (options.endpoint, options.region, options.max_attempts) == (
        "http://given:2",
        "eu-west-3",
        2,
    )
    with pytest.raises(OptionsError, match="unknown storage option 'colour'"):
        s3.S3Options.of({"colour": "red"})
    with pytest.raises(OptionsError, match="max_attempts should be >= 1"):
        s3.S3Options.of({"attempts": "0"})
