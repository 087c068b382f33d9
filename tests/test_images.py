"""write/blocks.py, write/images.py: samples in whole chunks, aligned blobs, a small blob."""

import h5py
import numpy as np
import pytest

from h5pack.core.layout import Compression
from h5pack.read.reader import PackReader
from h5pack.write import blocks as blocks_module
from h5pack.write.blocks import ArrayAssembler, BlobAssembler, aligned_offsets
from h5pack.write.convert import write_arrays
from h5pack.write.images import ImagesSpec, ImagesWriter
from h5pack.write.options import ConvertOptions
from tests.helpers import assert_aligned, jpeg, random_arrays


def test_variable_sizes_make_an_aligned_raw_blob(tmp_path):
    rng = np.random.default_rng(1)
    samples = [rng.integers(0, 256, (5 + i, 7, 3), dtype=np.uint8) for i in range(9)]
    options = ConvertOptions(chunk_bytes=300, shuffle_samples=False)
    report = write_arrays(tmp_path / "p.h5", samples, [-1] * 9, options=options)
    with PackReader(report.path) as reader:
        meta, images = reader.meta, reader.read_images(range(len(reader)))
    assert (meta.mode, meta.storage) == ("raw", "blob")
    assert meta.blob_chunk_bytes == 300 == meta.chunks[0]
    for i, image in enumerate(images):
        np.testing.assert_array_equal(image, samples[i])
    assert meta.shapes.tolist() == [list(s.shape) for s in samples]
    assert_aligned(meta.offsets, meta.sizes, 300)


def test_sample_larger_than_a_chunk_owns_whole_chunks():
    assembler = BlobAssembler(10, capacity=2)  # grows past its first guess
    blocks = []
    for size in (4, 25, 3, 8, 10):
        blocks.extend(assembler.add(np.full(size, size, np.uint8)))
    blocks.extend(assembler.finish())
    offsets = assembler.final_offsets()
    assert offsets.tolist() == [0, 10, 40, 50, 60, 70]
    assert [b.start for b in blocks] == [0, 10, 40, 50, 60]
    data = np.zeros(offsets[-1], np.uint8)
    for block in blocks:
        data[block.start : block.start + len(block.data)] = block.data
    for start, size in zip(offsets[:-1], assembler.sizes, strict=True):
        assert np.all(data[start : start + size] == size)


def test_small_blob_gets_one_chunk_of_its_size(tmp_path):
    files = [jpeg(a) for a in random_arrays(3, (12, 9 + 3, 3))]
    files += [jpeg(random_arrays(1, (9, 9, 3))[0])]
    options = ConvertOptions(layout="chunked")
    report = write_arrays(tmp_path / "p.h5", files, [0, 0, 0, 0], options=options)
    assert report.meta.chunks == (int(report.meta.offsets[-1]),)
    assert report.meta.blob_chunk_bytes == report.meta.chunks[0]


def test_blob_blocks_are_whole_padded_chunks_but_the_last():
    assembler = BlobAssembler(8)
    blocks = []
    for size in (3, 4, 2, 8, 1):  # 3+4 fill 7 of 8; 2 starts chunk 1; 8 fills chunk 2
        blocks.extend(assembler.add(np.full(size, size, np.uint8)))
    blocks.extend(assembler.finish())
    assert [(b.start, len(b.data)) for b in blocks] == [(0, 8), (8, 8), (16, 8), (24, 1)]
    assert blocks[0].data.tolist() == [3, 3, 3, 4, 4, 4, 4, 0]  # zero padding after 4
    assert assembler.final_offsets().tolist() == [0, 3, 8, 16, 24, 25]
    assert assembler.sizes.tolist() == [3, 4, 2, 8, 1]


def test_array_blocks_start_on_chunk_boundaries_at_n_mod_k():
    """N % k = 0, 1, k - 1 for k = 4: full blocks of k, then one partial block."""
    for num in (8, 9, 11):
        samples = [np.full((2, 3, 1), i, np.uint8) for i in range(num)]
        assembler = ArrayAssembler((2, 3, 1), 4)
        blocks = [b for s in samples for b in assembler.add(s)]
        blocks.extend(assembler.finish())
        assert [b.start for b in blocks] == list(range(0, num, 4))
        assert [len(b.data) for b in blocks] == [min(4, num - s) for s in range(0, num, 4)]
        stacked = np.concatenate([b.data for b in blocks])
        np.testing.assert_array_equal(stacked, np.stack(samples))
        assert assembler.count == num


