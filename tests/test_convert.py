"""convert(): round trips against an independent decode, the option matrix, hostile inputs."""

import os
import zlib

import numpy as np
import pytest

from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.errors import DecodeError, OptionsError, SourceError, TargetExistsError
from h5pack.read.reader import PackReader
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions
from tests.helpers import make_folder, pil_rgb


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "images"
    make_folder(root)
    return root


def test_raw_pixels_match_an_independent_decode_in_recorded_order(tmp_path, folder):
    report = convert(folder, tmp_path / "p.h5", ConvertOptions(workers=1, chunk_samples=3))
    assert (report.mode, report.storage) == ("raw", "array")
    with PackReader(report.path) as reader:
        images = reader.read_images(range(len(reader)))
        for i, image in enumerate(images):
            source = folder / reader.paths[i]
            np.testing.assert_array_equal(image, pil_rgb(source))
            assert reader.meta.classes[reader.meta.labels[i]] == reader.paths[i].split("/")[0]
            assert zlib.crc32(image.tobytes()) == reader.meta.checksums[i]
        # source_index is the position in the sorted scan order
        ordered = sorted(reader.paths, key=os.fsencode)
        assert [ordered.index(p) for p in reader.paths] == reader.meta.source_index.tolist()


@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
def test_resized_pixels_match_pillow_within_resampling_tolerance(tmp_path, resize):
    root = tmp_path / "images"
    make_folder(root, size=(30, 40), vary=True)
    options = ConvertOptions(workers=1, size=(15, 20), resize=resize)
    report = convert(root, tmp_path / "p.h5", options)
    assert report.meta.images_shape[1:] == (15, 20, 3)
    with PackReader(report.path) as reader:
        for i, image in enumerate(reader.read_images(range(len(reader)))):
            source = pil_rgb(root / reader.paths[i])
            if resize == "stretch":
                expected = pil_rgb(root / reader.paths[i], size=(15, 20))
                diff = np.abs(image.astype(int) - expected.astype(int))
                assert diff.max() <= 2
            else:  # crop/pad keep the aspect ratio: compare mean colour, a weak but real check
                inner = image[image.sum(axis=2) > 0] if resize == "pad" else image.reshape(-1, 3)
                assert np.allclose(inner.mean(axis=0), source.reshape(-1, 3).mean(axis=0), atol=25)


def test_encoded_bytes_are_the_files_bytes(tmp_path):
    root = tmp_path / "images"
    make_folder(root, vary=True)
    events = []
    report = convert(root, tmp_path / "p.h5", ConvertOptions(workers=1), on_event=events.append)
    assert (report.mode, report.storage) == ("encoded", "blob")
    mode_events = [e.message for e in events if e.kind == "mode"]
    assert len(mode_events) == 1
    assert "encoded" in mode_events[0]
    assert "sizes" in mode_events[0]
    with PackReader(report.path) as reader:
        for i, data in enumerate(reader.read_stored(range(len(reader)))):
            assert data.tobytes() == (root / reader.paths[i]).read_bytes()
            assert tuple(reader.meta.shapes[i]) == pil_rgb(root / reader.paths[i]).shape


def test_auto_mode_says_why_it_chose_raw(tmp_path, folder):
    events = []
    convert(folder, tmp_path / "p.h5", ConvertOptions(workers=1), on_event=events.append)
    message = next(e.message for e in events if e.kind == "mode")
    assert "raw" in message
    assert "16x12" in message  # W x H


@pytest.mark.parametrize("num", [8, 9, 11])  # N mod k = 0, 1, k - 1 for k = 4
@pytest.mark.parametrize("workers", [1, 2])
def test_chunk_boundaries(tmp_path, num, workers):
    root = tmp_path / "images"
    make_folder(root, classes=("a",), per_class=num)
    options = ConvertOptions(
        workers=workers, chunk_samples=4, compression=Compression(codec="gzip")
    )
    report = convert(root, tmp_path / "p.h5", options)
    assert report.meta.num_samples == num
    assert report.meta.chunks[0] == 4
    with PackReader(report.path) as reader:
        for i, image in enumerate(reader.read_images(range(num))):
            np.testing.assert_array_equal(image, pil_rgb(root / reader.paths[i]))


