"""The lean ranged GET (core.s3http, NOTE [ The lean ranged GET ]): signature, paths, fork."""

from __future__ import annotations

import datetime
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

from h5pack.core import s3, s3http
from h5pack.core.source import SourceChangedError, readable
from h5pack.core.store import open_source
from h5pack.errors import OptionsError, RemoteError
from tests.s3local import Bucket, Fault

DATA = np.random.default_rng(1).integers(0, 255, 200_000, dtype=np.uint8).tobytes()
WHEN = datetime.datetime(2026, 12, 1, 18, 0, 0, tzinfo=datetime.timezone.utc)


@pytest.fixture
def remote(s3_bucket: Bucket, tmp_path: Path) -> tuple[Bucket, str]:
    local = tmp_path / "blob.bin"
    local.write_bytes(DATA)
    return s3_bucket, s3_bucket.put(local, "a dir/blob+1.bin")  # a key that needs quoting


@pytest.mark.parametrize("token", [None, "a-session-token"])
def test_the_signature_is_botocores(token: str | None) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    target = s3http.Target("https", "bucket.s3.eu-west-3.amazonaws.com", "/a%20b/c.h5", "eu-west-3")
    extra = {"range": "bytes=10-99", "if-match": '"abc"'}
    signer = s3http.Signer(lambda: ("AKID", "SECRET", token), clock=lambda: WHEN)
    ours = signer.headers("GET", target, extra)

    request = AWSRequest(
        method="GET",
        url=f"https://{target.netloc}{target.path}",
        headers={"Range": extra["range"], "If-Match": extra["if-match"]},
    )
    request.context["timestamp"] = WHEN.strftime("%Y%m%dT%H%M%SZ")
    auth = S3SigV4Auth(Credentials("AKID", "SECRET", token), "s3", "eu-west-3")
    auth._modify_request_before_signing(request)  # the headers it signs, as add_auth does
    signature = auth.signature(
        auth.string_to_sign(request, auth.canonical_request(request)), request
    )
    assert ours["authorization"].endswith(f"Signature={signature}")
    assert ours["x-amz-date"] == "20261201T180000Z"
    assert ("x-amz-security-token" in ours) == (token is not None)


