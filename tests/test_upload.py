"""Writing into a bucket (issue 17 item 2): convert, sets, Dask and merge into s3:// URLs.

Against the real local server (``rclone serve s3``, tests/conftest.py) through the counting
proxy. A pack is converted locally into a staging directory, then uploaded whole; what the
bucket holds is read back and compared with a local conversion of the same folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from h5pack import ConvertOptions, TargetExistsError, convert, convert_set, merge_packs
from h5pack.cli.main import cli
from h5pack.core import s3upload
from h5pack.core.packset import MANIFEST_NAME, load_manifest, shard_name
from h5pack.core.s3 import S3Store
from h5pack.errors import H5PackError, OptionsError, PackNotFoundError, RemoteError
from h5pack.read.reader import ReaderOptions
from h5pack.read.setreader import open_reader
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write import publish
from h5pack.write.remote import Staging
from h5pack.write.report import ConvertEvent
from tests.helpers import contents
from tests.s3local import Bucket as ServerBucket
from tests.s3local import Fault

ONE = ConvertOptions(workers=1)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 small JPEGs in 4 classes."""
    root = tmp_path_factory.mktemp("upload") / "images"
    make_image_folder(root, SampleSpec(num_images=40, num_classes=4, size=(12, 16)))
    return root


@pytest.fixture(scope="module")
def single(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local conversion of the folder: the reference."""
    target = tmp_path_factory.mktemp("single") / "all.h5"
    convert(folder, target, ONE)
    return target


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    root = tmp_path / "staging"
    root.mkdir()
    return root


def options_of(bucket: ServerBucket) -> dict[str, Any]:
    # the fixture's 2 s timeouts are for reads; a PUT on a loaded 2-core machine takes longer
    return {**bucket.storage_options, "read_timeout_s": 30.0}


def writer(bucket: ServerBucket) -> S3Store:
    return S3Store.of(options_of(bucket))


def stored(bucket: ServerBucket, key: str) -> Path:
    """The object's bytes as the server keeps them (its folder on disk)."""
    return bucket.path / key


def notes(events: list[ConvertEvent]) -> list[str]:
    return [e.message for e in events if e.kind == "note"]


# -- one pack ---------------------------------------------------------------------------


def test_convert_to_a_bucket_reads_back_as_a_local_conversion(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path, tmp_path: Path
) -> None:
    url = s3_bucket.url("packs/all.h5")
    report = convert(folder, url, ONE, storage_options=options_of(s3_bucket), staging_dir=staging)
    assert report.path == url
    assert report.num_samples == 40
    # Read back through the server: the same pixels, labels, paths, order; through h5pack's
    # remote reader, and as a downloaded file.
    with open_reader(url, ReaderOptions(storage_options=options_of(s3_bucket))) as reader:
        meta = reader.meta
        images = reader.read_images(range(meta.num_samples))
        remote = [
            (path, int(label), int(index), image.tobytes())
            for path, label, index, image in zip(
                reader.paths, meta.labels, meta.source_index, images, strict=True
            )
        ]
    assert remote == contents(single)
    copy = tmp_path / "copy.h5"
    assert writer(s3_bucket).download(s3_bucket.url("packs/all.h5"), copy) == report.file_bytes
    assert contents(copy) == contents(single)
    assert list(staging.iterdir()) == []  # the staging directory went with the run
    assert s3_bucket.proxy.counts.requests.get("PUT", 0) == 1  # one small pack, one PUT


def test_an_existing_object_is_refused_by_url(
    folder: Path, s3_bucket: ServerBucket, staging: Path
) -> None:
    url = s3_bucket.url("pack.h5")
    store = options_of(s3_bucket)
    convert(folder, url, ONE, storage_options=store, staging_dir=staging)
    with pytest.raises(TargetExistsError, match=rf"{url} already exists; pass --overwrite"):
        convert(folder, url, ONE, storage_options=store, staging_dir=staging)
    with pytest.raises(OptionsError, match=rf"{s3_bucket.url('set/')} is a prefix, not a pack"):
        convert(folder, s3_bucket.url("set/"), ONE, storage_options=store, staging_dir=staging)
    again = convert(folder, url, ONE, overwrite=True, storage_options=store, staging_dir=staging)
    assert again.path == url


def test_a_missing_bucket_is_said_before_converting(
    folder: Path, s3_bucket: ServerBucket, staging: Path
) -> None:
    url = "s3://no-such-bucket/pack.h5"
    with pytest.raises(PackNotFoundError, match=r"no bucket 'no-such-bucket' at http"):
        convert(folder, url, ONE, storage_options=options_of(s3_bucket), staging_dir=staging)
    assert list(staging.iterdir()) == []
    assert s3_bucket.proxy.counts.requests.get("PUT", 0) == 0


def test_a_large_pack_goes_up_in_parts(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path, monkeypatch
) -> None:
    monkeypatch.setattr(s3upload, "PART_BYTES", 4096)  # the local server takes small parts
    url = s3_bucket.url("parts.h5")
    report = convert(folder, url, ONE, storage_options=options_of(s3_bucket), staging_dir=staging)
    parts = -(-report.file_bytes // 4096)
    # create + parts + complete (POSTs and PUTs); the object is whole
    counts = s3_bucket.proxy.counts.requests
    assert counts.get("PUT", 0) == parts
    assert counts.get("POST", 0) == 2
    assert contents(stored(s3_bucket, "parts.h5")) == contents(single)
    assert writer(s3_bucket).pending(s3_bucket.url("")) == []


def test_a_part_that_fails_is_retried_then_the_upload_is_aborted(
    s3_bucket: ServerBucket, tmp_path: Path
) -> None:
    data = os.urandom(3 * 5000 + 17)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    bucket = writer(s3_bucket)
    s3_bucket.proxy.inject(Fault("status", status=503, method="PUT"), times=2)
    done = bucket.publish(local, s3_bucket.url("blob.bin"), if_absent=False, part_size=5000)
    assert done.size == len(data)
    assert stored(s3_bucket, "blob.bin").read_bytes() == data
    # A part that keeps failing: one error naming the URL, no object, no parts left.
    s3_bucket.proxy.inject(Fault("reset", method="PUT"), times=50)
    with pytest.raises(RemoteError, match=r"s3://bucket-\d+/other.bin: part \d of 4"):
        bucket.publish(local, s3_bucket.url("other.bin"), if_absent=False, part_size=5000)
    s3_bucket.proxy.clear()
    assert bucket.stat(s3_bucket.url("other.bin")) is None
    assert bucket.pending(s3_bucket.url("")) == []


def test_the_final_put_is_conditional_where_the_server_implements_it(
    folder: Path, s3_bucket: ServerBucket, staging: Path, tmp_path: Path
) -> None:
    # NOTE [ Conditional final PUT ]: the request that makes the pack appear carries
    # If-None-Match: * (rclone ignores it; the HEAD before is its guard)
    url = s3_bucket.url("pack.h5")
    convert(folder, url, ONE, storage_options=options_of(s3_bucket), staging_dir=staging)
    assert s3_bucket.proxy.counts.if_none_match == [("PUT", f"/{s3_bucket.name}/pack.h5")]
    data = os.urandom(3 * 5000 + 17)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    bucket = writer(s3_bucket)
    # a server that implements it, and an object that appeared after the HEAD: refused
    s3_bucket.proxy.inject(Fault("status", status=412, method="PUT", code="PreconditionFailed"))
    with pytest.raises(TargetExistsError, match=r"blob\.bin appeared during the conversion"):
        bucket.publish(local, s3_bucket.url("blob.bin"), if_absent=True)
    assert (
        bucket.stat(s3_bucket.url("blob.bin")) is None
    )  # the fault stood for the taken key: nothing put
    # the multipart upload's completion is the conditional one; refused, it is aborted
    s3_bucket.proxy.reset_counts()
    s3_bucket.proxy.inject(Fault("delay", method="POST"))  # the start passes (no delay)
    s3_bucket.proxy.inject(Fault("status", status=412, method="POST", code="PreconditionFailed"))
    with pytest.raises(TargetExistsError, match="appeared during the conversion"):
        bucket.publish(local, s3_bucket.url("parts.bin"), part_size=5000, if_absent=True)
    assert bucket.pending(s3_bucket.url("")) == []
    s3_bucket.proxy.clear()
    # a server that does not implement it (501): asked again without, then never with it
    s3_bucket.proxy.reset_counts()
    s3_bucket.proxy.inject(Fault("status", status=501, method="PUT", code="NotImplemented"))
    assert bucket.publish(local, s3_bucket.url("blob.bin"), if_absent=True).size == len(data)
    assert stored(s3_bucket, "blob.bin").read_bytes() == data
    assert s3_bucket.proxy.counts.requests["PUT"] == 2
    assert bucket.publish(local, s3_bucket.url("again.bin"), if_absent=True).size == len(data)
    assert len(s3_bucket.proxy.counts.if_none_match) == 1  # the refused one only


def test_a_full_staging_directory_stops_before_decoding(
    folder: Path, s3_bucket: ServerBucket, staging: Path, monkeypatch
) -> None:
    url = s3_bucket.url("big.h5")
    monkeypatch.setattr(publish, "free_bytes", lambda directory: 100)
    with pytest.raises(H5PackError, match=rf"staging directory {staging}.*--staging-dir") as caught:
        convert(
            folder,
            url,
            ConvertOptions(workers=1, mode="encoded"),
            storage_options=options_of(s3_bucket),
            staging_dir=staging,
        )
    assert "no space left" in str(caught.value)
    assert writer(s3_bucket).stat(s3_bucket.url("big.h5")) is None  # nothing uploaded
    assert list(staging.iterdir()) == []


# A conversion into the bucket that stops for good after the first part of its upload, for
# the test below to kill: the multipart upload is then open, with one part stored.
_HANG = """
import sys, threading
from pathlib import Path
import h5pack.core.s3 as s3
import h5pack.core.s3upload as s3upload
from h5pack import ConvertOptions, convert

s3upload.PART_BYTES = 4096
s3upload.UPLOAD_CONCURRENCY = 1
original = s3.S3Store.call

def call(self, url, what, *args, **kwargs):
    if what.startswith("part 2 "):
        Path(sys.argv[3]).write_text("in the upload")
        threading.Event().wait()  # until the test kills this process
    return original(self, url, what, *args, **kwargs)

s3.S3Store.call = call
convert(sys.argv[1], sys.argv[2], ConvertOptions(workers=1), staging_dir=sys.argv[4])
"""


def environment_of(bucket: ServerBucket) -> dict[str, str]:
    """The environment variables that reach the bucket's server (through its proxy)."""
    store = bucket.storage_options
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": str(store["endpoint"]),
        "AWS_ACCESS_KEY_ID": str(store["access_key_id"]),
        "AWS_SECRET_ACCESS_KEY": str(store["secret_access_key"]),
        "AWS_REGION": str(store["region"]),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def test_kill_9_mid_upload_leaves_no_object_and_the_rerun_sweeps(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path, tmp_path: Path
) -> None:
    url, marker = s3_bucket.url("killed.h5"), tmp_path / "marker"
    child = subprocess.Popen(
        [sys.executable, "-c", _HANG, str(folder), url, str(marker), str(staging)],
        env=environment_of(s3_bucket),
    )
    try:
        while not marker.exists() and child.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), "the conversion did not reach its upload"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    bucket = writer(s3_bucket)
    assert bucket.stat(s3_bucket.url("killed.h5")) is None  # never part of a pack under its key
    assert [u.url for u in bucket.pending(s3_bucket.url(""))] == [url]  # its parts are billed
    assert len(list(staging.iterdir())) == 1  # and its staging directory is left
    events: list[ConvertEvent] = []
    convert(
        folder,
        url,
        ONE,
        storage_options=options_of(s3_bucket),
        staging_dir=staging,
        on_event=events.append,
    )
    said = notes(events)
    assert any("aborted 1 incomplete multipart upload" in n and "killed.h5" in n for n in said)
    assert any(n.startswith("removed 1 leftover") for n in said)
    assert bucket.pending(s3_bucket.url("")) == []
    assert list(staging.iterdir()) == []
    assert contents(stored(s3_bucket, "killed.h5")) == contents(single)


def test_a_live_runs_staging_directory_is_left_alone(tmp_path: Path) -> None:
    with Staging(tmp_path, what="a pack") as first, Staging(tmp_path, what="another") as second:
        assert first.path.is_dir()
        assert second.removed == []
    (tmp_path / "h5pack-staging-1-dead").mkdir()  # no lock file: killed before it made one
    with Staging(tmp_path, what="a pack") as third:
        assert third.removed == [tmp_path / "h5pack-staging-1-dead"]
    assert list(tmp_path.iterdir()) == []


# -- pack sets --------------------------------------------------------------------------


def test_a_set_in_a_bucket_reads_back_as_a_local_set(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path
) -> None:
    url = s3_bucket.url("set/")
    store = options_of(s3_bucket)
    report = convert_set(folder, url, ONE, shards=3, storage_options=store, staging_dir=staging)
    assert report.root == url
    assert report.manifest == url + MANIFEST_NAME
    assert [s.path for s in report.shards] == [url + shard_name(i, 3) for i in range(3)]
    # The server's folder is the set as the bucket holds it.
    assert contents(stored(s3_bucket, "set")) == contents(single)
    manifest = load_manifest(stored(s3_bucket, "set"))
    assert [e.file_bytes for e in manifest.shards] == [s.file_bytes for s in report.shards]


def test_a_restart_in_a_bucket_reuses_matching_shards_and_refuses_others(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path
) -> None:
    url = s3_bucket.url("set/")
    store = options_of(s3_bucket)
    first = convert_set(
        folder, url, ONE, shards=2, only=1, storage_options=store, staging_dir=staging
    )
    assert first.manifest is None
    assert first.missing == (0,)
    assert (
        writer(s3_bucket).stat(s3_bucket.url("set/" + MANIFEST_NAME)) is None
    )  # the manifest comes last
    s3_bucket.proxy.reset_counts()
    done = convert_set(folder, url, ONE, shards=2, storage_options=store, staging_dir=staging)
    assert [s.status for s in done.shards] == ["written", "reused"]
    assert s3_bucket.proxy.counts.requests.get("PUT", 0) == 2  # shard 0 and the manifest
    assert contents(stored(s3_bucket, "set")) == contents(single)
    # The manifest of another split: refused by its URL.
    with pytest.raises(TargetExistsError, match=rf"{url}{MANIFEST_NAME} describes a pack set"):
        convert_set(folder, url, ONE, shards=3, storage_options=store, staging_dir=staging)
    # A shard of another split under the same name: refused by its URL.
    writer(s3_bucket).delete(
        s3_bucket.url("set/" + MANIFEST_NAME)
    )  # through S3: rclone caches listings
    other = ConvertOptions(workers=1, seed=1)
    name = url + shard_name(0, 2)
    with pytest.raises(TargetExistsError, match=rf"{name} exists but is not shard 0/2.*seed"):
        convert_set(
            folder, url, other, shards=2, only=0, storage_options=store, staging_dir=staging
        )
    rebuilt = convert_set(
        folder, url, other, shards=2, overwrite=True, storage_options=store, staging_dir=staging
    )
    assert [s.status for s in rebuilt.shards] == ["written", "written"]
    assert load_manifest(stored(s3_bucket, "set")).seed == 1


def test_a_damaged_shard_in_a_bucket_is_refused_by_url(
    folder: Path, s3_bucket: ServerBucket, staging: Path
) -> None:
    url = s3_bucket.url("set/")
    store = options_of(s3_bucket)
    convert_set(folder, url, ONE, shards=2, only=0, storage_options=store, staging_dir=staging)
    key = "set/" + shard_name(0, 2)
    damaged = staging.parent / "damaged.h5"
    damaged.write_bytes(stored(s3_bucket, key).read_bytes()[:-4096])  # an interrupted copy
    writer(s3_bucket).publish(
        damaged, s3_bucket.url(key), if_absent=False
    )  # through S3: rclone caches what it serves
    name = url + shard_name(0, 2)
    with pytest.raises(TargetExistsError, match=rf"{name} exists.*cannot be read"):
        convert_set(folder, url, ONE, shards=2, storage_options=store, staging_dir=staging)


def test_cli_converts_into_a_bucket_from_the_environment(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path, monkeypatch
) -> None:
    for name, value in environment_of(s3_bucket).items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    url = s3_bucket.url("cli/")
    staging_flag = ("--staging-dir", str(staging))
    result = CliRunner().invoke(
        cli,
        [*("convert", str(folder), url, "--shards", "2", "--workers", "1", "-q"), *staging_flag],
    )
    assert result.exit_code == 0, result.output
    assert f"manifest {url}{MANIFEST_NAME}" in result.output
    assert contents(stored(s3_bucket, "cli")) == contents(single)
    again = CliRunner().invoke(
        cli, ["convert", str(folder), url + "one.h5", "-q", "--workers", "1"]
    )
    assert again.exit_code == 0, again.output
    refused = CliRunner().invoke(cli, ["convert", str(folder), url + "one.h5", "-q"])
    assert refused.exit_code == 1
    assert f"Error: {url}one.h5 already exists" in refused.output


# -- merge ------------------------------------------------------------------------------


def test_merge_reads_and_writes_urls(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path, tmp_path: Path
) -> None:
    store = options_of(s3_bucket)
    convert_set(
        folder, s3_bucket.url("set/"), ONE, shards=3, storage_options=store, staging_dir=staging
    )
    local_set = tmp_path / "local"
    convert_set(folder, local_set, ONE, shards=3)
    reference = tmp_path / "merged.h5"
    merge_packs(local_set, reference)
    url = s3_bucket.url("merged.h5")
    report = merge_packs(s3_bucket.url("set/"), url, storage_options=store, staging_dir=staging)
    assert report.path == url
    assert report.sources == tuple(s3_bucket.url("set/" + shard_name(i, 3)) for i in range(3))
    assert contents(stored(s3_bucket, "merged.h5")) == contents(reference)
    # A URL source into a local target, and a list of URLs.
    to_local = tmp_path / "from-bucket.h5"
    shards = [s3_bucket.url("set/" + shard_name(i, 3)) for i in range(3)]
    merge_packs(shards, to_local, storage_options=store, staging_dir=staging)
    assert contents(to_local) == contents(reference)
    with pytest.raises(TargetExistsError, match=rf"{url} already exists"):
        merge_packs(s3_bucket.url("set/"), url, storage_options=store, staging_dir=staging)
    assert list(staging.iterdir()) == []


def test_cli_takes_storage_options(
    folder: Path, single: Path, s3_bucket: ServerBucket, staging: Path, tmp_path: Path
) -> None:
    flags = [f"--storage-option={k}={v}" for k, v in options_of(s3_bucket).items()]
    url = s3_bucket.url("flags.h5")
    converted = CliRunner().invoke(
        cli, ["convert", str(folder), url, "-q", "--workers", "1", *flags]
    )
    assert converted.exit_code == 0, converted.output
    merged = tmp_path / "back.h5"
    result = CliRunner().invoke(
        cli, ["merge", url, str(merged), "-q", "--staging-dir", str(staging), *flags]
    )
    assert result.exit_code == 0, result.output
    assert contents(merged) == contents(single)