@pytest.mark.parametrize("chunk_bytes", [0, 1, 7, 10, 64])
def test_aligned_offsets_is_the_assemblers_rule(chunk_bytes):
    sizes = np.random.default_rng(chunk_bytes).integers(0, 40, 200)
    assembler = BlobAssembler(chunk_bytes)
    for size in sizes:
        list(assembler.add(np.zeros(size, np.uint8)))
    list(assembler.finish())
    np.testing.assert_array_equal(aligned_offsets(sizes, chunk_bytes), assembler.final_offsets())


@pytest.mark.parametrize("reuse", [False, True])
def test_unaligned_blob_packs_samples_back_to_back(monkeypatch, reuse):
    """chunk_bytes=0 (contiguous): no padding, blocks of a fixed size, samples straddle."""
    monkeypatch.setattr(blocks_module, "UNALIGNED_BLOCK_BYTES", 8)
    assembler = BlobAssembler(0, capacity=1, reuse=reuse)
    sizes = (3, 4, 2, 20, 1, 8, 0, 5)
    data = np.zeros(sum(sizes), np.uint8)
    written = []
    for i, size in enumerate(sizes):
        for block in assembler.add(np.full(size, i + 1, np.uint8)):
            data[block.start : block.start + len(block.data)] = block.data  # before the next add
            written.append((block.start, len(block.data)))
    for block in assembler.finish():
        data[block.start : block.start + len(block.data)] = block.data
        written.append((block.start, len(block.data)))
    assert assembler.final_offsets().tolist() == [0, 3, 7, 9, 29, 30, 38, 38, 43]
    assert [start for start, _ in written] == list(range(0, 43, 8))  # consecutive blocks
    assert all(size == 8 for _, size in written[:-1])
    for i, (start, size) in enumerate(zip(assembler.final_offsets()[:-1], sizes, strict=True)):
        assert np.all(data[start : start + size] == i + 1)


def _write_blob(path, spec, samples, *, staging=True):
    assembler = BlobAssembler(0, reuse=True)
    with h5py.File(path, "w") as handle:
        writer = ImagesWriter(handle, "images", spec, staging=path.with_suffix(".stage"))
        for sample in samples:
            for block in assembler.add(sample):
                writer.write_block(block)
        for block in assembler.finish():
            writer.write_block(block)
        writer.finish()
        stored = handle["images"][()]
        layout = handle["images"].id.get_create_plist().get_layout()
    assert not path.with_suffix(".stage").exists()
    assert layout == h5py.h5d.CONTIGUOUS
    return stored, assembler.final_offsets()


@pytest.mark.parametrize(
    ("known", "expected_length"),
    [
        (None, 60),  # unknown length: staged, then copied in
        (60, 60),  # known: written in place
        (75, 75),  # a skipped file's bytes stay unused at the end
        (41, 60),  # the data outgrew it: moved to the staging file, then copied in
    ],
)
def test_contiguous_blob_written_in_place_or_staged(tmp_path, monkeypatch, known, expected_length):
    monkeypatch.setattr(blocks_module, "UNALIGNED_BLOCK_BYTES", 16)
    samples = [np.full(n, i + 1, np.uint8) for i, n in enumerate((5, 30, 1, 24))]
    spec = ImagesSpec("blob", None, None, blob_bytes=known)
    stored, offsets = _write_blob(tmp_path / "p.h5", spec, samples)
    assert len(stored) == expected_length
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(stored[offsets[i] : offsets[i + 1]], sample)


def test_raw_photos_of_mixed_sizes_carry_almost_no_padding(tmp_path):
    """Issue 10: raw photos lost 31% to alignment padding in 8 MiB chunks."""
    rng = np.random.default_rng(5)
    sides = [(700, 1100), (90, 130), (640, 480), (1024, 768), (300, 451)] * 2
    photos = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sides]
    data_bytes = sum(p.nbytes for p in photos)
    padding = {}
    for name, options in {
        "default": ConvertOptions(mode="raw"),  # contiguous
        "8 MiB": ConvertOptions(mode="raw", chunk_bytes=8 * 2**20),  # the byte target
        "chunked": ConvertOptions(mode="raw", layout="chunked"),  # chosen from the sizes
        "lz4": ConvertOptions(mode="raw", compression=Compression(codec="lz4")),
    }.items():
        path = tmp_path / "p.h5"
        report = write_arrays(path, photos, [0] * 10, options=options, overwrite=True)
        with h5py.File(path, "r") as handle:
            padding[name] = (handle["images"].id.get_storage_size() - data_bytes) / data_bytes
        with PackReader(path) as reader:
            assert report.meta.offsets is not None
            order = report.meta.source_index
            for i in range(len(reader)):
                np.testing.assert_array_equal(reader.read_images([i])[0], photos[order[i]])
    assert padding["default"] == 0
    assert padding["8 MiB"] > 0.3  # the rest of each 8 MiB chunk after a photo
    assert padding["chunked"] < 0.05  # 64 KiB chunks: half of one wasted per photo
