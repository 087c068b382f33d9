"""Archive sources: .tar.gz, .zip, ImageNet's tar of tars and WebDataset shards.

Each is written by the tool users use (tarfile, zipfile, webdataset's ShardWriter) from one
image folder of real photos and synthetic images, and packs the same samples as the folder.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack import ConvertOptions, convert, convert_set
from h5pack.check import verify_pack
from h5pack.cli.main import cli
from h5pack.core import format as fmt
from h5pack.core.fields import fields_of
from h5pack.errors import DecodeError, SourceError
from h5pack.read.setreader import open_reader
from h5pack.write.sources import (
    FileRange,
    GzipTarSource,
    ImageNetTarSource,
    WebDatasetSource,
    ZipSource,
    sample_source,
    tgz,
)
from h5pack.write.sources.tgz import RUNS, interleaved
from h5pack.write.sources.webdataset import expand_braces
from tests.helpers import contents, make_folder

PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
CLASSES = ("cat", "dog", "eel")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three classes of synthetic images and downsized real photos."""
    root = tmp_path_factory.mktemp("src") / "images"
    make_folder(root, classes=CLASSES, per_class=4, vary=True)
    photos = sorted(PHOTOS.glob("*.jpg"))[:6] if PHOTOS.is_dir() else []
    for i, photo in enumerate(photos):
        with Image.open(photo) as image:
            image.thumbnail((48, 48))
            image.convert("RGB").save(root / CLASSES[i % 3] / f"photo-{photo.stem}.jpg")
    # without the photos (a checkout with no ../shared), as many noisy stand-ins: the archive
    # tests need members larger than one compressed read
    rng = np.random.default_rng(7)
    for i in range(6 - len(photos)):
        noise = rng.integers(0, 256, (40 + i, 48, 3), dtype=np.uint8)
        Image.fromarray(noise).save(root / CLASSES[i % 3] / f"photo-noise{i}.jpg")
    return root


