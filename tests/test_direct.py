"""read/direct.py: chunk tables and offsets that really point at the bytes, and both paths agree."""

from __future__ import annotations

import os
import pickle
import zlib

import h5py
import hdf5plugin
import numpy as np
import pytest

from h5pack.core.description import HDF5Index
from h5pack.core.layout import FILTER_DEFLATE, Compression
from h5pack.core.source import LocalSource
from h5pack.read import direct as direct_module
from h5pack.read.direct import chunk_table, contiguous_offset, decompressors, read_scratch
from h5pack.read.reader import PackReader, ReaderOptions
from tests.helpers import NUM, SHAPE, arrays, expected, make_pack

CODECS = [
    ("none", "none"),
    ("gzip", "none"),
    ("gzip", "byte"),
    ("lzf", "none"),
    ("lz4", "none"),
    ("zstd", "none"),
    ("zstd", "bit"),
    ("blosc-lz4", "byte"),
    ("blosc-zstd", "none"),
]


@pytest.mark.parametrize(("codec", "shuffle"), CODECS)
def test_direct_and_h5py_paths_give_identical_pixels(tmp_path, codec, shuffle):
    samples = arrays()
    path = make_pack(
        tmp_path / "p.h5",
        samples=samples,
        chunk_samples=8,
        compression=Compression(codec=codec, shuffle=shuffle),
    )
    want = expected(path, samples)
    order = np.random.default_rng(1).permutation(NUM)
    with (
        PackReader(path, ReaderOptions(direct=True, window_chunks=2, threads=2)) as direct,
        PackReader(path, ReaderOptions(direct=False, window_chunks=2)) as fallback,
    ):
        assert not fallback.direct
        filter_id = {"lz4": 32004, "zstd": 32015, "blosc-lz4": 32001, "blosc-zstd": 32001}
        if codec in ("none", "gzip"):
            assert direct.direct
        elif codec == "lzf" or (shuffle == "bit" and codec in ("lz4", "zstd")):
            assert not direct.direct  # lzf and bitshuffle: read through h5py
        else:
            assert direct.direct == (filter_id[codec] in decompressors())
        for reader in (direct, fallback):
            got = reader.read_stored(order)
            for i, image in zip(order, got, strict=True):
                np.testing.assert_array_equal(image, want[i])
            batch = np.empty((len(order), *SHAPE), dtype=np.uint8)
            reader.read_into(order, batch)
            np.testing.assert_array_equal(batch, np.stack([want[i] for i in order]))


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_python_codec_fallbacks_give_identical_pixels(tmp_path, monkeypatch, codec):
    """Without the system's zlib/liblz4/libzstd, the Python packages decompress."""
    samples = arrays()
    path = make_pack(
        tmp_path / "p.h5", samples=samples, chunk_samples=8, compression=Compression(codec=codec)
    )
    for name in ("_zlib_uncompress", "_lz4_decompress_safe", "_zstd_functions"):
        monkeypatch.setattr(direct_module, name, lambda: None)
    filter_id = {"gzip": 1, "lz4": 32004, "zstd": 32015}[codec]
    if filter_id not in decompressors():
        pytest.skip(f"no Python package for {codec}")
    want = expected(path, samples)
    with PackReader(path, ReaderOptions(window_chunks=2, threads=2)) as reader:
        assert reader.direct
        order = np.random.default_rng(2).permutation(NUM)
        for i, image in zip(order, reader.read_stored(order), strict=True):
            np.testing.assert_array_equal(image, want[i])


# -- the pieces, against plain h5py files --------------------------------------------------

ROWS, STEP = 10, 4  # 10 % 4 = 2: the last chunk is partial


def _padded_chunk(data: np.ndarray, chunk: int) -> bytes:
    whole = np.zeros((STEP, *data.shape[1:]), np.uint8)
    rows = data[chunk * STEP : (chunk + 1) * STEP]
    whole[: len(rows)] = rows
    return whole.tobytes()


@pytest.mark.parametrize("shuffle", [False, True])
def test_chunk_table_points_at_deflate_streams_of_each_chunk(tmp_path, shuffle):
    data = np.stack(arrays(ROWS))
    path = tmp_path / "gzip.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "images", data=data, chunks=(STEP, *SHAPE), compression="gzip", shuffle=shuffle
        )
        table = chunk_table(HDF5Index(f, str(path)))
    assert table is not None
    assert table.chunk_nbytes == STEP * int(np.prod(SHAPE))
    assert len(table.offsets) == len(table.sizes) == 3
    assert table.masks.tolist() == [0, 0, 0]
    assert table.codec is not None
    assert table.codec[0] == (1 if shuffle else 0)  # byte shuffle of uint8 is skipped over
    fd = os.open(path, os.O_RDONLY)
    try:
        for c in range(3):
            stored = os.pread(fd, int(table.sizes[c]), int(table.offsets[c]))
            assert len(stored) == table.sizes[c]
            assert zlib.decompress(stored) == _padded_chunk(data, c)
            out = np.empty(table.chunk_nbytes, np.uint8)
            table.decompress_into(c, np.frombuffer(stored, np.uint8), out)
            assert out.tobytes() == _padded_chunk(data, c)
    finally:
        os.close(fd)


