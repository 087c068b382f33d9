"""With no S3 server where the settings point, the error names the endpoint and its origin."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from h5pack.cli.main import cli
from tests.s3local import free_port

pytest.importorskip("boto3")


@pytest.fixture
def nowhere(no_aws_environment: None, monkeypatch: pytest.MonkeyPatch) -> str:
    """An endpoint where no server listens (connections refused), with credentials set."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    return f"http://127.0.0.1:{free_port()}"


def _info(*options: str) -> str:
    args = ["info", "s3://demo/pack.h5"]
    for option in ("attempts=2", "backoff_s=0", "throttle_backoff_s=0", *options):
        args += ["--storage-option", option]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    return result.output


def test_an_endpoint_from_the_environment_is_named_with_its_variable(
    nowhere: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", nowhere)
    assert f"from {nowhere} (set by AWS_ENDPOINT_URL): gave up after 2 attempts" in _info()


def test_an_endpoint_from_a_storage_option_is_named_with_the_flag(
    nowhere: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # the flag wins
    output = _info(f"endpoint={nowhere}")
    assert f"from {nowhere} (set by the storage option endpoint (--storage-option" in output
