"""write_arrays: round trips at chunk boundaries, shuffling, encoded bytes, bad inputs."""

import zlib

import numpy as np
import pytest

from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.errors import DecodeError, OptionsError, TargetExistsError
from h5pack.read.reader import PackReader
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import assert_aligned, jpeg, random_arrays


def _read_all(path):
    with PackReader(path) as reader:
        return reader.meta, reader.read_images(range(len(reader))), reader.paths


@pytest.mark.parametrize("num", [12, 13, 15])  # N mod k = 0, 1, k - 1 for k = 4
@pytest.mark.parametrize("codec", ["none", "gzip", "zstd"])
def test_array_round_trip_at_chunk_boundaries(tmp_path, num, codec):
    samples = random_arrays(num)
    labels = [i % 3 for i in range(num)]
    options = ConvertOptions(chunk_samples=4, compression=Compression(codec=codec))
    report = write_arrays(tmp_path / "p.h5", samples, labels, options=options)
    meta, images, paths = _read_all(report.path)
    assert meta.storage == "array"
    assert meta.chunks == (4, 8, 10, 3)
    assert meta.num_samples == num == report.num_samples
    assert sorted(meta.source_index.tolist()) == list(range(num))  # every sample once
    for i, image in enumerate(images):
        src = int(meta.source_index[i])
        np.testing.assert_array_equal(image, samples[src])
        assert meta.labels[i] == labels[src]
        assert paths[i] == f"sample-{src:06d}"
        assert meta.checksums[i] == zlib.crc32(samples[src].tobytes())
    assert meta.classes == ("0", "1", "2")


def test_shuffle_is_seeded_and_can_be_turned_off(tmp_path):
    samples = random_arrays(20)
    a = write_arrays(tmp_path / "a.h5", samples, [0] * 20, options=ConvertOptions(seed=3))
    b = write_arrays(tmp_path / "b.h5", samples, [0] * 20, options=ConvertOptions(seed=3))
    c = write_arrays(tmp_path / "c.h5", samples, [0] * 20, options=ConvertOptions(seed=4))
    d = write_arrays(
        tmp_path / "d.h5", samples, [0] * 20, options=ConvertOptions(shuffle_samples=False)
    )
    assert a.meta.source_index.tolist() == b.meta.source_index.tolist()
    assert a.meta.source_index.tolist() != c.meta.source_index.tolist()
    assert d.meta.source_index.tolist() == list(range(20))


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_encoded_bytes_are_stored_exactly(tmp_path, codec):
    rng = np.random.default_rng(2)
    files = [jpeg(rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)) for i in range(6)]
    options = ConvertOptions(chunk_bytes=2500, compression=Compression(codec=codec))
    report = write_arrays(tmp_path / "p.h5", files, [0] * 6, options=options)
    assert (report.mode, report.storage) == ("encoded", "blob")
    with PackReader(report.path) as reader:
        stored = reader.read_stored(range(6))
        for i, data in enumerate(stored):
            assert data.tobytes() == files[int(reader.meta.source_index[i])]
        assert reader.read_images([0])[0].shape == tuple(reader.meta.shapes[0])
    assert_aligned(report.meta.offsets, report.meta.sizes, 2500)


