"""No secret in any repr, str, log line or error (NOTE [ No secret in any message ]; issue 28
item 6): keys, session tokens, signatures, presigned query strings.

Fifty failing runs against the local server (faults of every kind, bad credentials, a bad
endpoint, a server that echoes the request's headers in its error) are collected, output,
errors, tracebacks and log records together, and searched for every secret.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from h5pack.cli.main import cli
from h5pack.core import s3
from h5pack.core.s3options import lean_get
from h5pack.core.secrets import redacted, scrub
from h5pack.read.options import ReaderOptions
from h5pack.read.reader import PackReader
from h5pack.synthetic import SampleSpec, make_image_folder
from tests.helpers import make_pack
from tests.s3local import ACCESS_KEY, SECRET_KEY, Bucket, Fault, free_port

TOKEN = "IQoJb3JpZ2luX2VjEH5pack0session0token0value0123456789"
FAKE_ID = "AKIAH5PACKFAKE000001"
FAKE_SECRET = "wJalrXUtnFEMI/K7MDENG/h5packFAKEsecret0001"
SECRETS = [ACCESS_KEY, SECRET_KEY, TOKEN, FAKE_ID, FAKE_SECRET]
# a signature or presigned credential with its value still there
SIGNED = re.compile(r"(?i)(signature|credential|security-token)[=:]\s*(?!\*\*\*)[A-Za-z0-9/%+]")


def assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown in: ...{_around(text, secret)}..."
    found = SIGNED.search(text)
    assert found is None, f"a signature shown: ...{text[found.start() - 80 : found.end() + 80]}..."


def _around(text: str, secret: str) -> str:
    at = text.index(secret)
    return text[max(0, at - 120) : at + 40]


def test_scrub_and_redacted() -> None:
    header = (
        "Authorization: AWS4-HMAC-SHA256 Credential=AKIAX/20260101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=0123abcd\nX-Amz-Security-Token: FwoG+/=="
    )
    assert_clean(scrub(header).replace("AKIAX", FAKE_ID))
    assert "SignedHeaders=host" not in scrub(header)  # the whole header line goes
    url = f"http://h/b/k?X-Amz-Credential={FAKE_ID}%2F2026&X-Amz-Signature=99ff&partNumber=2"
    assert scrub(url) == "http://h/b/k?X-Amz-Credential=***&X-Amz-Signature=***&partNumber=2"
    options = {"endpoint": "http://h:1", "key": FAKE_ID, "secret": FAKE_SECRET, "token": TOKEN}
    assert redacted(options) == {
        "endpoint": "http://h:1",
        "key": "***",
        "secret": "***",
        "token": "***",
    }


def test_no_repr_or_str_shows_a_secret(s3_bucket: Bucket, tmp_path: Path) -> None:
    url = s3_bucket.put(make_pack(tmp_path / "a.h5"), "a.h5")
    given = {**s3_bucket.storage_options, "session_token": TOKEN}
    options = s3.S3Store.of(given).options
    store = s3.S3Store(options)
    source = store.source(url)
    reader_options = ReaderOptions(storage_options=given)
    objects: list[object] = [options, store, source, reader_options, store.stat(url)]
    lean = lean_get(options, s3_bucket.name, "a.h5")
    objects += [lean, getattr(lean, "signer", None), getattr(lean, "pool", None)]
    with PackReader(url, reader_options) as remote:
        objects += [remote, remote.options, remote.stored, remote._pack.index]
        text = "\n".join(f"{o!r}\n{o}" for o in objects)
    assert "session_token='***'" in repr(options)
    assert_clean(text)


def test_no_store_options_repr_shows_a_secret() -> None:
    """Every store's options, given secrets under each name it takes."""
    from h5pack.core.azure import AzureStore
    from h5pack.core.http import HTTPStore

    azure = AzureStore.of(
        {
            "account_name": "devstoreaccount1",
            "account_key": FAKE_SECRET,
            "sas_token": f"sv=2024&sig={TOKEN}",
            "connection_string": f"AccountName=a;AccountKey={FAKE_SECRET}",
        }
    )
    web = HTTPStore.of({"headers": {"Authorization": f"Bearer {TOKEN}"}})
    s3_store = s3.S3Store.of({"key": FAKE_ID, "secret": FAKE_SECRET, "token": TOKEN})
    for store in (azure, web, s3_store):
        assert_clean(f"{store!r} {store} {store.options!r} {store.options}")  # type: ignore[attr-defined]


def _flags(options: dict[str, object]) -> list[str]:
    return [f for k, v in options.items() for f in ("--storage-option", f"{k}={v}")]