MATRIX = [
    (mode, layout, codec)
    for mode in ("raw-fixed", "raw-variable", "encoded")
    for layout, codecs in (
        ("chunked", ("none", "gzip", "lzf", "lz4", "zstd", "blosc-zstd")),
        ("contiguous", ("none",)),
    )
    for codec in codecs
]


@pytest.mark.parametrize(("mode", "layout", "codec"), MATRIX)
def test_option_matrix_round_trips(tmp_path, mode, layout, codec):
    root = tmp_path / "images"
    make_folder(root, per_class=3, vary=mode != "raw-fixed")
    options = ConvertOptions(
        workers=1,
        mode="encoded" if mode == "encoded" else "raw",
        layout=layout,
        compression=Compression(codec=codec),
        chunk_bytes=2000 if layout == "chunked" else None,
    )
    report = convert(root, tmp_path / "p.h5", options)
    meta = report.meta
    assert meta.storage == ("array" if mode == "raw-fixed" else "blob")
    assert (meta.chunks is None) == (layout == "contiguous")
    with PackReader(report.path) as reader:
        images = reader.read_images(range(len(reader)))
        stored = reader.read_stored(range(len(reader)))
        for i in range(len(reader)):
            path = root / reader.paths[i]
            if mode == "encoded":
                assert stored[i].tobytes() == path.read_bytes()
            np.testing.assert_array_equal(images[i], pil_rgb(path))


def test_write_time_shuffle_is_seeded_and_recorded(tmp_path):
    root = tmp_path / "images"
    make_folder(root, classes=("a", "b", "c", "d"), per_class=6)
    a = convert(root, tmp_path / "a.h5", ConvertOptions(workers=1, seed=1))
    b = convert(root, tmp_path / "b.h5", ConvertOptions(workers=1, seed=1))
    c = convert(root, tmp_path / "c.h5", ConvertOptions(workers=1, shuffle_samples=False))
    assert a.meta.source_index.tolist() == b.meta.source_index.tolist()
    assert sorted(a.meta.source_index.tolist()) == list(range(24))
    assert a.meta.source_index.tolist() != list(range(24))
    assert c.meta.source_index.tolist() == list(range(24))
    # shuffled: the first 8 samples are not all of one or two classes, as in scan order
    assert len(set(a.meta.labels[:8].tolist())) >= 3
    assert len(set(c.meta.labels[:8].tolist())) <= 2


