"""Sources in a bucket: each kind read where it lies, through the store, in ranges.

The images of tests/test_archive_sources.py (real photos and synthetic ones), written by the
tools users use, are put in a bucket of the local S3 server (and of the GCS emulator): each
source converts to the samples of the same images from the local folder, and the counting
proxy shows what was fetched (listings, ranged GETs, bytes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack import ConvertOptions, PackReader, convert, convert_set
from h5pack.cli.main import cli
from h5pack.errors import DecodeError, SourceError
from h5pack.write.sources import FolderSource, sample_source
from h5pack.write.sources.objects import READAHEAD
from tests.helpers import make_folder
from tests.s3local import Bucket
from tests.servers import Place
from tests.test_archive_sources import (
    CLASSES,
    PHOTOS,
    by_key,
    caption,
    imagenet_of,
    parquet_of,
    shards_of,
    stored_text,
    tgz_of,
    zip_of,
)
from tests.test_sources import tar_of

Where = Bucket | Place


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three classes of synthetic images (tests.helpers) and downsized real photos."""
    root = tmp_path_factory.mktemp("src") / "images"
    make_folder(root, classes=CLASSES, per_class=4, vary=True)
    for i, photo in enumerate(sorted(PHOTOS.glob("*.jpg"))[:6] if PHOTOS.is_dir() else []):
        with Image.open(photo) as image:
            image.thumbnail((48, 48))
            image.convert("RGB").save(root / CLASSES[i % 3] / f"photo-{photo.stem}.jpg")
    return root