def _images(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.jpg"))


def tar_of(folder: Path, target: Path) -> Path:
    with tarfile.open(target, "w") as archive:
        archive.add(folder, arcname="images")
    return target


def tgz_of(folder: Path, target: Path) -> Path:
    with tarfile.open(target, "w:gz") as archive:
        archive.add(folder, arcname="images")
    return target


def zip_of(folder: Path, target: Path) -> Path:
    with zipfile.ZipFile(target, "w") as archive:
        for i, path in enumerate(_images(folder)):  # stored and deflated members
            method = zipfile.ZIP_DEFLATED if i % 2 else zipfile.ZIP_STORED
            archive.write(path, f"images/{path.relative_to(folder)}", compress_type=method)
    return target


def caption(key: str) -> str:
    return f"a photo of {key}, ünïcode"


def shards_of(folder: Path, target: Path) -> Path:
    import webdataset as wds

    target.mkdir()
    with wds.ShardWriter(str(target / "train-%06d.tar"), maxcount=7, verbose=0) as sink:
        for path in _images(folder):
            key = path.relative_to(folder).with_suffix("").as_posix()
            sink.write(
                {
                    "__key__": key,
                    "jpg": path.read_bytes(),
                    "cls": CLASSES.index(path.parent.name),
                    "txt": caption(key),
                    "json": {"key": key},
                }
            )
    return target


def imagenet_of(folder: Path, target: Path, top: str = "") -> Path:
    """ImageNet's train tar: one uncompressed tar per class, named by a synset."""
    with tarfile.open(target, "w") as outer:
        if top:  # `tar -cf train.tar train/`: a folder's entry first
            info = tarfile.TarInfo(top)
            info.type = tarfile.DIRTYPE
            outer.addfile(info)
        for c, name in enumerate(CLASSES):
            inner_bytes = io.BytesIO()
            with tarfile.open(fileobj=inner_bytes, mode="w") as inner:
                for path in sorted((folder / name).glob("*.jpg")):
                    inner.add(path, arcname=f"n0{c}_{path.stem}.JPEG")
            info = tarfile.TarInfo(f"{top}n0{c}.tar")
            info.size = inner_bytes.tell()
            inner_bytes.seek(0)
            outer.addfile(info, inner_bytes)
    return target


def parquet_of(folder: Path, target: Path) -> Path:
    """One Parquet file in Hugging Face's layout: an image struct, a ClassLabel's names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = _images(folder)
    images = [{"bytes": p.read_bytes(), "path": p.relative_to(folder).as_posix()} for p in paths]
    labels = pa.array([CLASSES.index(p.parent.name) for p in paths], pa.int64())
    features = {"image": {"_type": "Image"}, "label": {"names": CLASSES, "_type": "ClassLabel"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    table = pa.table({"image": images, "label": labels}).replace_schema_metadata(meta)
    pq.write_table(table, target, row_group_size=8)
    return target


def by_key(pack: Path | list[Path]) -> dict[str, tuple[int, bytes]]:
    """Each sample's label and pixels, by its key with the extension dropped."""
    return {path.rsplit(".", 1)[0]: (label, pixels) for path, label, _, pixels in contents(pack)}


def keys_of(pack: Path) -> list[str]:
    with open_reader(pack) as reader:
        return list(reader.paths)


def stored_text(pack: Path, name: str) -> dict[str, str]:
    meta = fmt.load_meta(pack)
    field = {f.name: f for f in fields_of(meta)}[name]
    with h5py.File(pack) as handle:
        values = field.read(handle, np.arange(meta.num_samples), meta.shapes)
    return dict(zip(keys_of(pack), values, strict=True))


@pytest.fixture(scope="module")
def reference(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pack = tmp_path_factory.mktemp("ref") / "folder.h5"
    convert(folder, pack, ConvertOptions(mode="raw", workers=1))
    return by_key(pack)


@pytest.mark.parametrize("kind", ["tar", "tgz", "zip", "webdataset", "parquet"])
@pytest.mark.parametrize("workers", [1, 2])
def test_an_archive_packs_the_same_samples_as_its_folder(
    folder: Path, tmp_path: Path, reference: dict, kind: str, workers: int
) -> None:
    make = {"tar": tar_of, "tgz": tgz_of, "zip": zip_of, "webdataset": shards_of}.get(
        kind, parquet_of
    )
    name = {"webdataset": "shards", "parquet": "x.parquet"}.get(kind, f"x.{kind}")
    source = make(folder, tmp_path / name)
    found = sample_source(source)
    assert found.kind == kind
    report = convert(source, tmp_path / "p.h5", ConvertOptions(mode="raw", workers=workers))
    assert report.num_samples == len(reference) == len(_images(folder))
    assert by_key(tmp_path / "p.h5") == reference  # labels by class index, pixels
    if kind != "webdataset":
        assert report.meta.classes == CLASSES
        assert verify_pack(tmp_path / "p.h5", source=source).ok
    else:  # cls gives class numbers; the captions and JSON come exact
        assert report.meta.classes == ("0", "1", "2")
        texts = stored_text(tmp_path / "p.h5", "txt")
        assert texts == {key: caption(key) for key in reference}
        assert stored_text(tmp_path / "p.h5", "json") == {key: {"key": key} for key in reference}


def test_encoded_mode_stores_the_members_bytes(folder: Path, tmp_path: Path) -> None:
    archive = zip_of(folder, tmp_path / "images.zip")
    convert(archive, tmp_path / "p.h5", ConvertOptions(mode="encoded", workers=1))
    with h5py.File(tmp_path / "p.h5") as handle:
        offsets, sizes = handle[fmt.OFFSETS][()], handle[fmt.SIZES][()]
        blob = handle[fmt.IMAGES][()]
    keys = keys_of(tmp_path / "p.h5")
    assert len(keys) == len(sizes) == len(_images(folder))
    for path, offset, size in zip(keys, offsets, sizes, strict=False):
        assert blob[offset : offset + size].tobytes() == (folder / path).read_bytes()


def test_imagenet_tar_of_tars_labels_by_synset_and_shards_hold_every_sample_once(
    folder: Path, tmp_path: Path, reference: dict
) -> None:
    archive = imagenet_of(folder, tmp_path / "ILSVRC2012_img_train.tar")
    source = sample_source(archive)
    assert isinstance(source, ImageNetTarSource)
    assert source.classes == ("n00", "n01", "n02")
    assert source.samples[0].key == "n00/n00_000.JPEG"
    # Listed as places in the outer file, read by the workers: no image bytes held here.
    assert all(type(s.image) is FileRange for s in source.samples)
    assert {s.image.path for s in source.samples} == {str(archive.resolve())}
    options = ConvertOptions(mode="raw", workers=2)
    report = convert_set(archive, tmp_path / "set", options, shards=3)
    assert report.manifest is not None
    packs = sorted((tmp_path / "set").glob("*.h5"))
    keys = [path for pack in packs for path, *_ in contents(pack)]
    assert sorted(keys) == sorted(s.key for s in source.samples)  # every sample, once
    found = {
        f"{CLASSES[int(k[2])]}/{k.split('_', 1)[1].rsplit('.', 1)[0]}": v
        for k, v in by_key(packs).items()
    }
    assert found == reference
    convert(archive, tmp_path / "one.h5", options)
    assert verify_pack(tmp_path / "one.h5", source=archive).ok
    in_folder = imagenet_of(folder, tmp_path / "train.tar", top="train/")
    assert [s.key for s in sample_source(in_folder).samples] == [s.key for s in source.samples]


def test_a_gzip_tar_streams_in_runs_and_its_shards_hold_every_sample_once(
    folder: Path, tmp_path: Path
) -> None:
    order = interleaved(1000, 0, True)
    assert sorted(order.tolist()) == list(range(1000))
    starts = np.arange(RUNS + 1) * 1000 // RUNS
    runs = np.searchsorted(starts, order, side="right") - 1
    for run in range(RUNS):  # each run is read front to back
        assert (np.diff(np.asarray(order)[runs == run]) > 0).all()
    assert len(set(runs[:128].tolist())) > 64  # the first samples mix the runs
    archive = tgz_of(folder, tmp_path / "images.tgz")
    options = ConvertOptions(mode="encoded", workers=1)
    convert_set(archive, tmp_path / "set", options, shards=4)
    packs = sorted((tmp_path / "set").glob("*.h5"))
    convert(folder, tmp_path / "folder.h5", options)
    assert sorted(contents(packs)) == sorted(contents(tmp_path / "folder.h5"))


def test_a_gzip_tar_of_several_gzip_members_reads_across_them(folder: Path, tmp_path: Path) -> None:
    whole = gzip.decompress(tgz_of(folder, tmp_path / "one.tgz").read_bytes())
    cut = len(whole) // 3 + 7  # inside a member's bytes: `cat a.gz b.gz c.gz`, pigz -i
    parts = (whole[:cut], whole[cut : 2 * cut], whole[2 * cut :])
    archive = tmp_path / "many.tgz"
    archive.write_bytes(b"".join(gzip.compress(part) for part in parts))
    source = GzipTarSource(archive)
    assert len(source.samples) == len(_images(folder))
    for sample in reversed(list(source.samples)):
        assert sample.image.read() == (folder / sample.key).read_bytes()


def test_a_gzip_tar_member_is_read_in_a_process_that_did_not_list_it(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tgz, "_POINTS", 4)  # few checkpoints: thinned as they grow
    monkeypatch.setattr(tgz, "_SPACING", 4096)
    monkeypatch.setattr(tgz, "_OUT", 1024)  # many small steps: a checkpoint every 4 KiB
    monkeypatch.setattr(tgz, "_READ", 512)
    archive = tgz_of(folder, tmp_path / "images.tar.gz")
    source = GzipTarSource(archive)
    samples = list(source.samples)
    reader = tgz._archive(str(archive.resolve()), None, new=True)  # as in a Dask worker
    for sample in reversed(samples):  # backwards: each from the start or a checkpoint
        assert sample.image.read() == (folder / sample.key).read_bytes()
    assert len(reader.points) <= 4
    assert reader.spacing > 4096
    assert len(reader.cursors) <= tgz._CURSORS


def test_zip_members_are_read_at_random(folder: Path, tmp_path: Path) -> None:
    source = ZipSource(zip_of(folder, tmp_path / "images.zip"))
    for sample in reversed(list(source.samples)):
        assert sample.image.read() == (folder / sample.key).read_bytes()


def test_webdataset_shards_split_into_a_pack_set_keep_every_caption(
    folder: Path, tmp_path: Path
) -> None:
    shards = shards_of(folder, tmp_path / "shards")
    convert_set(shards, tmp_path / "set", ConvertOptions(mode="encoded", workers=1), shards=3)
    captions: dict[str, str] = {}
    for pack in sorted((tmp_path / "set").glob("*.h5")):
        captions.update(stored_text(pack, "txt"))
    keys = [p.relative_to(folder).with_suffix("").as_posix() for p in _images(folder)]
    assert captions == {key: caption(key) for key in keys}


def test_brace_patterns_and_detection(folder: Path, tmp_path: Path) -> None:
    assert expand_braces("s/train-{000008..000011}.tar") == [
        f"s/train-{i:06d}.tar" for i in range(8, 12)
    ]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    shards = shards_of(folder, tmp_path / "shards")
    count = len(list(shards.glob("*.tar")))
    pattern = f"{shards}/train-{{000000..{count - 1:06d}}}.tar"
    found = sample_source(pattern)
    assert isinstance(found, WebDatasetSource)
    assert len(found.samples) == len(_images(folder))
    missing = f"{shards}/train-{{000000..{count:06d}}}.tar"
    with pytest.raises(SourceError, match=f"1 of the {count + 1} shards .* are missing"):
        _ = sample_source(missing).samples
    assert sample_source(folder).kind == "folder"
    assert sample_source(tgz_of(folder, tmp_path / "x.tgz")).kind == "tgz"


def test_bad_webdataset_samples_are_named_by_key_or_stop_with_strict(
    folder: Path, tmp_path: Path
) -> None:
    import webdataset as wds

    shards = tmp_path / "shards"
    shards.mkdir()
    jpg = _images(folder)[0].read_bytes()
    with wds.TarWriter(str(shards / "a.tar")) as sink:
        sink.write({"__key__": "good", "jpg": jpg, "cls": 1})
        sink.write({"__key__": "no-image", "txt": "a caption", "cls": 0})
        sink.write({"__key__": "twice", "jpg": jpg})
        sink.write({"__key__": "bad-cls", "jpg": jpg, "cls": b"cat"})
        sink.write({"__key__": "broken", "jpg": b"not a jpeg"})
    with wds.TarWriter(str(shards / "b.tar")) as sink:
        sink.write({"__key__": "twice", "jpg": jpg})
        sink.write({"__key__": "fine", "jpg": jpg, "txt": "only here"})
    report = convert(shards, tmp_path / "p.h5", ConvertOptions(workers=1))
    reasons = {s.path: s.reason for s in report.skipped}
    assert set(reasons) == {"no-image", "twice", "bad-cls", "broken"}
    assert "without an image" in reasons["no-image"]
    assert reasons["twice"] == "2 samples of the shards have this key"
    assert report.num_samples == 2
    assert stored_text(tmp_path / "p.h5", "txt") == {"good": "", "fine": "only here"}
    with pytest.raises(DecodeError, match=r"bad-cls|no-image|twice"):
        convert(shards, tmp_path / "q.h5", ConvertOptions(workers=1, strict=True))
    assert not (tmp_path / "q.h5").exists()
    runner = CliRunner()  # the command line says the same, rc 1 with --strict
    result = runner.invoke(cli, ["convert", str(shards), str(tmp_path / "c.h5")])
    assert result.exit_code == 0, result.output
    assert "no-image" in result.output
    result = runner.invoke(cli, ["convert", str(shards), str(tmp_path / "s.h5"), "--strict"])
    assert result.exit_code == 1
    assert "Error: twice: 2 samples of the shards have this key" in result.output
    assert not (tmp_path / "s.h5").exists()


def test_corrupt_and_cut_archives_are_named(folder: Path, tmp_path: Path) -> None:
    archive = zip_of(folder, tmp_path / "images.zip")
    data = bytearray(archive.read_bytes())
    source = ZipSource(archive)
    victim = next(s for s in source.samples if s.image.deflated)
    data[victim.image.offset + 20] ^= 0xFF  # a corrupt deflated member
    archive.write_bytes(bytes(data))
    report = convert(archive, tmp_path / "z.h5", ConvertOptions(workers=1))
    assert [s.path for s in report.skipped] == [victim.key]
    assert "corrupt member" in report.skipped[0].reason
    with pytest.raises(DecodeError, match=victim.key):
        convert(archive, tmp_path / "zz.h5", ConvertOptions(workers=1, strict=True))
    assert not (tmp_path / "zz.h5").exists()

    tgz = tgz_of(folder, tmp_path / "images.tar.gz")
    whole = gzip.decompress(tgz.read_bytes())
    cut = tmp_path / "cut.tar.gz"  # the compressed stream ends two thirds in
    cut.write_bytes(tgz.read_bytes()[: len(tgz.read_bytes()) * 2 // 3])
    report = convert(cut, tmp_path / "c.h5", ConvertOptions(workers=1))
    assert 0 < report.num_samples < len(_images(folder))
    assert any("cut short" in s.reason or "unreadable" in s.reason for s in report.skipped)
    cut.write_bytes(tgz.read_bytes()[:-4])  # only the gzip trailer's size field missing
    report = convert(cut, tmp_path / "t.h5", ConvertOptions(workers=1))
    assert report.num_samples == len(_images(folder))  # every image is there, and yet:
    assert [s.path for s in report.skipped] == ["cut.tar.gz"]
    assert report.skipped[0].reason.endswith("cut short: the gzip stream ends before its trailer")
    assert len(whole) > 0

    bad = bytearray(tgz.read_bytes())  # corrupt deflate data halfway: the rest unreadable
    bad[len(bad) // 2 : len(bad) // 2 + 64] = bytes(64)
    (tmp_path / "bad.tgz").write_bytes(bytes(bad))
    report = convert(tmp_path / "bad.tgz", tmp_path / "b.h5", ConvertOptions(workers=1))
    assert 0 < report.num_samples < len(_images(folder))
    assert any(s.path == "bad.tgz" and "unreadable after" in s.reason for s in report.skipped)
    with pytest.raises(DecodeError, match=r"bad\.tgz"):
        convert(tmp_path / "bad.tgz", tmp_path / "bb.h5", ConvertOptions(workers=1, strict=True))
    assert not (tmp_path / "bb.h5").exists()

    plain = tmp_path / "cut.tar"  # an ImageNet tar cut inside its last class tar's last image
    full = imagenet_of(folder, tmp_path / "full.tar")
    last = sample_source(full).samples[-1]
    plain.write_bytes(full.read_bytes()[: last.image.offset + last.image.size // 2])
    report = convert(plain, tmp_path / "i.h5", ConvertOptions(workers=1))
    assert [(s.path, s.reason) for s in report.skipped] == [
        (last.key, "cut short: the archive ends inside it")
    ]
    with pytest.raises(DecodeError, match="n02/"):
        convert(plain, tmp_path / "ii.h5", ConvertOptions(workers=1, strict=True))


@pytest.mark.parametrize("kind", ["tar", "tgz", "zip", "imagenet"])
def test_a_missing_archive_is_named(kind: str, tmp_path: Path) -> None:
    missing = tmp_path / f"gone.{kind}"
    with pytest.raises(SourceError, match=f"gone.{kind}"):
        _ = sample_source(missing, kind=kind).samples


def test_cli_takes_each_kind(folder: Path, tmp_path: Path) -> None:
    archive = zip_of(folder, tmp_path / "images.zip")
    runner = CliRunner()
    result = runner.invoke(cli, ["convert", str(archive), str(tmp_path / "p.h5"), "-q"])
    assert result.exit_code == 0, result.output
    n = len(_images(folder))
    assert f"packed {n} of {n} images" in result.output
    result = runner.invoke(
        cli, ["convert", str(archive), str(tmp_path / "q.h5"), "--from", "tgz", "-q"]
    )
    assert result.exit_code == 1
    assert "cannot read the gzip tar archive" in result.output
    shards = shards_of(folder, tmp_path / "shards")
    count = len(list(shards.glob("*.tar")))
    pattern = f"{shards}/train-{{000000..{count - 1:06d}}}.tar"
    for given in ([pattern], [str(shards), "--from", "webdataset"]):
        result = runner.invoke(
            cli, ["convert", *given, str(tmp_path / "w.h5"), "-q", "--overwrite"]
        )
        assert result.exit_code == 0, result.output
        assert f"packed {n} of {n} images" in result.output


@pytest.mark.parametrize("kind", ["imagenet", "tgz"])
def test_dask_workers_read_an_archive_they_did_not_list(
    folder: Path, tmp_path: Path, reference: dict, kind: str
) -> None:
    distributed = pytest.importorskip("distributed")
    from h5pack import convert_on_dask

    if kind == "imagenet":
        archive = imagenet_of(folder, tmp_path / "train.tar")
    else:
        archive = tgz_of(folder, tmp_path / "images.tgz")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    with cluster, distributed.Client(cluster) as client:
        options = ConvertOptions(mode="raw", workers=1)
        report = convert_on_dask(client, archive, tmp_path / "set", options, shards=2)
    assert report.manifest is not None
    packs = sorted((tmp_path / "set").glob("*.h5"))
    keys = [path for pack in packs for path, *_ in contents(pack)]
    assert sorted(keys) == sorted(s.key for s in sample_source(archive).samples)
    if kind == "tgz":
        assert by_key(packs) == reference
