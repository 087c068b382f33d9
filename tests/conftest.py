"""Fixtures shared by the test modules: the local S3 server (issue 17).

- ``s3_server`` (session): ``rclone serve s3`` over a temporary folder
  (``h5pack.bench.s3local.S3Server``).
- ``s3_proxy``: a fresh counting, fault-injecting proxy in front of it per test
  (``FaultProxy``: ``counts``, ``inject``, ``reset_counts``).
- ``s3_bucket``: a fresh bucket per test reached through ``s3_proxy``
  (``h5pack.bench.s3local.Bucket``: ``url(key)``, ``put(file, key)``, ``put_tree``,
  ``storage_options`` with no backoff between retries and 5 tries, ``proxy``).
- ``chunk_cache_in_tmp`` (session, autouse): the default disk cache of remote chunks
  (``read.diskcache.default_cache_dir``) in the session's temporary folder, not in the
  user's cache directory (~/.cache/h5pack), where every test run would add to it.
- ``place`` (parametrised ``s3``, ``gs``, ``az``, ``http``): a fresh bucket of one store's
  local server behind a fresh counting proxy (``tests.servers.Place``, the API of
  ``Bucket``); ``gcs_server``, ``azurite_server``, ``range_server`` (session) run them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.s3local import Bucket, FaultProxy, S3Server
from tests.servers import AzuriteServer, GCSServer, Place, RangeServer

_buckets = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def chunk_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    folder = tmp_path_factory.mktemp("chunk-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("h5pack.read.diskcache.default_cache_dir", lambda: folder)
        yield


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS_* variable set: only what a test passes configures the client."""
    from h5pack.core.s3 import S3Options

    for variable in S3Options.ENVIRONMENT:
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def s3_bucket(s3_server: S3Server, s3_proxy: FaultProxy) -> Bucket:
    return Bucket(
        s3_server,
        s3_proxy,
        f"bucket-{next(_buckets)}",
        # no waits between retries, and the count of tries the tests were written for
        # (tests of retries by time set their own: tests/test_retry.py)
        {
            "backoff_s": 0.0,
            "throttle_backoff_s": 0.0,
            "max_attempts": 5,
            "read_timeout_s": 15.0,
            "connect_timeout_s": 15.0,
        },
    )


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSServer]:
    with GCSServer(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    with AzuriteServer(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture(scope="session")
def range_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeServer]:
    with RangeServer(tmp_path_factory.mktemp("http")) as server:
        yield server


@pytest.fixture(params=["s3", "gs", "az", "http"])
def place(request: pytest.FixtureRequest) -> Iterator[Bucket | Place]:
    """A fresh bucket of each store's local server, behind a fresh counting proxy."""
    scheme = request.param
    if scheme == "s3":
        yield request.getfixturevalue("s3_bucket")
        return
    server = request.getfixturevalue(
        {"gs": "gcs_server", "az": "azurite_server", "http": "range_server"}[scheme]
    )
    with FaultProxy(server.endpoint) as proxy:
        yield Place(server, f"bucket-{next(_buckets)}", proxy)
