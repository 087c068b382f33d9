import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5pack.core.layout import (
    CODECS,
    DEFAULT_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    PLUGIN_FILTERS,
    ChunkMap,
    Compression,
    array_chunk_shape,
    cache_settings,
    chunk_samples_for,
    next_prime,
)
from h5pack.errors import OptionsError


@pytest.mark.parametrize(
    ("num_samples", "chunk_samples", "expected"),
    [
        (8, 4, [0, 4, 8]),  # N % k == 0
        (9, 4, [0, 4, 8, 9]),  # N % k == 1
        (11, 4, [0, 4, 8, 11]),  # N % k == k - 1
        (3, 4, [0, 3]),  # fewer samples than a chunk
        (0, 4, [0]),
    ],
)
def test_regular_chunk_map_boundaries(num_samples, chunk_samples, expected):
    cmap = ChunkMap.regular(num_samples, chunk_samples)
    assert cmap.starts.tolist() == expected
    assert cmap.num_samples == num_samples
    covered = [i for c in range(cmap.num_chunks) for i in cmap.samples(c)]
    assert covered == list(range(num_samples))


@given(st.integers(0, 500), st.integers(1, 64))
def test_chunk_of_agrees_with_samples(num_samples, chunk_samples):
    cmap = ChunkMap.regular(num_samples, chunk_samples)
    for c in range(cmap.num_chunks):
        for i in cmap.samples(c):
            assert cmap.chunk_of(i) == c == i // chunk_samples
    assert cmap.chunks_of(np.arange(num_samples)).tolist() == [
        i // chunk_samples for i in range(num_samples)
    ]


def test_blob_chunk_map_groups_by_first_chunk():
    # slots: [0,10) [10,20) [20,100) | [100,110) [110,200) | [200,260)
    offsets = np.array([0, 10, 20, 100, 110, 200, 260])
    cmap = ChunkMap.for_blob(offsets, 100)
    assert cmap.starts.tolist() == [0, 3, 5, 6]
    assert ChunkMap.for_blob(np.array([0]), 100).num_chunks == 0


def test_blob_chunk_map_sample_larger_than_chunk_owns_its_chunks():
    # sample 1 occupies chunks 1..3; sample 2 starts in chunk 4
    offsets = np.array([0, 100, 400, 450])
    cmap = ChunkMap.for_blob(offsets, 100)
    assert [list(cmap.samples(c)) for c in range(cmap.num_chunks)] == [[0], [1], [2]]


def test_array_chunk_shape_requests():
    assert array_chunk_shape((4, 5, 3), chunk_samples=7) == (7, 4, 5, 3)
    assert array_chunk_shape((4, 5, 3), chunk_shape=(2, 4, 5, 1)) == (2, 4, 5, 1)
    assert array_chunk_shape((4, 5, 3), chunk_bytes=600) == (10, 4, 5, 3)
    default = array_chunk_shape((256, 256, 3))
    assert default[0] == DEFAULT_CHUNK_BYTES // (256 * 256 * 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_samples": 0}, "chunk_samples should be positive"),
        ({"chunk_samples": -3}, "chunk_samples should be positive"),
        ({"chunk_shape": (2, 4, 5)}, "should have 4 dimensions"),
        ({"chunk_shape": (2, 0, 5, 3)}, "should be positive"),
        ({"chunk_shape": (2, 8, 5, 3)}, "larger than one sample"),
        ({"chunk_bytes": -1}, "should be positive"),
    ],
)
def test_array_chunk_shape_refuses_impossible(kwargs, message):
    with pytest.raises(OptionsError, match=message):
        array_chunk_shape((4, 5, 3), **kwargs)


def test_chunk_over_4_gib_refused_with_advice():
    with pytest.raises(OptionsError, match="4 GiB"):
        array_chunk_shape((4096, 4096, 3), chunk_samples=100)
    assert MAX_CHUNK_BYTES == 2**32 - 1


def test_chunk_samples_for_at_least_one():
    assert chunk_samples_for(10**9, 10) == 1
    assert chunk_samples_for(100, 1000) == 10


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_builds_h5py_arguments(codec, tmp_path):
    import h5py

    compression = Compression(codec=codec)
    data = np.random.default_rng(0).integers(0, 255, (4, 8, 8, 3), dtype=np.uint8)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        ds = f.create_dataset("x", data=data, chunks=(2, 8, 8, 3), **compression.h5py_kwargs())
        assert (ds[()] == data).all()
        plist = ds.id.get_create_plist()
        assert bool(plist.get_nfilters()) == (codec != "none")
        filters = {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}
    plugin = codec in {"lz4", "zstd", "blosc-lz4", "blosc-zstd"}
    assert bool(filters & set(PLUGIN_FILTERS)) == plugin  # info names hdf5plugin's filters


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"codec": "brotli"}, "compression should be one of"),
        ({"codec": "gzip", "level": 10}, "level for gzip should be in 0..9"),
        ({"codec": "lzf", "level": 3}, "--level applies to"),
        ({"codec": "none", "shuffle": "byte"}, "shuffle needs a compression codec"),
        ({"codec": "gzip", "shuffle": "bit"}, "bit shuffle applies to"),
        ({"codec": "zstd", "shuffle": "nibble"}, "shuffle should be one of"),
    ],
)
def test_compression_refuses_impossible(kwargs, message):
    with pytest.raises(OptionsError, match=message):
        Compression(**kwargs)


def test_compression_describe():
    assert Compression(codec="zstd", shuffle="bit").describe() == "zstd level 3, bit shuffle"
    assert Compression().describe() == "none"


def test_cache_settings_off_for_uncompressed_and_window_sized_otherwise():
    assert cache_settings(compressed=False, window_chunks=8, chunk_bytes=10**6)["rdcc_nbytes"] == 0
    settings = cache_settings(compressed=True, window_chunks=8, chunk_bytes=10**6)
    assert settings["rdcc_nbytes"] >= 8 * 10**6
    assert settings["rdcc_nslots"] >= 800
    assert settings["rdcc_nslots"] == next_prime(800)


def test_next_prime():
    assert [next_prime(n) for n in (0, 2, 4, 100, 7919)] == [2, 2, 5, 101, 7919]