Run = Callable[[Bucket, str, Path], tuple[list[str], dict[str, str]]]


def _scenarios(folder: Path) -> list[tuple[str, Fault | None, Run]]:
    """(name, fault injected for every request, the command and its environment)."""

    def fast(bucket: Bucket, **more: object) -> dict[str, object]:
        return {**bucket.storage_options, "max_attempts": 2, "session_token": TOKEN, **more}

    def info(**more: object) -> Run:
        return lambda b, url, _: (["info", url, *_flags(fast(b, **more))], {})

    def verify(b: Bucket, url: str, _: Path) -> tuple[list[str], dict[str, str]]:
        return ["verify", url, "-q", *_flags(fast(b))], {}

    def convert(**more: object) -> Run:
        def run(b: Bucket, url: str, _: Path) -> tuple[list[str], dict[str, str]]:
            target = b.url("out.h5")
            return ["convert", str(folder), target, *_flags(fast(b, **more))], {}

        return run

    def environment(endpoint: str | None) -> Run:
        def run(b: Bucket, url: str, _: Path) -> tuple[list[str], dict[str, str]]:
            env = {
                "AWS_ENDPOINT_URL": endpoint or str(b.storage_options["endpoint"]),
                "AWS_ACCESS_KEY_ID": FAKE_ID,
                "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
                "AWS_SESSION_TOKEN": TOKEN,
            }
            return ["info", url, "--storage-option", "max_attempts=2"], env

        return run

    nowhere = f"http://127.0.0.1:{free_port()}"
    return [
        ("503 SlowDown", Fault("status", status=503, method=None), info()),
        ("500", Fault("status", status=500, method=None), info()),
        ("reset", Fault("reset", method=None), verify),
        ("truncated", Fault("truncate", keep_bytes=5, method=None), info()),
        ("400 echo", Fault("status", status=400, code="InvalidRequest", echo=True), info()),
        ("403 echo", Fault("status", status=403, code="SignatureDoesNotMatch", echo=True), info()),
        ("500 echo", Fault("status", status=500, echo=True, method=None), verify),
        ("bad secret", None, info(secret_access_key=FAKE_SECRET)),
        ("bad key id", None, info(access_key_id=FAKE_ID, secret_access_key=FAKE_SECRET)),
        ("bad endpoint", None, info(endpoint=nowhere)),
        ("environment", None, environment(None)),
        ("environment, no server", None, environment(nowhere)),
        (
            "missing bucket",
            None,
            lambda b, _, t: (["info", "s3://nope/a.h5", *_flags(fast(b))], {}),
        ),
        ("PUT 500", Fault("status", status=500, method="PUT"), convert()),
        ("PUT flipped", Fault("flip", method="PUT", keep_bytes=3), convert()),
        (
            "PUT echo",
            Fault("status", status=400, code="InvalidArgument", echo=True, method="PUT"),
            convert(),
        ),
        ("PUT bad secret", None, convert(secret_access_key=FAKE_SECRET)),
    ]


def test_fifty_failing_runs_show_no_secret(
    s3_bucket: Bucket,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = tmp_path / "images"
    make_image_folder(folder, SampleSpec(num_images=6, num_classes=2, size=(8, 8)))
    url = s3_bucket.put(make_pack(tmp_path / "a.h5"), "a.h5")
    scenarios = _scenarios(folder)
    caplog.set_level(logging.DEBUG, logger="h5pack")
    combined, failed = [], set()
    for number in range(50):
        name, fault, run = scenarios[number % len(scenarios)]
        args, env = run(s3_bucket, url, tmp_path)
        with monkeypatch.context() as patch:
            for variable in s3.S3Options.ENVIRONMENT:
                patch.delenv(variable, raising=False)
            for variable, value in env.items():
                patch.setenv(variable, value)
            if fault is not None:
                s3_bucket.proxy.inject(fault, times=10**6)
            result = CliRunner().invoke(cli, args)
            s3_bucket.proxy.clear()
        assert result.exit_code != 0, f"{name}: {result.output}"
        failed.add(name)
        combined.append(result.output)
        if result.exception is not None:
            combined.append("".join(traceback.format_exception(result.exception)))
    combined.append(caplog.text)
    # the Python API's errors too: their str, repr and traceback
    bad = {**s3_bucket.storage_options, "secret_access_key": FAKE_SECRET, "session_token": TOKEN}
    try:
        PackReader(url, ReaderOptions(storage_options=bad))
    except Exception as err:
        combined += [str(err), repr(err), "".join(traceback.format_exception(err))]
    assert failed == {name for name, _, _ in scenarios}
    assert_clean("\n".join(combined))