def test_bad_bytes_are_skipped_or_stop_in_strict_mode(tmp_path):
    files = [jpeg(a) for a in random_arrays(3, (10, 12, 3))]
    files[1] = files[1][: len(files[1]) // 2]  # truncated
    events = []
    report = write_arrays(
        tmp_path / "p.h5", files, [0, 1, 0], classes=["a", "b"], on_event=events.append
    )
    assert report.num_samples == 2
    assert [s.path for s in report.skipped] == ["sample-000001"]
    assert [e.path for e in events if e.kind == "skipped"] == ["sample-000001"]
    meta = fmt.load_meta(report.path)
    assert [s.path for s in meta.skipped] == ["sample-000001"]
    with pytest.raises(Exception, match="sample-000001"):
        write_arrays(tmp_path / "q.h5", files, [0, 1, 0], options=ConvertOptions(strict=True))
    assert not (tmp_path / "q.h5").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.h5"]


def test_refuses_to_overwrite_without_permission(tmp_path):
    target = tmp_path / "p.h5"
    target.write_bytes(b"precious")
    with pytest.raises(TargetExistsError, match=r"p\.h5"):
        write_arrays(target, random_arrays(2), [0, 0])
    assert target.read_bytes() == b"precious"
    write_arrays(target, random_arrays(2), [0, 0], overwrite=True)
    assert fmt.load_meta(target).num_samples == 2


def test_resizes_arrays_to_size(tmp_path):
    samples = random_arrays(3, (20, 30, 3)) + random_arrays(2, (10, 10, 3))
    report = write_arrays(tmp_path / "p.h5", samples, [0] * 5, options=ConvertOptions(size=(6, 8)))
    assert report.meta.images_shape == (5, 6, 8, 3)


@pytest.mark.parametrize(
    ("samples", "labels", "match"),
    [
        (random_arrays(2), [0], "one entry each"),
        (random_arrays(2, (4, 4)), [0, 0], "HWC uint8"),
        ([np.zeros((4, 4, 3), np.float32)] * 2, [0, 0], "HWC uint8"),
        (random_arrays(2), [0, 5], "labels"),
        ([], [], "empty"),
    ],
)
def test_bad_inputs_are_refused(tmp_path, samples, labels, match):
    with pytest.raises(OptionsError, match=match):
        write_arrays(tmp_path / "p.h5", samples, labels, classes=["a", "b"] if labels else ())
    assert list(tmp_path.iterdir()) == []


def test_encoded_mode_needs_bytes(tmp_path):
    with pytest.raises(OptionsError, match="encoded"):
        write_arrays(
            tmp_path / "p.h5", random_arrays(2), [0, 0], options=ConvertOptions(mode="encoded")
        )


def test_skipped_samples_are_logged_once(tmp_path, caplog):
    files = [jpeg(a) for a in random_arrays(4, (10, 12, 3))]
    files[1] = files[2] = b"not an image"
    with caplog.at_level("WARNING", logger="h5pack"):
        report = write_arrays(tmp_path / "p.h5", files, [0] * 4)
    records = [r for r in caplog.records if r.name == "h5pack"]
    assert len(records) == 1  # one summary, not one line per file
    message = records[0].getMessage()
    assert "skipped 2 files" in message
    assert "sample-000001" in message
    assert "sample-000002" in message
    assert [s.path for s in report.skipped] == ["sample-000001", "sample-000002"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="h5pack"):
        write_arrays(tmp_path / "q.h5", files[:1], [0])
    assert not caplog.records


def test_convert_logs_what_it_skipped(tmp_path, caplog):
    """The Python convert() tells of stray and broken files through logging, too."""
    from PIL import Image

    from h5pack.write.convert import convert

    root = tmp_path / "images"
    (root / "cat").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (8, 6), (i, 0, 0)).save(root / "cat" / f"{i}.png")
    Image.new("RGB", (8, 6)).save(root / "preview.png")
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 broken")
    with caplog.at_level("WARNING", logger="h5pack"):
        report = convert(root, tmp_path / "p.h5", ConvertOptions(workers=1))
    assert report.num_samples == 3
    assert sorted(s.path for s in report.skipped) == ["cat/broken.jpg", "preview.png"]
    (record,) = [r for r in caplog.records if r.name == "h5pack"]
    assert record.levelname == "WARNING"
    assert "skipped 2 files" in record.getMessage()
    assert "preview.png" in record.getMessage()
    with pytest.raises(DecodeError, match=r"preview\.png.*--strict"):
        convert(root, tmp_path / "q.h5", ConvertOptions(workers=1, strict=True))


def test_contiguous_blob_of_bytes_is_sized_from_them_and_round_trips(tmp_path):
    rng = np.random.default_rng(4)
    files = [jpeg(rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)) for i in range(6)]
    files[3] = b"broken"  # skipped: its bytes stay unused at the end of the blob
    report = write_arrays(tmp_path / "p.h5", files, [0] * 6)
    assert report.meta.chunks is None
    assert report.meta.images_shape == (sum(map(len, files)),)
    assert report.meta.offsets[-1] == sum(map(len, files)) - len(b"broken")
    with PackReader(report.path) as reader:
        for i, data in enumerate(reader.read_stored(range(len(reader)))):
            assert data.tobytes() == files[int(reader.meta.source_index[i])]
