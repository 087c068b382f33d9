"""write/pipeline.py: the two stages (prepare, compress), ordered_map and the worker pool."""

import io
import os
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
import pytest
from PIL import Image

from h5pack.core import format as fmt
from h5pack.core.decode import decode_image, resize_image
from h5pack.core.layout import Compression
from h5pack.errors import H5PackError
from h5pack.read.reader import PackReader
from h5pack.write.convert import convert
from h5pack.write.images import ImagesSpec
from h5pack.write.options import ConvertOptions
from h5pack.write.pipeline import (
    DecodeSpec,
    InlineExecutor,
    Prepared,
    Rejected,
    compress_block,
    ordered_map,
    pool_start_method,
    prepare_sample,
    release_core,
)
from tests.helpers import arrays, jpeg, make_folder, pil_rgb, png


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "images"
    make_folder(root)
    return root


# -- ordered_map --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["threads", "inline"])
def test_ordered_map_yields_in_submission_order_with_bounded_tasks_in_flight(kind):
    num, bound = 18, 3
    lock = threading.Lock()
    taken = 0  # items taken from the source, i.e. submitted
    running = peak = 0

    def work(i, delay_s):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(delay_s)
        with lock:
            running -= 1
        return i * i

    def items():
        nonlocal taken
        for i in range(num):
            taken += 1
            # Later tasks of each group of three are quicker: they finish out of order.
            yield i, 0.002 * (3 - i % 3)

    results = []
    executor = ThreadPoolExecutor(8) if kind == "threads" else InlineExecutor()
    with executor:
        for _, value in ordered_map(executor, work, items(), max_in_flight=bound):
            assert taken - len(results) <= bound  # submitted and not yet yielded
            results.append(value)
    assert results == [i * i for i in range(num)]
    assert taken == num
    assert peak <= bound
    if kind == "inline":
        assert peak == 1


def test_ordered_map_cancels_what_is_pending_when_the_consumer_stops():
    started = []
    gate = threading.Event()

    def work(i):
        started.append(i)
        if i:
            gate.wait(5)
        return i

    with ThreadPoolExecutor(1) as pool:  # one thread: task 2 queues behind task 1
        results = ordered_map(pool, work, [(i,) for i in range(10)], max_in_flight=3)
        assert next(results) == ((0,), 0)
        results.close()  # task 1 may be running; task 2 is cancelled, nothing more submitted
        gate.set()
    assert started in ([0], [0, 1])


# -- stage 1: prepare_sample ----------------------------------------------------------------


def test_prepare_sample_raw_pixels_carry_the_checksum_of_their_bytes():
    image = arrays(1, (6, 5, 3))[0]
    spec = DecodeSpec(mode="raw", fixed_shape=(6, 5, 3))
    result = prepare_sample(spec, png(image), "a/x.png", 7)
    assert isinstance(result, Prepared)
    assert (result.pos, result.shape, result.span) == (7, (6, 5, 3), None)
    np.testing.assert_array_equal(result.data, image)  # PNG is lossless
    assert result.crc == fmt.checksum(result.data) == zlib.crc32(image.tobytes())
    flat = prepare_sample(DecodeSpec(mode="raw", flat=True), png(image), "a/x.png", 7)
    assert isinstance(flat, Prepared)
    assert flat.data.shape == (6 * 5 * 3,)
    assert flat.crc == result.crc


def test_prepare_sample_encoded_keeps_the_file_bytes_and_their_checksum():
    data = jpeg(arrays(1, (9, 11, 3))[0])
    result = prepare_sample(DecodeSpec(mode="encoded", flat=True), data, "b.jpg", 0)
    assert isinstance(result, Prepared)
    assert result.data.tobytes() == data
    assert result.shape == (9, 11, 3)
    assert result.crc == fmt.checksum(result.data) == zlib.crc32(data)


def test_prepare_sample_reencodes_over_max_side_with_the_checksum_of_the_new_bytes():
    data = jpeg(arrays(1, (40, 20, 3))[0])
    spec = DecodeSpec(mode="encoded", flat=True, max_side=10, quality=80)
    result = prepare_sample(spec, data, "big.jpg", 2)
    assert isinstance(result, Prepared)
    assert result.shape == (10, 5, 3)
    assert result.data.tobytes() != data
    assert result.crc == fmt.checksum(result.data.tobytes())


@pytest.mark.parametrize("mode", ["raw", "encoded"])
@pytest.mark.parametrize(
    "data",
    [b"", b"not an image", jpeg(arrays(1, (16, 16, 3))[0])[:40]],
    ids=["empty", "text", "cut"],
)
def test_prepare_sample_rejects_corrupt_bytes_with_a_reason(mode, data):
    result = prepare_sample(DecodeSpec(mode=mode), data, "cat/bad.jpg", 4)
    assert isinstance(result, Rejected)
    assert (result.pos, result.path) == (4, "cat/bad.jpg")
    assert result.reason
    assert not result.reason.startswith("cat/bad.jpg")  # the caller names the file