def test_flat_folder_and_labels_csv(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    make_folder(tmp_path / "tmp", classes=("x",), per_class=3)
    for path in (tmp_path / "tmp" / "x").iterdir():
        path.rename(flat / path.name)
    report = convert(flat, tmp_path / "flat.h5", ConvertOptions(workers=1))
    assert report.meta.labels.tolist() == [-1, -1, -1]
    assert report.meta.classes == ()
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\n000.jpg,bird\n001.jpg,fish\n002.jpg,bird\n")
    report = convert(flat, tmp_path / "csv.h5", ConvertOptions(workers=1, labels_csv=csv))
    assert report.meta.classes == ("bird", "fish")
    with PackReader(report.path) as reader:
        labels = {
            p: report.meta.classes[lab]
            for p, lab in zip(reader.paths, report.meta.labels, strict=True)
        }
    assert labels == {"000.jpg": "bird", "001.jpg": "fish", "002.jpg": "bird"}


def test_non_utf8_names_round_trip(tmp_path):
    root = tmp_path / "images"
    make_folder(root, classes=("a",), per_class=2)
    odd = os.fsdecode(b"caf\xe9.jpg")
    (root / "a" / "000.jpg").rename(root / "a" / odd)
    report = convert(root, tmp_path / "p.h5", ConvertOptions(workers=1))
    with PackReader(report.path) as reader:
        assert f"a/{odd}" in reader.paths
        assert os.fsencode(f"a/{odd}") in {os.fsencode(p) for p in reader.paths}


# -- hostile inputs -----------------------------------------------------------------------


def _spoil(root):
    """Add a corrupt, a truncated, an undecodable and an empty file; return their paths."""
    good = (root / "cat" / "000.jpg").read_bytes()
    (root / "cat" / "corrupt.jpg").write_bytes(good[:200] + bytes(range(256)) * 4)
    (root / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "dog" / "notes.png").write_text("this is not a PNG")
    (root / "dog" / "empty.jpg").write_bytes(b"")
    return {"cat/corrupt.jpg", "cat/truncated.jpg", "dog/notes.png", "dog/empty.jpg"}


@pytest.mark.parametrize(
    ("workers", "layout"), [(1, "chunked"), (2, "chunked"), (1, "contiguous"), (2, "contiguous")]
)
def test_bad_files_are_skipped_named_and_recorded(tmp_path, folder, workers, layout):
    bad = _spoil(folder)
    events = []
    options = ConvertOptions(
        workers=workers, layout=layout, chunk_samples=3 if layout == "chunked" else None
    )
    report = convert(folder, tmp_path / "p.h5", options, on_event=events.append)
    warned = [e.path for e in events if e.kind == "skipped"]
    assert sorted(warned) == sorted(bad)  # one warning per file, naming it
    assert all(e.path in e.message for e in events if e.kind == "skipped")
    assert {s.path for s in report.skipped} == bad
    assert {s.path for s in fmt.load_meta(report.path).skipped} == bad
    assert report.num_samples == 8
    with PackReader(report.path) as reader:  # later samples are not shifted by the skips
        for i, image in enumerate(reader.read_images(range(len(reader)))):
            np.testing.assert_array_equal(image, pil_rgb(folder / reader.paths[i]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "p.h5"]


@pytest.mark.parametrize("workers", [1, 2])
def test_strict_stops_naming_the_file_and_leaves_nothing(tmp_path, folder, workers):
    (folder / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    target = tmp_path / "p.h5"
    with pytest.raises(DecodeError, match=r"dog/broken\.jpg"):
        convert(folder, target, ConvertOptions(workers=workers, strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_overwrite_is_refused_before_any_work(tmp_path, folder):
    target = tmp_path / "p.h5"
    target.write_bytes(b"keep me")
    with pytest.raises(TargetExistsError, match="--overwrite"):
        convert(folder, target, ConvertOptions(workers=1))
    assert target.read_bytes() == b"keep me"
    convert(folder, target, ConvertOptions(workers=1), overwrite=True)
    assert fmt.load_meta(target).num_samples == 8


def test_nothing_decodable_is_an_error_and_leaves_nothing(tmp_path):
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.jpg").write_bytes(b"nope")
    with pytest.raises(SourceError, match="none of the 1 images"):
        convert(root, tmp_path / "p.h5", ConvertOptions(workers=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_missing_source_is_a_source_error(tmp_path):
    with pytest.raises(SourceError):
        convert(tmp_path / "nope", tmp_path / "p.h5")
    assert not (tmp_path / "p.h5").exists()


def test_options_that_do_not_fit_the_images_are_refused(tmp_path):
    root = tmp_path / "images"
    make_folder(root, vary=True)
    with pytest.raises(OptionsError, match="--chunk-bytes"):
        convert(root, tmp_path / "p.h5", ConvertOptions(workers=1, mode="raw", chunk_samples=4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_encoded_max_side_reencodes_large_images(tmp_path):
    root = tmp_path / "images"
    make_folder(root, size=(40, 60), vary=True, per_class=2)
    options = ConvertOptions(workers=1, mode="encoded", max_side=30, quality=80)
    report = convert(root, tmp_path / "p.h5", options)
    with PackReader(report.path) as reader:
        for i, image in enumerate(reader.read_images(range(len(reader)))):
            assert max(image.shape[:2]) == 30
            assert tuple(reader.meta.shapes[i]) == image.shape


def test_gray_channel(tmp_path, folder):
    report = convert(folder, tmp_path / "p.h5", ConvertOptions(workers=1, channels=1))
    assert report.meta.images_shape[1:] == (12, 16, 1)
    assert report.meta.channels == 1


def test_target_directory_must_exist(tmp_path, folder):
    with pytest.raises(OptionsError, match="create it first"):
        convert(folder, tmp_path / "no" / "p.h5", ConvertOptions(workers=1))


def test_hostile_tree_packs_only_real_images(tmp_path, folder):
    """Litter, hidden files, look-alike folders, FIFOs and dangling links are never samples."""
    (folder / ".DS_Store").write_bytes(b"\x00\x01")
    (folder / "cat" / "._000.jpg").write_bytes(b"resource fork")
    (folder / "cat" / ".hidden.jpg").write_bytes((folder / "cat" / "000.jpg").read_bytes())
    (folder / "cat" / "Thumbs.db").write_bytes(b"thumbs")
    (folder / "cat" / "notes.txt").write_text("not an image")
    (folder / "dog" / "looks.jpg").mkdir()
    (folder / "__MACOSX").mkdir()
    (folder / "__MACOSX" / "x.jpg").write_bytes(b"junk")
    os.mkfifo(folder / "dog" / "pipe.jpg")
    (folder / "dog" / "gone.jpg").symlink_to(folder / "nowhere.jpg")
    (folder / "dog" / "alias.jpg").symlink_to(folder / "dog" / "000.jpg")
    events = []
    report = convert(folder, tmp_path / "p.h5", ConvertOptions(workers=2), on_event=events.append)
    with PackReader(report.path) as reader:
        packed = sorted(reader.paths)
        for i, image in enumerate(reader.read_images(range(len(reader)))):
            np.testing.assert_array_equal(image, pil_rgb(folder / reader.paths[i]))
    real = sorted(f"{c}/{i:03d}.jpg" for c in ("cat", "dog") for i in range(4))
    assert packed == sorted([*real, "dog/alias.jpg"])
    skipped = {s.path for s in report.skipped}
    assert "dog/gone.jpg" in skipped  # a dangling link is reported, not packed
    assert skipped <= {"dog/gone.jpg", "dog/pipe.jpg"}
    assert {e.path for e in events if e.kind == "skipped"} == skipped


@pytest.mark.parametrize("via", ["the file itself", "a symlink to it", "a hard link to it"])
def test_a_target_that_is_one_of_the_images_is_refused_before_any_work(
    tmp_path, folder, monkeypatch, via
):
    """``h5pack convert imgs imgs/cat/000.jpg --overwrite`` once replaced a photo."""
    from h5pack.write import packing as writer

    source = folder / "cat" / "000.jpg"
    photo = source.read_bytes()
    target = {
        "the file itself": source,
        "a symlink to it": tmp_path / "link.h5",
        "a hard link to it": tmp_path / "hard.h5",
    }[via]
    if via == "a symlink to it":
        target.symlink_to(source)
    elif via == "a hard link to it":
        os.link(source, target)
    monkeypatch.setattr(writer, "make_executor", _no_work)
    with pytest.raises(OptionsError, match="one of the images being packed") as info:
        convert(folder, target, ConvertOptions(workers=1), overwrite=True)
    assert str(target) in str(info.value)
    assert str(source) in str(info.value)
    assert source.read_bytes() == photo
    assert target.read_bytes() == photo
    assert sorted(p.name for p in (folder / "cat").iterdir()) == [
        "000.jpg",
        "001.jpg",
        "002.jpg",
        "003.jpg",
    ]


def _no_work(workers):
    raise AssertionError("the refusal should come before any work")


def test_the_cli_refuses_a_source_as_target_naming_both(tmp_path, folder):
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    source = folder / "dog" / "001.jpg"
    photo = source.read_bytes()
    result = CliRunner().invoke(cli, ["convert", str(folder), str(source), "--overwrite"])
    assert result.exit_code == 2, result.output
    assert f"the target {source} is {source}, one of the images being packed" in result.output
    assert source.read_bytes() == photo
