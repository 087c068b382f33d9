"""write/images.py: samples laid into whole chunks, aligned blobs, a small blob's one chunk."""

import numpy as np

from h5pack.read.reader import PackReader
from h5pack.write.convert import write_arrays
from h5pack.write.images import ArrayAssembler, BlobAssembler
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
    report = write_arrays(tmp_path / "p.h5", files, [0, 0, 0, 0])
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
