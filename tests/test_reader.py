"""PackReader: pixels and bytes against the source images; damage named, never served."""

import io

import h5py
import numpy as np
import pytest
from PIL import Image

from h5pack import H5ImageDataset, make_loader
from h5pack.core.layout import Compression
from h5pack.errors import FormatError
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.write.convert import convert, write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import pil_rgb, shared_photos


@pytest.fixture
def damaged_gzip_pack(tmp_path):
    rng = np.random.default_rng(0)
    # Smooth images compress well, so the flipped bytes land inside deflate streams.
    base = np.linspace(0, 255, 16 * 16 * 3).reshape(16, 16, 3).astype(np.uint8)
    images = [np.roll(base, int(s), axis=1) for s in rng.integers(0, 16, 24)]
    path = tmp_path / "damaged.h5"
    write_arrays(
        path,
        images,
        [i % 2 for i in range(24)],
        options=ConvertOptions(chunk_samples=8, compression=Compression(codec="gzip")),
    )
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(1)  # chunk group 1: samples 8..15
    with open(path, "r+b") as f:
        for k in range(8, min(info.size, 400), 16):
            f.seek(info.byte_offset + k)
            byte = f.read(1)[0]
            f.seek(info.byte_offset + k)
            f.write(bytes([byte ^ 0xFF]))
    return path


@pytest.mark.parametrize("direct", [True, False])
def test_damaged_chunk_names_pack_group_and_samples(damaged_gzip_pack, direct):
    with PackReader(damaged_gzip_pack, ReaderOptions(direct=direct)) as reader:
        assert reader.read_images([0, 7])[0].shape == (16, 16, 3)  # group 0 is intact
        with pytest.raises(FormatError, match=r"chunk group 1 \(samples 8\.\.15\)") as info:
            reader.read_images([9])
    message = str(info.value)
    assert str(damaged_gzip_pack) in message
    assert "h5pack verify" in message


def test_loader_stops_on_a_damaged_pack(damaged_gzip_pack):
    loader = make_loader(damaged_gzip_pack, 4, num_workers=0)
    with pytest.raises(FormatError, match="damaged"):
        for _ in loader:
            pass
    dataset = H5ImageDataset(damaged_gzip_pack)
    with pytest.raises(FormatError, match="chunk group 1"):
        dataset[10]


def _flip_byte_of_sample(path, index):
    with h5py.File(path, "r") as f:
        images = f["images"]
        if images.chunks is None:
            start = images.id.get_offset()
        else:
            start = images.id.get_chunk_info(0).byte_offset
        if images.ndim == 4:
            inside = index * int(np.prod(images.shape[1:])) + 5
        else:
            inside = int(f["offsets"][index]) + 5
    with open(path, "r+b") as f:
        f.seek(start + inside)
        byte = f.read(1)[0]
        f.seek(start + inside)
        f.write(bytes([byte ^ 0xFF]))


@pytest.mark.parametrize("mode", ["raw", "encoded"])
def test_verify_checksums_refuses_a_sample_damaged_in_place(tmp_path, mode):
    import io

    from PIL import Image

    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(6)]
    samples = arrays
    if mode == "encoded":
        samples = []
        for array in arrays:
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, format="PNG")
            samples.append(buffer.getvalue())
    path = tmp_path / f"{mode}.h5"
    write_arrays(
        path,
        samples,
        [0] * 6,
        paths=[f"img_{i}.png" for i in range(6)],
        options=ConvertOptions(mode=mode, shuffle_samples=False),
    )
    _flip_byte_of_sample(path, 3)
    with PackReader(path, ReaderOptions(verify_checksums=False)) as reader:
        reader.read_stored([3])  # checks off: the bytes are served as stored
    with (
        PackReader(path) as reader,  # checked by default
        pytest.raises(FormatError, match=r"sample 3 \(img_3\.png\) does not match its checksum"),
    ):
        reader.read_stored([0, 3])
    if mode == "raw":
        loader = make_loader(path, 6, num_workers=0, reader=ReaderOptions(verify_checksums=True))
        with pytest.raises(FormatError, match="h5pack verify"):
            next(iter(loader))


def test_iter_chunks_covers_the_pack_in_order_with_the_source_samples(tmp_path):
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (4, 5, 3), dtype=np.uint8) for _ in range(11)]
    path = tmp_path / "p.h5"
    options = ConvertOptions(chunk_samples=4, compression=Compression(codec="lz4"))
    write_arrays(path, images, [0] * 11, options=options)
    with PackReader(path) as reader:
        source = reader.meta.source_index
        seen = []
        for indices, stored in reader.iter_chunks():
            assert len(indices) == len(stored) <= 4
            for i, sample in zip(indices, stored, strict=True):
                np.testing.assert_array_equal(sample, images[int(source[i])])
            seen.extend(indices)
        assert seen == list(range(11))
        assert sorted(source.tolist()) == list(range(11))  # every source sample once
        assert [len(reader.read_chunk(c)) for c in range(reader.chunk_map.num_chunks)] == [4, 4, 3]
        for c in range(reader.chunk_map.num_chunks):
            for i, sample in zip(reader.chunk_map.samples(c), reader.read_chunk(c), strict=True):
                np.testing.assert_array_equal(sample, images[int(source[i])])


