"""Checked uploads (NOTE [ Checked uploads ], h5pack/core/s3.py; issue 28 item 7).

A PUT body damaged on the way (the proxy flips a byte) is refused by the server, which
checks the Content-MD5 h5pack sends, and the PUT is tried again; an answer whose ETag is
not the bytes' MD5 (the proxy rewrites it) makes h5pack delete the object and try again.
A conversion never ends with rc 0 and a damaged object.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from h5pack.cli.main import cli
from h5pack.core import s3
from h5pack.errors import RemoteError
from h5pack.synthetic import SampleSpec, make_image_folder
from tests.s3local import Bucket, Fault

MIB = 2**20


def store_of(bucket: Bucket, **options: object) -> s3.S3Store:
    return s3.S3Store.of({**bucket.storage_options, "read_timeout_s": 30.0, **options})


def test_a_flipped_put_body_is_refused_and_sent_again(s3_bucket: Bucket) -> None:
    data = np.random.default_rng(0).bytes(5000)
    proxy = s3_bucket.proxy
    proxy.inject(Fault("flip", method="PUT", keep_bytes=1234))
    store_of(s3_bucket).put(s3_bucket.url("small.bin"), data)
    assert proxy.counts.requests["PUT"] == 2  # refused (BadDigest), then accepted
    assert (s3_bucket.path / "small.bin").read_bytes() == data


def test_flipped_parts_are_refused_and_sent_again(s3_bucket: Bucket, tmp_path: Path) -> None:
    local = tmp_path / "big.bin"
    local.write_bytes(np.random.default_rng(1).bytes(3 * MIB + 17))
    proxy = s3_bucket.proxy
    proxy.inject(Fault("flip", method="PUT", keep_bytes=99), times=2)
    info = store_of(s3_bucket).publish(
        local, s3_bucket.url("big.bin"), if_absent=True, part_size=MIB
    )
    assert proxy.counts.faults == 2
    # S3 keeps the upload and takes the part again; rclone drops the upload when it refuses
    # a part (NoSuchUpload next): the upload is then started again
    assert proxy.counts.requests["PUT"] > 4
    assert store_of(s3_bucket).pending(s3_bucket.url("")) == []  # none left behind
    assert (s3_bucket.path / "big.bin").read_bytes() == local.read_bytes()
    assert info.etag.strip('"').endswith("-4")


def test_an_answer_with_another_etag_is_deleted_and_sent_again(s3_bucket: Bucket) -> None:
    data = b"pack bytes" * 100
    proxy = s3_bucket.proxy
    proxy.inject(Fault("etag", method="PUT"))
    store_of(s3_bucket).put(s3_bucket.url("k.bin"), data)
    assert proxy.counts.requests["PUT"] == 2
    assert proxy.counts.requests["DELETE"] == 1
    assert (s3_bucket.path / "k.bin").read_bytes() == data
    # a server that keeps answering so: one error, and no object left under the key
    proxy.inject(Fault("etag", method="PUT"), times=10)
    store = store_of(s3_bucket, max_attempts=3)
    with pytest.raises(RemoteError, match=r"gave up after 3 attempts.*stored other bytes"):
        store.put(s3_bucket.url("other.bin"), data)
    s3_bucket.server.forget()
    assert not (s3_bucket.path / "other.bin").exists()


def test_a_multipart_completion_with_another_etag_leaves_no_object(
    s3_bucket: Bucket, tmp_path: Path
) -> None:
    local = tmp_path / "big.bin"
    local.write_bytes(np.random.default_rng(2).bytes(2 * MIB + 1))
    # the second POST: CreateMultipartUpload, then CompleteMultipartUpload
    s3_bucket.proxy.inject(Fault("etag", method="POST"), times=2)
    with pytest.raises(RemoteError, match=r"stored other bytes.*the object was deleted"):
        store_of(s3_bucket).publish(local, s3_bucket.url("b.bin"), if_absent=False, part_size=MIB)
    assert not (s3_bucket.path / "b.bin").exists()


def _convert(folder: Path, url: str, bucket: Bucket, *extra: str) -> tuple[int, str]:
    flags = []
    for key, value in {
        **bucket.storage_options,
        "read_timeout_s": 30.0,
        **dict(item.split("=", 1) for item in extra),
    }.items():
        flags += ["--storage-option", f"{key}={value}"]
    result = CliRunner().invoke(cli, ["convert", str(folder), url, *flags])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checked") / "images"
    make_image_folder(root, SampleSpec(num_images=30, num_classes=3, size=(12, 16)))
    return root


def test_convert_through_flipped_puts_packs_a_pack_that_verifies(
    s3_bucket: Bucket, folder: Path
) -> None:
    url = s3_bucket.url("a.h5")
    s3_bucket.proxy.inject(Fault("flip", method="PUT", keep_bytes=4321), times=3)
    code, output = _convert(folder, url, s3_bucket)
    assert code == 0, output
    assert s3_bucket.proxy.counts.faults == 3
    flags = [
        f for k, v in s3_bucket.storage_options.items() for f in ("--storage-option", f"{k}={v}")
    ]
    verified = CliRunner().invoke(cli, ["verify", url, "-q", *flags])
    assert verified.exit_code == 0, verified.output
    assert "30 of 30 samples verified" in verified.output


def test_convert_never_ends_rc_0_with_a_damaged_object(s3_bucket: Bucket, folder: Path) -> None:
    url = s3_bucket.url("a.h5")
    s3_bucket.proxy.inject(Fault("flip", method="PUT", keep_bytes=7), times=10**6)
    code, output = _convert(folder, url, s3_bucket, "max_attempts=3")
    s3_bucket.proxy.clear()
    assert code == 1, output
    assert "BadDigest" in output
    assert "Traceback" not in output
    s3_bucket.server.forget()
    assert not (s3_bucket.path / "a.h5").exists()