def test_the_lean_get_reads_ranges_with_one_get_each(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    source = open_source(url, storage_options=bucket.storage_options)
    assert isinstance(source, s3.S3Source)
    ranges = [(0, 10), *((i * 9000, i * 9000 + 7000) for i in range(1, 15))]
    got = source.read_ranges(ranges)
    assert [bytes(g) for g in got] == [DATA[a:b] for a, b in ranges]
    assert bucket.proxy.counts.gets == len(ranges)
    assert bucket.proxy.counts.body_bytes == sum(b - a for a, b in ranges)
    assert source._lean is not None  # the chunks' GETs took the lean path
    # every GET after the first carried If-Match with the ETag the first answer gave
    buffer = np.zeros(5000, dtype=np.uint8)
    source.read_into(buffer, 100)
    assert buffer.tobytes() == DATA[100:5100]
    assert source.identity().size == len(DATA)


def test_botocores_path_is_one_option_away(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    options = {**bucket.storage_options, "ranged_gets": "botocore"}
    source = open_source(url, storage_options=options)
    assert bytes(source.read(40, 4040)) == DATA[40:4040]
    assert source._lean is None
    with pytest.raises(OptionsError, match="ranged_gets should be 'lean' or 'botocore'"):
        s3.S3Options.of({"ranged_gets": "fast"})


def test_a_replaced_object_is_refused_on_the_lean_path(
    remote: tuple[Bucket, str], tmp_path: Path
) -> None:
    bucket, url = remote
    source = open_source(url, storage_options=bucket.storage_options)
    source.read(0, 10)
    other = tmp_path / "other.bin"
    other.write_bytes(DATA[::-1])
    bucket.put(other, "a dir/blob+1.bin")
    with pytest.raises(SourceChangedError, match="was replaced"):
        source.read(10, 20)


@pytest.mark.parametrize(
    "fault",
    [Fault("reset"), Fault("status", status=503), Fault("truncate", keep_bytes=10)],
    ids=["reset", "503", "truncated"],
)
def test_the_lean_get_retries_then_names_the_url(remote: tuple[Bucket, str], fault: Fault) -> None:
    bucket, url = remote
    source = open_source(url, storage_options={**bucket.storage_options, "attempts": 3})
    source.read(0, 10)
    bucket.proxy.reset_counts()
    bucket.proxy.inject(fault, times=2)
    assert bytes(source.read(500, 9500)) == DATA[500:9500]
    assert bucket.proxy.counts.gets == 3
    bucket.proxy.inject(fault, times=3)
    with pytest.raises(
        RemoteError, match=r"bytes 500\.\.9499 from .*: gave up after 3 attempts"
    ) as e:
        source.read(500, 9500)
    assert url in str(e.value)


def test_a_missing_object_and_denied_keys_on_the_lean_path(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    with pytest.raises(Exception, match="no such object"):
        open_source(bucket.url("nope.bin"), storage_options=bucket.storage_options).read(0, 5)
    denied = {**bucket.storage_options, "secret_access_key": "wrong"}
    with pytest.raises(RemoteError, match="access denied"):
        open_source(url, storage_options=denied).read(0, 5)


def _read_in_child(source: s3.S3Source, queue: multiprocessing.Queue[object]) -> None:
    try:
        queue.put((os.getpid(), bytes(source.read(1000, 2000))))
    except BaseException as err:  # the parent reports it
        queue.put(repr(err))


def test_a_forked_child_makes_its_own_connections(remote: tuple[Bucket, str]) -> None:
    bucket, url = remote
    source = open_source(url, storage_options=bucket.storage_options)
    assert isinstance(source, s3.S3Source)
    source.read(0, 10)  # the parent holds a connection now
    parent_pool = source._lean.pool if source._lean else None
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = context.Queue()
    child = context.Process(target=_read_in_child, args=(source, queue))
    child.start()
    found = queue.get()
    child.join()
    assert isinstance(found, tuple), found
    assert found[1] == DATA[1000:2000]
    assert bytes(source.read(20, 30)) == DATA[20:30]  # the parent's connection still works
    assert source._lean is not None
    assert source._lean.pool is parent_pool


def test_a_proxy_of_the_environment_keeps_botocores_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = s3http.Target("https", "b.s3.amazonaws.com", "/k", "us-east-1")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert s3http.uses_proxy(target)
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.delenv("https_proxy", raising=False)
    assert not s3http.uses_proxy(target)


def test_the_signer_asks_for_the_credentials_at_every_request() -> None:
    keys = iter([("A1", "S1", None), ("A2", "S2", "T2")])
    signer = s3http.Signer(lambda: next(keys), clock=lambda: WHEN)
    target = s3http.Target("http", "127.0.0.1:9", "/b/k", "us-east-1")
    first = signer.headers("GET", target, {"range": "bytes=0-1"})
    second = signer.headers("GET", target, {"range": "bytes=0-1"})
    assert "Credential=A1/" in first["authorization"]
    assert "Credential=A2/" in second["authorization"]  # refreshed credentials are used
    assert second["x-amz-security-token"] == "T2"


def _open_and_read_without_botocore(url: str, options: dict[str, object], queue: object) -> None:
    def refuse(_: object) -> None:
        raise AssertionError("a botocore client was built in the worker")

    try:
        s3.make_client = refuse  # type: ignore[assignment]  # this child's copy only
        source = open_source(url, storage_options=options)  # a worker reopens the pack
        tail, start = source.read_tail(1000)
        body = bytes(source.read(30, 40))
        queue.put((bytes(tail), start, body))  # type: ignore[attr-defined]
    except BaseException as err:  # the parent reports it
        queue.put(repr(err))  # type: ignore[attr-defined]


def test_a_forked_worker_with_keys_builds_no_botocore_client(remote: tuple[Bucket, str]) -> None:
    # the object's target is data kept across fork; explicit keys need no session: a worker
    # reads its pack's tail and chunks on the lean path alone (~0.15 s CPU saved per worker)
    bucket, url = remote
    open_source(url, storage_options=bucket.storage_options).read_tail(1000)  # the parent
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(
        target=_open_and_read_without_botocore, args=(url, bucket.storage_options, queue)
    )
    child.start()
    found = queue.get()
    child.join()
    assert found == (DATA[-1000:], len(DATA) - 1000, DATA[30:40])


def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    # servers drop keep-alive connections after a while (between epochs): the pool skips
    # them instead of failing the next request and costing one of its tries
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        for _ in range(2):
            accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    netloc = f"127.0.0.1:{listener.getsockname()[1]}"
    pool = s3http.Connections("http", netloc, connect_timeout_s=5, read_timeout_s=5)
    first = pool.take()
    pool.give(first)
    assert pool.take() is first  # still open: reused
    pool.give(first)
    while not accepted:
        threading.Event().wait(0.01)
    accepted[0].close()  # the server drops it
    assert first.sock is not None
    assert readable(first.sock, 5)  # its EOF has arrived
    second = pool.take()
    assert second is not first
    assert first.sock is None  # closed by the pool
    second.close()
    thread.join(5)
    for sock in accepted:
        sock.close()
    listener.close()