# -- real JPEG files: the reader against an independent Pillow decode of each source file ---

PHOTOS = shared_photos()

# Baseline, progressive, no chroma subsampling and grayscale: the JPEGs cameras and the web
# make, each decoded by the reader exactly as by Pillow.
JPEG_VARIANTS = [
    ("RGB", {"quality": 90}),
    ("RGB", {"quality": 75, "progressive": True}),
    ("RGB", {"quality": 95, "subsampling": 0}),
    ("L", {"quality": 85}),
]


def _jpeg_folder(root, *, vary):
    """Cut crops of two real photographs into a cat/dog folder of JPEG files (9 per class)."""
    if not PHOTOS.is_dir():
        pytest.skip(f"no photographs in {PHOTOS}")
    for c, (label, name) in enumerate((("cat", "rocket.jpg"), ("dog", "Dune.jpg"))):
        with Image.open(PHOTOS / name) as photo:
            photo.draft("RGB", (320, 240))  # a fast, reduced decode; crops stay inside
            photo = photo.convert("RGB")
        (root / label).mkdir(parents=True)
        for i in range(9):
            h, w = (40 + 3 * i, 56 - 2 * c) if vary else (40, 56)
            x, y = 13 * i + 7 * c, 9 * i
            mode, save = JPEG_VARIANTS[i % len(JPEG_VARIANTS)]
            assert x + w <= photo.width
            assert y + h <= photo.height
            crop = photo.crop((x, y, x + w, y + h)).convert(mode)
            crop.save(root / label / f"{i:03d}.jpg", format="JPEG", **save)
    return root


@pytest.mark.parametrize("vary", [False, True], ids=["one-size", "several-sizes"])
def test_raw_pack_of_real_jpegs_has_the_pixels_pillow_decodes(tmp_path, vary):
    root = _jpeg_folder(tmp_path / "jpegs", vary=vary)
    chunking = {"chunk_bytes": 9000} if vary else {"chunk_samples": 4}  # 18 % 4 = 2
    options = ConvertOptions(workers=1, mode="raw", **chunking)
    report = convert(root, tmp_path / "p.h5", options)
    assert report.num_samples == 18
    assert report.storage == ("blob" if vary else "array")
    for direct in (True, False):
        with PackReader(report.path, ReaderOptions(direct=direct)) as reader:
            order = np.random.default_rng(0).permutation(len(reader))
            for i, image in zip(order, reader.read_images(order), strict=True):
                source = root / reader.paths[i]
                np.testing.assert_array_equal(image, pil_rgb(source))
                assert reader.meta.classes[reader.meta.labels[i]] == reader.paths[i].split("/")[0]


def test_encoded_pack_of_real_jpegs_stores_the_files_bytes(tmp_path):
    root = _jpeg_folder(tmp_path / "jpegs", vary=True)
    options = ConvertOptions(workers=1, mode="encoded", chunk_bytes=5000)
    report = convert(root, tmp_path / "p.h5", options)
    assert report.num_samples == 18
    with PackReader(report.path) as reader:
        order = np.random.default_rng(1).permutation(len(reader))
        stored = reader.read_stored(order)
        images = reader.read_images(order)
        for i, data, image in zip(order, stored, images, strict=True):
            source = root / reader.paths[i]
            assert data.tobytes() == source.read_bytes()
            np.testing.assert_array_equal(image, pil_rgb(source))
            assert tuple(reader.meta.shapes[i]) == image.shape


@pytest.fixture
def raw_pack(tmp_path):
    """An uncompressed array pack of 24 distinct 16x16 images, and the images."""
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(24)]
    path = tmp_path / "raw.h5"
    write_arrays(path, images, [i % 2 for i in range(24)], options=ConvertOptions(chunk_samples=5))
    return path, images


def test_mapped_views_are_the_stored_samples_and_are_checked(raw_pack):
    path, images = raw_pack
    with PackReader(path) as reader:
        assert reader.meta.storage == "array"
        views = reader.stored_views([5, 0, 23])
        assert views is not None
        for index, view in zip([5, 0, 23], views, strict=True):
            want = images[int(reader.meta.source_index[index])]
            np.testing.assert_array_equal(view, want)
            assert not view.flags.writeable  # the pack's own bytes: read-only
            reader.verify_sample(index, view)
        with pytest.raises(FormatError, match="does not match its checksum"):
            reader.verify_sample(0, views[0])  # sample 5's bytes are not sample 0's
        out = np.empty((3, 16, 16, 3), dtype=np.uint8)
        reader.read_into([5, 0, 23], out)  # copied out of the same mapping
        np.testing.assert_array_equal(out, np.stack(views))
        strided = np.zeros((3, 16, 32, 3), dtype=np.uint8)[:, :, ::2]
        reader.read_into([5, 0, 23], strided)  # not contiguous: the same pixels
        np.testing.assert_array_equal(strided, out)
    with PackReader(path, ReaderOptions(direct=False)) as reader:
        assert reader.stored_views([0]) is None  # only the direct path maps the file