def test_chunk_table_marks_unallocated_chunks_and_reads_uncompressed_ones(tmp_path):
    data = np.stack(arrays(ROWS))
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        dataset = f.create_dataset(
            "images", shape=data.shape, dtype=np.uint8, chunks=(STEP, *SHAPE)
        )
        dataset[:STEP] = data[:STEP]
        dataset[2 * STEP :] = data[2 * STEP :]  # chunk 1 never written
        table = chunk_table(HDF5Index(f, str(path)))
    assert table is not None
    assert table.codec is None
    assert table.offsets[1] == -1
    with open(path, "rb") as f:
        for c in (0, 2):
            stored = os.pread(f.fileno(), int(table.sizes[c]), int(table.offsets[c]))
            assert stored == _padded_chunk(data, c)


@pytest.mark.parametrize(
    "create",
    [
        {"chunks": None},  # contiguous
        {"dtype": np.uint16},
        {"chunks": (STEP, 3, 5, 3)},  # a chunk splits a sample
        {"compression": "lzf"},
        dict(hdf5plugin.Bitshuffle(cname="lz4")),
        {"compression": "gzip", "fletcher32": True},  # two filters that change bytes
    ],
    ids=["contiguous", "uint16", "split", "lzf", "bitshuffle", "two-filters"],
)
def test_chunk_table_declines_what_it_cannot_read(tmp_path, create):
    kwargs = {"chunks": (STEP, *SHAPE), "dtype": np.uint8, **create}
    with h5py.File(tmp_path / "p.h5", "w") as f:
        dataset = f.create_dataset("images", shape=(ROWS, *SHAPE), **kwargs)
        dataset[...] = 1
        assert chunk_table(HDF5Index(f, "p.h5")) is None


def test_contiguous_offset_reads_the_exact_bytes(tmp_path):
    data = np.stack(arrays(ROWS))
    path = tmp_path / "contiguous.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=data)
        offset = contiguous_offset(HDF5Index(f, str(path)))
    others = {"chunked": {"data": data, "chunks": True}, "empty": {"shape": (4,), "dtype": "u1"}}
    for name, kwargs in others.items():
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f.create_dataset("images", **kwargs)
            assert contiguous_offset(HDF5Index(f, name)) is None
    assert offset is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, data.nbytes, offset) == data.tobytes()
    finally:
        os.close(fd)
    source = LocalSource(os.fspath(path))
    try:
        out = np.empty(data.nbytes, np.uint8)
        source.read_into(out, offset)
        assert out.tobytes() == data.tobytes()
        one = int(np.prod(SHAPE))
        assert read_scratch(source, one, offset + 3 * one).tobytes() == data[3].tobytes()
        clone = pickle.loads(pickle.dumps(source))  # a copy holds no descriptor
        assert clone._fd is None
    finally:
        source.close()


def test_decompressors_always_have_deflate(monkeypatch):
    assert FILTER_DEFLATE in decompressors()
    for name in ("_zlib_uncompress", "_lz4_decompress_safe", "_zstd_functions"):
        monkeypatch.setattr(direct_module, name, lambda: None)
    monkeypatch.setattr(direct_module, "_available", lambda module: False)
    found = decompressors()
    assert list(found) == [FILTER_DEFLATE]  # Python's own zlib needs nothing
    payload = bytes(range(256)) * 4
    out = np.empty(len(payload), np.uint8)
    found[FILTER_DEFLATE](np.frombuffer(zlib.compress(payload), np.uint8), out)
    assert out.tobytes() == payload


def test_direct_reads_refuse_a_path_that_names_another_file(tmp_path):
    from h5pack.errors import FormatError

    path = tmp_path / "f.bin"
    path.write_bytes(b"first")
    stat = path.stat()
    direct = LocalSource(str(path), inode=(stat.st_dev, stat.st_ino))
    buffer = np.empty(5, dtype=np.uint8)
    direct.read_into(buffer, 0)
    assert buffer.tobytes() == b"first"
    direct.close()
    (tmp_path / "other.bin").write_bytes(b"other")
    (tmp_path / "other.bin").replace(path)
    with pytest.raises(FormatError, match=r"f\.bin was replaced"):
        direct.read_into(buffer, 0)
    clone = pickle.loads(pickle.dumps(direct))
    assert clone.inode == (stat.st_dev, stat.st_ino)