@pytest.fixture(scope="module")
def reference(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pack = tmp_path_factory.mktemp("ref") / "folder.h5"
    convert(folder, pack, ConvertOptions(mode="raw", workers=1))
    return by_key(pack)


def _convert(
    where: Where, url: str, out: Path, workers: int = 1, mode: str = "encoded", **given: object
) -> object:
    """Convert ``url`` through the store of ``where``; return the source it was read as."""
    found = sample_source(url, storage_options=where.storage_options, **given)  # type: ignore[arg-type]
    where.proxy.reset_counts()
    convert(found, out, ConvertOptions(mode=mode, workers=workers))  # type: ignore[arg-type]
    return found


@pytest.mark.parametrize("workers", [1, 2])
def test_a_folder_prefix_packs_the_folders_samples_each_image_fetched_once(
    s3_bucket: Bucket, folder: Path, tmp_path: Path, reference: dict, workers: int
) -> None:
    url = s3_bucket.put_tree(folder, "data/images")
    s3_bucket.proxy.reset_counts()
    found = sample_source(url, storage_options=s3_bucket.storage_options)
    assert found.kind == "folder"
    assert len(found.samples) == len(reference)
    listing = s3_bucket.proxy.reset_counts()
    assert listing.gets == 1  # one page of ListObjectsV2: detection's listing serves the source
    # encoded: raw mode reads each image once more first, to plan its storage (as locally)
    convert(found, tmp_path / "p.h5", ConvertOptions(mode="encoded", workers=workers))
    counts = s3_bucket.proxy.reset_counts()
    assert by_key(tmp_path / "p.h5") == reference
    sizes = sorted(p.stat().st_size for p in folder.rglob("*.jpg"))
    assert counts.ranged_gets == counts.gets == len(reference)  # one ranged GET per image
    assert counts.body_bytes == sum(sizes)


def test_a_tar_is_listed_with_few_ranged_gets_and_packs_the_folders_samples(
    s3_bucket: Bucket, folder: Path, tmp_path: Path, reference: dict
) -> None:
    archive = tar_of(folder, tmp_path / "train.tar")
    url = s3_bucket.put(archive, "train.tar")
    s3_bucket.proxy.reset_counts()
    found = sample_source(url, storage_options=s3_bucket.storage_options)
    assert found.kind == "tar"
    found.listing  # noqa: B018
    listing = s3_bucket.proxy.reset_counts()
    size = archive.stat().st_size
    # the header walk: a GET per READAHEAD of the archive (and the detection's first), not
    # one per member
    assert listing.gets <= 2 + size // READAHEAD < len(reference)
    convert(found, tmp_path / "p.h5", ConvertOptions(mode="encoded", workers=2))
    counts = s3_bucket.proxy.reset_counts()
    assert by_key(tmp_path / "p.h5") == reference
    assert counts.ranged_gets == len(reference)  # each image's bytes once, by the workers
    assert counts.body_bytes == sum(p.stat().st_size for p in folder.rglob("*.jpg"))


def test_a_tar_of_tars_in_a_bucket_labels_by_synset(
    s3_bucket: Bucket, folder: Path, tmp_path: Path
) -> None:
    local = imagenet_of(folder, tmp_path / "ILSVRC2012_img_train.tar")
    url = s3_bucket.put(local, "ILSVRC2012_img_train.tar")
    remote = _convert(s3_bucket, url, tmp_path / "remote.h5", workers=2)
    assert remote.kind == "imagenet"  # type: ignore[attr-defined]
    convert(local, tmp_path / "local.h5", ConvertOptions(mode="raw", workers=1))
    assert by_key(tmp_path / "remote.h5") == by_key(tmp_path / "local.h5")


@pytest.mark.parametrize("how", ["prefix", "braces"])
def test_webdataset_shards_in_a_bucket_keep_labels_captions_and_json(
    s3_bucket: Bucket, folder: Path, tmp_path: Path, reference: dict, how: str
) -> None:
    shards = shards_of(folder, tmp_path / "shards")
    s3_bucket.put_tree(shards, "wds")
    names = sorted(p.name for p in shards.glob("*.tar"))
    url = s3_bucket.url("wds/")
    if how == "braces":
        url = s3_bucket.url(f"wds/train-{{000000..{len(names) - 1:06d}}}.tar")
    remote = _convert(s3_bucket, url, tmp_path / "p.h5", workers=2)
    assert remote.kind == "webdataset"  # type: ignore[attr-defined]
    assert by_key(tmp_path / "p.h5") == reference
    assert stored_text(tmp_path / "p.h5", "txt") == {key: caption(key) for key in reference}
    assert stored_text(tmp_path / "p.h5", "json") == {key: {"key": key} for key in reference}


@pytest.mark.parametrize("how", ["object", "glob", "prefix"])
def test_parquet_in_a_bucket_reads_its_footer_and_row_groups_only(
    s3_bucket: Bucket, folder: Path, tmp_path: Path, reference: dict, how: str
) -> None:

    local = parquet_of(folder, tmp_path / "train-00000-of-00001.parquet")
    s3_bucket.put(local, "data/train-00000-of-00001.parquet")
    s3_bucket.put(folder / "cat" / "000.jpg", "other/000.jpg")  # not under the prefix
    url = {
        "object": s3_bucket.url("data/train-00000-of-00001.parquet"),
        "glob": s3_bucket.url("data/train-*.parquet"),
        "prefix": s3_bucket.url("data/"),
    }[how]
    remote = _convert(s3_bucket, url, tmp_path / "p.h5", workers=2)
    assert remote.kind == "parquet"  # type: ignore[attr-defined]
    assert by_key(tmp_path / "p.h5") == reference


def test_parquet_in_a_bucket_fetches_its_footer_and_each_row_groups_images_once(
    s3_bucket: Bucket, tmp_path: Path
) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    images = []
    for i in range(240):
        encoded = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(encoded, "PNG")
        images.append({"bytes": encoded.getvalue(), "path": f"{i:04d}.png"})
    local = tmp_path / "train.parquet"
    pq.write_table(pa.table({"image": images, "n": list(range(240))}), local, row_group_size=30)
    url = s3_bucket.put(local, "train.parquet")
    _convert(s3_bucket, url, tmp_path / "p.h5", workers=2)  # encoded: no size probe
    counts = s3_bucket.proxy.counts
    groups, size = 8, local.stat().st_size
    footers = 2 * 64 * 1024  # the listing's and the converting process's pyarrow footer reads
    # the listing reads the small columns of each group, the conversion each group's images
    assert counts.ranged_gets <= 2 + 2 * groups + groups
    assert size < counts.body_bytes <= size + footers  # image bytes once, never the whole file
    assert len(by_key(tmp_path / "p.h5")) == 240


def _same_packs(local: Path, remote: Path, fields: list[str]) -> None:
    """Both packs hold the same keys, pixels and fields, in the same order."""
    with PackReader(local) as a, PackReader(remote) as b:
        assert list(a.paths) == list(b.paths)
        every = range(a.meta.num_samples)
        np.testing.assert_equal(a.read_images(every), b.read_images(every))
        np.testing.assert_equal(a.read_fields(every, fields), b.read_fields(every, fields))


@pytest.mark.parametrize("annotations_in", ["bucket", "local"])
def test_coco_images_in_a_bucket_with_their_annotations(
    s3_bucket: Bucket, tmp_path: Path, annotations_in: str
) -> None:
    pytest.importorskip("pycocotools")
    from tests.test_coco_source import FIELDS, make_coco

    images, annotations = make_coco(tmp_path / "coco")
    url = s3_bucket.put_tree(images, "coco/train2017")
    given = s3_bucket.put(annotations, "coco/instances.json")
    if annotations_in == "local":
        given = str(annotations)
    _convert(s3_bucket, url, tmp_path / "remote.h5", workers=2, mode="raw", annotations=given)
    report = convert(
        sample_source(images, annotations=annotations),
        tmp_path / "local.h5",
        ConvertOptions(mode="raw", workers=1),
    )
    assert report.num_samples == 4
    _same_packs(tmp_path / "local.h5", tmp_path / "remote.h5", FIELDS)


def test_semantic_masks_in_a_bucket_equal_the_local_ones(s3_bucket: Bucket, tmp_path: Path) -> None:
    from tests.test_mask_source import make_segmentation

    images, masks, _ = make_segmentation(tmp_path / "seg")
    url = s3_bucket.put_tree(images, "seg/images")
    masks_url = s3_bucket.put_tree(masks, "seg/masks")
    _convert(s3_bucket, url, tmp_path / "remote.h5", workers=2, masks=masks_url)
    convert(sample_source(images, masks=masks), tmp_path / "local.h5", ConvertOptions(workers=1))
    _same_packs(tmp_path / "local.h5", tmp_path / "remote.h5", ["mask"])


def test_a_manifest_in_a_bucket_labels_its_images_and_names_bad_rows(
    s3_bucket: Bucket, folder: Path, tmp_path: Path
) -> None:
    rows = [f"{p.relative_to(folder).as_posix()},{p.parent.name}|x,a photo of {p.stem}"
            for p in sorted(folder.rglob("*.jpg"))]  # fmt: skip
    manifest = tmp_path / "labels.csv"
    manifest.write_text("\n".join(["path,labels,caption", *rows, "cat/missing.jpg,cat,none"]))
    url = s3_bucket.put_tree(folder, "flat/images")
    labels = s3_bucket.put(manifest, "flat/labels.csv")
    remote = _convert(s3_bucket, url, tmp_path / "remote.h5", labels_csv=labels)
    (problem,) = remote.problems  # type: ignore[attr-defined]
    assert problem.path == "cat/missing.jpg"
    assert f"{labels}, line {len(rows) + 2}" in problem.reason
    assert url in problem.reason  # "does not exist under s3://..."
    convert(FolderSource(folder, labels_csv=manifest), tmp_path / "local.h5")
    _same_packs(tmp_path / "local.h5", tmp_path / "remote.h5", ["labels", "caption"])


@pytest.mark.parametrize("place", ["gs", "az"], indirect=True)
def test_a_folder_prefix_and_shards_convert_from_other_stores(
    place: Place, folder: Path, tmp_path: Path, reference: dict
) -> None:
    url = place.put_tree(folder, "images")
    found = _convert(place, url, tmp_path / "folder.h5", workers=2)
    assert found.kind == "folder"  # type: ignore[attr-defined]
    assert by_key(tmp_path / "folder.h5") == reference
    assert place.proxy.counts.gets >= len(reference)  # the workers read through the store
    place.put_tree(shards_of(folder, tmp_path / "shards"), "wds")
    found = _convert(place, place.url("wds/"), tmp_path / "shards.h5", workers=2)
    assert found.kind == "webdataset"  # type: ignore[attr-defined]
    assert by_key(tmp_path / "shards.h5") == reference


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_a_zip_or_gzip_tar_in_a_bucket_packs_the_folders_samples(
    s3_bucket: Bucket, folder: Path, tmp_path: Path, reference: dict, kind: str
) -> None:
    name = {"zip": "train.zip", "tgz": "train.tar.gz"}[kind]
    local = {"zip": zip_of, "tgz": tgz_of}[kind](folder, tmp_path / name)
    url = s3_bucket.put(local, name)
    found = _convert(s3_bucket, url, tmp_path / "p.h5", workers=2)
    assert found.kind == kind  # type: ignore[attr-defined]
    assert by_key(tmp_path / "p.h5") == reference
    counts = s3_bucket.proxy.counts  # listing and converting
    if kind == "zip":  # end records and directory (4), local headers read ahead, each member
        assert counts.ranged_gets <= 5 + local.stat().st_size // READAHEAD + len(reference)
    else:  # streamed by runs of members (0051), half a MiB of the archive a GET: here each
        # run's inflater reads the small archive from its start once
        assert counts.ranged_gets < len(reference)


def test_cli_converts_a_prefix_with_storage_options(
    s3_bucket: Bucket, folder: Path, tmp_path: Path, reference: dict
) -> None:
    url = s3_bucket.put_tree(folder, "images")
    flags = [f"--storage-option={k}={v}" for k, v in s3_bucket.storage_options.items()]
    result = CliRunner().invoke(
        cli, ["convert", url, str(tmp_path / "p.h5"), "--workers", "1", "--quiet", *flags]
    )
    assert result.exit_code == 0, result.output
    assert by_key(tmp_path / "p.h5") == reference
    verified = CliRunner().invoke(cli, ["verify", str(tmp_path / "p.h5"), "--source", url, *flags])
    assert verified.exit_code == 0, verified.output  # every sample against the bucket's


def test_errors_name_the_url_and_the_object(
    s3_bucket: Bucket, folder: Path, tmp_path: Path
) -> None:
    options = s3_bucket.storage_options
    shards = shards_of(folder, tmp_path / "shards")
    s3_bucket.put_tree(shards, "wds")
    pattern = s3_bucket.url("wds/train-{000000..000009}.tar")
    with pytest.raises(SourceError, match=r"shards of s3://.* are missing, the first s3://"):
        sample_source(pattern, storage_options=options).listing  # noqa: B018
    with pytest.raises(SourceError, match=r"no images found under s3://.*/nothing/"):
        sample_source(s3_bucket.url("nothing/"), storage_options=options).listing  # noqa: B018
    tar = s3_bucket.put(tar_of(folder, tmp_path / "x.tar"), "x.tar")
    found = sample_source(tar, storage_options=options)
    found.listing  # noqa: B018
    (s3_bucket.path / "x.tar").write_bytes(b"replaced")  # the object changes under the listing
    s3_bucket.server.forget()
    with pytest.raises(DecodeError, match=r"s3://.*/x\.tar"):
        convert(found, tmp_path / "p.h5", ConvertOptions(workers=1, strict=True))
    assert not (tmp_path / "p.h5").exists()


def test_a_tar_in_a_bucket_splits_into_shards_holding_every_sample_once(
    s3_bucket: Bucket, folder: Path, tmp_path: Path, reference: dict
) -> None:
    url = s3_bucket.put(tar_of(folder, tmp_path / "x.tar"), "x.tar")
    options = ConvertOptions(mode="raw", workers=1)
    report = convert_set(
        url, tmp_path / "set", options, shards=3, storage_options=s3_bucket.storage_options
    )
    assert sum(shard.num_samples for shard in report.shards) == len(reference)
    assert by_key(sorted((tmp_path / "set").glob("*.h5"))) == reference


@pytest.mark.parametrize("place", ["http"], indirect=True)
def test_a_tar_over_https_ranges_converts_and_a_prefix_cannot_be_listed(
    place: Place, folder: Path, tmp_path: Path, reference: dict
) -> None:
    url = place.put(tar_of(folder, tmp_path / "x.tar"), "x.tar")
    found = _convert(place, url, tmp_path / "p.h5", workers=2)
    assert found.kind == "tar"  # type: ignore[attr-defined]
    assert by_key(tmp_path / "p.h5") == reference
    with pytest.raises(SourceError, match=r"cannot list .*name each one"):
        sample_source(place.url("images/"), storage_options=place.storage_options)