def test_the_mapped_copy_serves_the_stored_samples(raw_pack):
    """NOTE [ Checked as copied ]: each batch's samples land in their rows, in batch order."""
    path, images = raw_pack
    with PackReader(path) as reader:
        for indices in ([5, 0, 23], [23, 22, 1, 1, 9], list(range(24))[::-1]):
            out = np.zeros((len(indices), 16, 16, 3), dtype=np.uint8)
            reader.read_into(indices, out)
            for row, index in zip(out, indices, strict=True):
                np.testing.assert_array_equal(row, images[int(reader.meta.source_index[index])])


def test_a_sample_that_changed_back_is_served_and_the_rest_of_the_batch_too(raw_pack, monkeypatch):
    """A digest that failed in the loop but passes verify_one (the file changed under the
    read) serves the sample as it now is, and every later row of the batch is written."""
    path, images = raw_pack
    with PackReader(path) as reader:
        indices = [5, 0, 23, 9]
        recorded = reader.checks.recorded.copy()
        recorded[0] ^= 1  # the loop's check of sample 0 fails...
        monkeypatch.setattr(reader.checks, "recorded", recorded)
        checked: list[int] = []
        monkeypatch.setattr(
            reader.checks, "one", lambda index, sample, group=None: checked.append(index)
        )
        out = np.zeros((4, 16, 16, 3), dtype=np.uint8)
        reader.read_into(indices, out)  # ...and its second check (stubbed) passes
        assert checked == [0]
        for row, index in zip(out, indices, strict=True):
            np.testing.assert_array_equal(row, images[int(reader.meta.source_index[index])])


@pytest.mark.parametrize("size", [8, None])  # the crop's cut, the uncropped copy
def test_a_damaged_sample_is_refused_on_the_mapped_paths(raw_pack, tmp_path, size):
    path, images = raw_pack
    data = bytearray(path.read_bytes())
    at = data.find(images[7].tobytes())
    assert at > 0
    data[at + 100] ^= 0xFF
    damaged = tmp_path / "damaged-raw.h5"
    damaged.write_bytes(bytes(data))
    crop = {"size": size, "flip": True} if size else {}
    loader = make_loader(damaged, 4, num_workers=0, **crop, reader=ReaderOptions(threads=2))
    sample = int(np.flatnonzero(loader.dataset.meta.source_index == 7)[0])
    with pytest.raises(FormatError, match=rf"sample {sample} \(.*\) does not match its checksum"):
        for _ in loader:
            pass
    unchecked = make_loader(
        damaged, 4, size=size, num_workers=0, reader=ReaderOptions(verify_checksums=False)
    )
    assert sum(len(labels) for _, labels in unchecked) == 24  # served as stored


def test_sample_checks_are_verify_samples_digests(raw_pack):
    """NOTE [ Checked as copied ]: the inline check is verify_sample's, per sample."""
    path, _ = raw_pack
    indices = [23, 0, 5, 5]
    with PackReader(path) as reader:
        views = reader.stored_views(indices)
        checks = reader.sample_checks(indices)
        assert views is not None
        assert checks is not None
        digest, recorded = checks
        assert [digest(view) for view in views] == recorded
        assert digest(views[1]) != recorded[0]
    with PackReader(path, ReaderOptions(verify_checksums=False)) as reader:
        assert reader.sample_checks(indices) is None


@pytest.mark.parametrize("size", [None, 8])
def test_a_pack_truncated_under_a_reader_is_a_short_read_not_a_crash(raw_pack, size):
    """The mapped reads compare the file's size with each batch's needs (NOTE [ Mapped ...])."""
    path, images = raw_pack
    loader = make_loader(path, 4, size=size, num_workers=0, shuffle=False)
    last = images[int(loader.dataset.meta.source_index[23])].tobytes()
    at = path.read_bytes().find(last)
    assert at > 0
    next(iter(loader))  # the file is mapped now (samples 0..3)
    with open(path, "r+b") as f:
        f.truncate(at + 10)  # into the last sample's bytes
    with pytest.raises(FormatError, match="short read"):
        for _ in loader:
            pass


def test_mapped_views_of_a_contiguous_blob_pack_are_its_stored_bytes(tmp_path):
    rng = np.random.default_rng(4)
    files = []
    for side in rng.integers(8, 40, 30).tolist():
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side + 3, 3), dtype=np.uint8)).save(
            buffer, format="JPEG"
        )
        files.append(buffer.getvalue())
    path = tmp_path / "blobs.h5"
    write_arrays(path, files, [0] * len(files), options=ConvertOptions(mode="encoded"))
    with PackReader(path) as reader:
        indices = [29, 0, 7, 7, 13]
        views = reader.stored_views(indices)
        if views is None:
            pytest.skip("this pack's blobs are chunked: only contiguous blobs are mapped")
        for index, view, stored in zip(indices, views, reader.read_stored(indices), strict=True):
            np.testing.assert_array_equal(view, stored)
            reader.verify_sample(index, view)
        with pytest.raises(FormatError, match="does not match its checksum"):
            reader.verify_sample(0, views[0])