def test_prepare_sample_rejects_a_size_other_than_the_packs():
    spec = DecodeSpec(mode="raw", fixed_shape=(6, 5, 3))
    result = prepare_sample(spec, png(arrays(1, (7, 5, 3))[0]), "odd.png", 1)
    assert isinstance(result, Rejected)
    assert "decodes to 7x5x3" in result.reason
    assert "6x5x3" in result.reason
    assert "--size" in result.reason


def _photo(height: int, width: int) -> np.ndarray:
    """A smooth RGB image with detail (a resize of it is not trivially exact)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x * y) % 251], axis=2)
    return rgb.astype(np.uint8)


def _encoded(image: Image.Image, fmt_name: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt_name, **params)
    return buffer.getvalue()


def _rotated_jpeg(rgb: np.ndarray) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated by 90 degrees clockwise
    return _encoded(Image.fromarray(rgb), "JPEG", quality=90, exif=exif)


# Files of every kind that the decoder treats apart: the plain RGB JPEG of a photo folder,
# and the kinds that need conversion, compositing or orientation.
_KINDS = {
    "rgb-jpeg": lambda rgb: jpeg(rgb),
    "gray-jpeg": lambda rgb: _encoded(Image.fromarray(rgb).convert("L"), "JPEG"),
    "cmyk-jpeg": lambda rgb: _encoded(Image.fromarray(rgb).convert("CMYK"), "JPEG"),
    "exif-rotated-jpeg": _rotated_jpeg,
    "rgba-png": lambda rgb: _encoded(Image.fromarray(rgb).convert("RGBA"), "PNG"),
    "palette-png": lambda rgb: _encoded(Image.fromarray(rgb).convert("P"), "PNG"),
    "rgb-png": lambda rgb: png(rgb),
}


@pytest.mark.parametrize("kind", list(_KINDS))
@pytest.mark.parametrize("method", ["stretch", "crop", "pad"])
@pytest.mark.parametrize("channels", [3, 1])
def test_prepare_sample_resized_pixels_are_decode_then_resize(kind, method, channels):
    # The worker's fused decode+resize (NOTE [ Decoding without the array ]) must store
    # exactly the pixels of decode_image followed by resize_image.
    data = _KINDS[kind](_photo(45, 60))
    spec = DecodeSpec(mode="raw", size=(20, 24), resize=method, channels=channels)
    result = prepare_sample(spec, data, "a/x", 0)
    assert isinstance(result, Prepared)
    decoded = decode_image(data, channels=channels)
    want = resize_image(decoded, (20, 24), method=method)
    assert result.shape == (20, 24, channels)
    np.testing.assert_array_equal(result.data, want)
    assert result.crc == zlib.crc32(want.tobytes())


def test_prepare_sample_resizes_a_jpeg_as_pillow_does():
    # Independent of h5pack's decoder: what a user's Pillow code makes of the same file.
    data = jpeg(_photo(45, 60))
    spec = DecodeSpec(mode="raw", size=(20, 24))
    result = prepare_sample(spec, data, "a/x.jpg", 0)
    assert isinstance(result, Prepared)
    with Image.open(io.BytesIO(data)) as image:
        want = np.asarray(image.convert("RGB").resize((24, 20), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(result.data, want)


@pytest.mark.parametrize("kind", list(_KINDS))
def test_prepare_sample_encoded_shape_is_the_decoded_shape(kind):
    data = _KINDS[kind](_photo(45, 60))
    result = prepare_sample(DecodeSpec(mode="encoded", flat=True), data, "a/x", 0)
    assert isinstance(result, Prepared)
    want = (60, 45) if kind == "exif-rotated-jpeg" else (45, 60)
    assert result.shape == (*want, 3)
    assert decode_image(data).shape == (*want, 3)
    assert result.data.tobytes() == data


@pytest.mark.parametrize("mode", ["raw", "encoded"])
def test_prepare_sample_rejects_a_jpeg_cut_in_its_pixels(mode):
    # The header reads fine; only decoding every pixel finds the damage.
    data = jpeg(_photo(45, 60))
    cut = data[: len(data) * 2 // 3]
    spec = DecodeSpec(mode=mode, size=(20, 24) if mode == "raw" else None)
    result = prepare_sample(spec, cut, "a/cut.jpg", 3)
    assert isinstance(result, Rejected)
    assert "cannot decode JPEG image" in result.reason


# -- stage 2: compress_block ----------------------------------------------------------------


def _independent_decompress(codec, stored, nbytes):
    if codec == "gzip":
        return zlib.decompress(stored)
    zstandard = pytest.importorskip("zstandard")
    return zstandard.ZstdDecompressor().decompress(stored, max_output_size=nbytes)


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
@pytest.mark.parametrize("storage", ["array", "blob"])
def test_compress_block_is_filter_exact(tmp_path, codec, storage):
    """Chunks from the in-memory file are the bytes HDF5 writes and decompress to the data."""
    rows = 10  # 10 % 4 = 2: the last chunk is partial
    if storage == "array":
        spec = ImagesSpec("array", (6, 5, 3), (4, 6, 5, 3), Compression(codec=codec))
        data = np.stack(arrays(rows))
        start = 8  # a block later in the dataset: offsets are shifted by its start
    else:
        spec = ImagesSpec("blob", None, (64,), Compression(codec=codec))
        data = np.concatenate([a.reshape(-1) for a in arrays(3)])[:250]
        rows, start = len(data), 128
    try:
        chunks = compress_block(spec, start, rows, data)
    finally:
        release_core()
    step = spec.chunks[0]
    assert [offset[0] for offset, _, _ in chunks] == list(range(start, start + rows, step))
    assert all(mask == 0 for _, mask, _ in chunks)

    with h5py.File(tmp_path / "direct.h5", "w") as f, h5py.File(tmp_path / "h5py.h5", "w") as g:
        direct = spec.create(f, "images", start + rows)
        for offset, mask, stored in chunks:
            direct.id.write_direct_chunk(offset, stored, mask)
        np.testing.assert_array_equal(direct[start:], data)  # the round trip through HDF5
        reference = spec.create(g, "images", start + rows)
        reference[start:] = data
        for offset, _, stored in chunks:
            _, written = reference.id.read_direct_chunk(offset)
            assert bytes(stored) == written  # what HDF5 itself stores
            chunk_rows = min(step, start + rows - offset[0])
            whole = np.zeros((step, *data.shape[1:]), np.uint8)
            whole[:chunk_rows] = data[offset[0] - start : offset[0] - start + chunk_rows]
            plain = _independent_decompress(codec, bytes(stored), whole.nbytes)
            assert plain == whole.tobytes()  # padding rows are zeros


# -- the pool -----------------------------------------------------------------------------


def test_pool_with_shared_memory_round_trips_blobs(tmp_path):
    root = tmp_path / "images"
    make_folder(root, per_class=10, vary=True)
    options = ConvertOptions(
        workers=2, mode="raw", chunk_bytes=3000, compression=Compression(codec="lz4")
    )
    report = convert(root, tmp_path / "p.h5", options)
    with PackReader(report.path) as reader:
        for i, image in enumerate(reader.read_images(range(len(reader)))):
            np.testing.assert_array_equal(image, pil_rgb(root / reader.paths[i]))


def _crash(*args, **kwargs):
    os._exit(3)  # a decoder crashing hard inside a worker


@pytest.mark.skipif(pool_start_method() != "fork", reason="the patch reaches forked workers only")
def test_a_dead_worker_is_a_clear_error(tmp_path, folder, monkeypatch):
    from h5pack.write import pipeline

    monkeypatch.setattr(pipeline, "prepare_sample", _crash)
    with pytest.raises(H5PackError, match="worker process died"):
        convert(folder, tmp_path / "p.h5", ConvertOptions(workers=2, mode="encoded"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


@pytest.mark.parametrize("arena", ["small slots", "no shared memory"])
def test_pool_falls_back_to_pipes(tmp_path, monkeypatch, arena):
    """Samples or blocks that do not fit a slot, or no arena at all, travel through pipes."""
    from h5pack.write import packing as writer
    from h5pack.write.arena import Arena

    if arena == "small slots":
        monkeypatch.setattr(writer, "sample_slot_bytes", lambda plan: 1000)
        monkeypatch.setattr(writer, "block_slot_bytes", lambda plan: 600)
    else:
        monkeypatch.setattr(Arena, "maybe", classmethod(lambda cls, n, size: None))
    root = tmp_path / "images"
    make_folder(root, per_class=8, vary=True)
    options = ConvertOptions(
        workers=2, mode="raw", chunk_bytes=500, compression=Compression(codec="gzip")
    )
    report = convert(root, tmp_path / "p.h5", options)
    assert report.num_samples == 16
    with PackReader(report.path) as reader:
        for i, image in enumerate(reader.read_images(range(len(reader)))):
            np.testing.assert_array_equal(image, pil_rgb(root / reader.paths[i]))
