"""Pack set manifests that cannot be read say what is wrong (issue 28 item 8).

A shard path that is a URL, in a local manifest or in a bucket's, and a ``packset.json``
that is not a regular file (a FIFO: never opened, the read would block).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from h5pack import ConvertOptions, convert_set
from h5pack.errors import FormatError
from h5pack.read.options import ReaderOptions
from h5pack.read.setreader import open_reader
from h5pack.synthetic import SampleSpec, make_image_folder
from tests.s3local import Bucket


@pytest.fixture
def local_set(tmp_path: Path) -> Path:
    make_image_folder(tmp_path / "images", SampleSpec(num_images=8, num_classes=2, size=(8, 8)))
    convert_set(tmp_path / "images", tmp_path / "set", ConvertOptions(workers=1), shards=2)
    return tmp_path / "set"


def _point_a_shard_at(folder: Path, url: str) -> None:
    manifest = folder / "packset.json"
    data = json.loads(manifest.read_text())
    data["shards"][1]["path"] = url
    manifest.write_text(json.dumps(data))


def test_a_url_in_a_local_manifest_is_named(local_set: Path) -> None:
    _point_a_shard_at(local_set, "s3://otherbucket/shard.h5")
    with pytest.raises(FormatError) as err:
        open_reader(local_set)
    message = str(err.value)
    assert message.startswith(f"{local_set / 'packset.json'}: shard path 's3://otherbucket/")
    assert "is a URL" in message
    assert "no such pack" not in message


def test_a_url_in_a_bucket_manifest_is_named(local_set: Path, s3_bucket: Bucket) -> None:
    _point_a_shard_at(local_set, "https://elsewhere.example/shard.h5")
    url = s3_bucket.put_tree(local_set, "set")
    with pytest.raises(FormatError, match=r"packset\.json: shard path 'https://elsewhere") as err:
        open_reader(url, ReaderOptions(storage_options=s3_bucket.storage_options))
    assert url in str(err.value)
    assert "HTTP 400" not in str(err.value)
    assert s3_bucket.proxy.counts.gets == 1  # the manifest only: no shard asked for


def test_a_fifo_named_packset_json_is_named_and_never_opened(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    os.mkfifo(folder / "packset.json")  # opening it to read would block this test
    with pytest.raises(FormatError, match=r"packset\.json is not a regular file"):
        open_reader(folder)
    with pytest.raises(FormatError, match=r"packset\.json is not a regular file"):
        open_reader(folder / "packset.json")
