"""Sample sources (write.sources): the folder, in-memory arrays and a tar read in place."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from h5pack import ConvertOptions, convert, convert_set
from h5pack.check import verify_pack
from h5pack.cli.main import cli
from h5pack.errors import DecodeError, OptionsError, SourceError
from h5pack.write.scan import scan
from h5pack.write.sources import (
    ArraySource,
    FolderSource,
    TarSource,
    sample_source,
)
from h5pack.write.sources.base import image_bytes
from tests.helpers import contents, make_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    make_folder(root, classes=("cat", "dog", "eel"), per_class=5, vary=True)
    return root


def tar_of(folder: Path, target: Path, arcname: str = "images") -> Path:
    with tarfile.open(target, "w") as archive:  # the folder itself, as `tar -cf x.tar images/`
        archive.add(folder, arcname=arcname)
    return target


def test_folder_source_lists_what_scan_finds(folder: Path) -> None:
    source = sample_source(folder)
    assert isinstance(source, FolderSource)
    found = scan(folder)
    assert [s.key for s in source.samples] == [f.relative for f in found.files]
    assert [s.label for s in source.samples] == [f.label for f in found.files]
    assert source.classes == ("cat", "dog", "eel")
    assert len(source.samples) == 15


@pytest.mark.parametrize("num_shards", [1, 2, 4, 15])
def test_split_is_deterministic_and_holds_every_sample_once(folder: Path, num_shards: int) -> None:
    source = sample_source(folder)
    parts = [source.split(i, num_shards, seed=3) for i in range(num_shards)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(15))
    again = sample_source(folder)
    assert all((again.split(i, num_shards, seed=3) == p).all() for i, p in enumerate(parts))
    assert (np.concatenate(parts) == source.split(seed=3)).all()  # the write order, cut


def test_unknown_kind_and_labels_for_a_tar_are_refused(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="--from should be one of auto, folder, tar"):
        sample_source(folder, kind="rar")
    archive = tar_of(folder, tmp_path / "images.tar")
    with pytest.raises(OptionsError, match="--labels"):
        sample_source(archive, labels_csv=tmp_path / "labels.csv")


def test_array_source_refuses_labels_outside_the_classes() -> None:
    with pytest.raises(OptionsError, match="index the 2 classes"):
        ArraySource([np.zeros((2, 2, 3), np.uint8)], [2], classes=("a", "b"))


@pytest.mark.parametrize("mode", ["encoded", "raw"])
def test_a_tar_packs_the_same_samples_as_its_folder(
    folder: Path, tmp_path: Path, mode: str
) -> None:
    archive = tar_of(folder, tmp_path / "images.tar")
    source = sample_source(archive)
    assert isinstance(source, TarSource)
    nbytes = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    assert sum(image_bytes(source.samples).tolist()) == nbytes
    options = ConvertOptions(mode=mode, size=(12, 16) if mode == "raw" else None, workers=2)
    from_folder = convert(folder, tmp_path / "folder.h5", options)
    from_tar = convert(archive, tmp_path / "tar.h5", options)
    assert from_tar.num_samples == from_folder.num_samples == 15
    assert contents(tmp_path / "tar.h5") == contents(tmp_path / "folder.h5")
    assert from_tar.meta.classes == from_folder.meta.classes == ("cat", "dog", "eel")
    assert verify_pack(tmp_path / "tar.h5", source=archive).ok


def test_a_tar_of_a_folders_content_and_its_shards(folder: Path, tmp_path: Path) -> None:
    archive = tar_of(folder, tmp_path / "content.tar", arcname=".")  # `tar -C images -cf x .`
    options = ConvertOptions(mode="encoded", workers=1)
    convert(folder, tmp_path / "folder.h5", options)
    report = convert_set(archive, tmp_path / "set", options, shards=3)
    assert report.manifest is not None
    shards = sorted((tmp_path / "set").glob("*.h5"))
    assert sorted(contents(shards)) == sorted(contents(tmp_path / "folder.h5"))


def test_bad_members_are_skipped_naming_them_or_stop_with_strict(
    folder: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "images.tar"
    (folder / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    os.symlink("000.jpg", folder / "cat" / "link.jpg")
    tar_of(folder, archive)
    with tarfile.open(archive, "a") as appended:  # `tar -r`: a second eel/000.jpg
        appended.add(folder / "eel" / "001.jpg", arcname="images/eel/000.jpg")
    report = convert(archive, tmp_path / "p.h5", ConvertOptions(workers=1))
    reasons = {s.path: s.reason for s in report.skipped}
    assert set(reasons) == {"cat/link.jpg", "dog/broken.jpg", "eel/000.jpg"}
    assert reasons["cat/link.jpg"] == "a link in the archive, not an image file"
    assert reasons["eel/000.jpg"] == "2 members of the archive have this path"
    assert report.num_samples == 14
    with pytest.raises(DecodeError, match=r"cat/link\.jpg"):
        convert(archive, tmp_path / "q.h5", ConvertOptions(workers=1, strict=True))


def test_a_compressed_or_damaged_tar_is_a_source_error(folder: Path, tmp_path: Path) -> None:
    archive = tmp_path / "images.tar"
    with tarfile.open(archive, "w:gz") as packed:
        packed.add(folder, arcname="images")
    with pytest.raises(SourceError, match="cannot read the tar archive"):
        convert(archive, tmp_path / "p.h5")


def test_cli_converts_a_tar_and_takes_from(folder: Path, tmp_path: Path) -> None:
    archive = tar_of(folder, tmp_path / "images.tar")
    runner = CliRunner()
    result = runner.invoke(cli, ["convert", str(archive), str(tmp_path / "p.h5"), "-q"])
    assert result.exit_code == 0, result.output
    assert "packed 15 of 15 images" in result.output
    result = runner.invoke(
        cli, ["convert", str(folder), str(tmp_path / "q.h5"), "--from", "tar", "-q"]
    )
    assert result.exit_code == 1
    assert "cannot read the tar archive" in result.output
