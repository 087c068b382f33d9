"""write/plan.py: mode, array or blob, chunks and the reason given, from options and sizes."""

from collections import Counter

import numpy as np
import pytest

from h5pack.core.layout import DEFAULT_CHUNK_BYTES, Compression
from h5pack.errors import OptionsError
from h5pack.write.blocks import aligned_offsets
from h5pack.write.options import ConvertOptions
from h5pack.write.plan import (
    BLOB_SLOT_BYTES,
    MIN_BLOB_CHUNK_BYTES,
    PADDING_TARGET,
    batch_size,
    blob_chunk_bytes,
    block_slot_bytes,
    even_chunk_samples,
    plan_storage,
    resolved_layout,
    sample_slot_bytes,
)

ONE_SIZE = Counter({(6, 5): 100})  # 90 bytes a sample
TWO_SIZES = Counter({(6, 5): 60, (8, 4): 30, (2, 2): 10})


def test_one_common_size_is_a_raw_array_chunked_from_the_byte_target():
    plan = plan_storage(ConvertOptions(chunk_bytes=900), ONE_SIZE, num_samples=100)
    assert (plan.mode, plan.storage) == ("raw", "array")
    assert plan.spec.sample_shape == (6, 5, 3)
    assert plan.spec.chunks == (10, 6, 5, 3)  # 900 // 90
    assert plan.group_samples == 10
    assert plan.chunk_bytes == 0
    assert plan.decode.mode == "raw"
    assert plan.decode.fixed_shape == (6, 5, 3)
    assert not plan.decode.flat
    assert plan.reason == "auto mode chose raw pixels: all 100 images are 5x6"  # W x H
    raw = plan_storage(ConvertOptions(mode="raw", chunk_bytes=900), ONE_SIZE, num_samples=100)
    assert raw.spec == plan.spec
    assert raw.reason == "raw mode: all 100 images are 5x6"


def test_the_default_byte_target_sizes_the_chunk():
    plan = plan_storage(ConvertOptions(), Counter({(64, 64): 10**6}), num_samples=10**6)
    assert plan.spec.chunks == (DEFAULT_CHUNK_BYTES // (64 * 64 * 3), 64, 64, 3)
    assert plan.spec.compression == Compression()


@pytest.mark.parametrize("num_samples", [1, 7, 99])
def test_the_automatic_chunk_never_holds_more_than_the_pack(num_samples):
    sizes = Counter({(6, 5): num_samples})
    plan = plan_storage(ConvertOptions(), sizes, num_samples=num_samples)
    assert plan.spec.chunks == (num_samples, 6, 5, 3)
    assert plan.group_samples == num_samples
    by_bytes = plan_storage(ConvertOptions(chunk_bytes=10**6), sizes, num_samples=num_samples)
    assert by_bytes.spec.chunks[0] == num_samples
    # An explicit chunk is what was asked for, even if larger than the pack.
    explicit = plan_storage(ConvertOptions(chunk_samples=200), sizes, num_samples=num_samples)
    assert explicit.spec.chunks == (200, 6, 5, 3)


def test_several_sizes_in_auto_mode_are_encoded_and_the_reason_names_them():
    options = ConvertOptions(chunk_bytes=5000, compression=Compression(codec="zstd"))
    plan = plan_storage(options, TWO_SIZES, num_samples=100)
    assert (plan.mode, plan.storage) == ("encoded", "blob")
    assert plan.spec.sample_shape is None
    assert plan.spec.chunks == (5000,)
    assert plan.spec.compression == Compression(codec="zstd")
    assert plan.chunk_bytes == 5000
    assert plan.group_samples == 0
    assert (plan.decode.mode, plan.decode.flat) == ("encoded", True)
    assert plan.reason == (
        "auto mode chose encoded (original file bytes): the images come in 3 sizes "
        "(e.g. 5x6, 4x8); pass --size N (or H,W) to store raw pixels"
    )


def test_encoded_mode_says_so_and_names_max_side():
    options = ConvertOptions(mode="encoded", max_side=30, layout="chunked")
    plan = plan_storage(options, None, num_samples=5)
    assert (plan.mode, plan.storage) == ("encoded", "blob")
    assert plan.spec.chunks == (DEFAULT_CHUNK_BYTES,)
    assert plan.reason == (
        "encoded mode: the files' bytes are stored as they are; "
        "files over 30 px are re-encoded to JPEG"
    )
    assert (plan.decode.max_side, plan.decode.quality) == (30, 90)
    # Re-encoded files have sizes of their own: a contiguous blob is staged, not sized.
    sizes = np.full(5, 1000)
    options = ConvertOptions(mode="encoded", max_side=30)
    auto = plan_storage(options, None, num_samples=5, sample_bytes=lambda n: sizes)
    assert (auto.spec.chunks, auto.spec.blob_bytes) == (None, None)


@pytest.mark.parametrize(
    ("options", "can_encode", "prefix"),
    [
        (ConvertOptions(mode="raw", chunk_bytes=700), True, "raw mode"),
        (ConvertOptions(chunk_bytes=700), False, "auto mode chose raw pixels"),  # arrays
    ],
)
def test_several_sizes_as_raw_pixels_make_a_blob(options, can_encode, prefix):
    plan = plan_storage(options, TWO_SIZES, num_samples=100, can_encode=can_encode)
    assert (plan.mode, plan.storage) == ("raw", "blob")
    assert plan.spec.chunks == (700,)
    assert plan.chunk_bytes == 700
    assert (plan.decode.mode, plan.decode.flat, plan.decode.fixed_shape) == ("raw", True, None)
    assert plan.reason == (
        f"{prefix}: the images come in 3 sizes, so pixels are stored at their original "
        "sizes (a byte blob with shapes); pass --size N (or H,W) for one size"
    )


@pytest.mark.parametrize("mode", ["auto", "raw"])
def test_size_given_is_a_raw_array_at_that_size(mode):
    options = ConvertOptions(mode=mode, size=(7, 9), channels=1, chunk_samples=4)
    plan = plan_storage(options, None, num_samples=50)
    assert (plan.mode, plan.storage) == ("raw", "array")
    assert plan.spec.sample_shape == (7, 9, 1)
    assert plan.spec.chunks == (4, 7, 9, 1)
    assert (plan.decode.size, plan.decode.fixed_shape) == ((7, 9), (7, 9, 1))
    assert plan.reason.endswith(": every image is resized to 9x7")  # --size H,W, shown W x H


@pytest.mark.parametrize("mode", ["auto", "raw"])
@pytest.mark.parametrize(
    "chunking", [{"chunk_samples": 4}, {"chunk_shape": (4, 6, 5, 3)}], ids=["samples", "shape"]
)
def test_chunk_samples_for_several_sizes_is_refused_naming_the_flag(mode, chunking):
    options = ConvertOptions(mode=mode, **chunking)
    with pytest.raises(OptionsError, match=r"--chunk-samples/--chunk-shape do not apply") as info:
        plan_storage(options, TWO_SIZES, num_samples=100)
    assert "--chunk-bytes" in str(info.value)
    assert "--size N (or H,W)" in str(info.value)


def test_contiguous_layout_has_no_chunks():
    array = plan_storage(ConvertOptions(layout="contiguous"), ONE_SIZE, num_samples=100)
    assert (array.storage, array.spec.chunks) == ("array", None)
    assert array.group_samples == DEFAULT_CHUNK_BYTES // 90  # only batches the work
    options = ConvertOptions(layout="contiguous", mode="raw")
    blob = plan_storage(options, TWO_SIZES, num_samples=100)
    assert (blob.storage, blob.spec.chunks) == ("blob", None)
    assert blob.chunk_bytes == 0  # samples back to back: no chunks to align to
    assert blob.spec.blob_bytes == 3 * (60 * 30 + 30 * 32 + 10 * 4)  # known from the headers
    encoded = plan_storage(ConvertOptions(layout="contiguous"), TWO_SIZES, num_samples=100)
    assert (encoded.mode, encoded.spec.chunks) == ("encoded", None)


def test_slots_hold_a_batch_of_samples_and_a_block_of_stored_chunks():
    array = plan_storage(ConvertOptions(chunk_samples=40), ONE_SIZE, num_samples=100)
    assert batch_size(array) == 20
    assert sample_slot_bytes(array) == 20 * 90
    assert block_slot_bytes(array) >= 40 * 90 * 9 // 8  # room for chunks that grew
    small = plan_storage(ConvertOptions(chunk_samples=1), ONE_SIZE, num_samples=100)
    assert batch_size(small) == 1
    encoded = plan_storage(ConvertOptions(chunk_bytes=2**20), TWO_SIZES, num_samples=100)
    assert batch_size(encoded) == 16
    assert sample_slot_bytes(encoded) == BLOB_SLOT_BYTES
    assert block_slot_bytes(encoded) >= 2**20
    raw_blob = plan_storage(ConvertOptions(mode="raw"), TWO_SIZES, num_samples=100)
    assert batch_size(raw_blob) == 4


# --- padding (NOTE [ Padding ]) ------------------------------------------------------------

MIB = 2**20


@pytest.mark.parametrize(
    ("options", "storage", "layout"),
    [
        (ConvertOptions(), "blob", "contiguous"),  # uncompressed blob: no chunks, no padding
        (ConvertOptions(), "array", "chunked"),
        (ConvertOptions(compression=Compression(codec="lz4")), "blob", "chunked"),
        (ConvertOptions(chunk_bytes=MIB), "blob", "chunked"),  # chunks were asked for
        (ConvertOptions(layout="chunked"), "blob", "chunked"),
        (ConvertOptions(layout="contiguous"), "array", "contiguous"),
    ],
)
def test_auto_layout(options, storage, layout):
    assert resolved_layout(options, storage) == layout


def test_an_uncompressed_blob_is_contiguous_and_sized_from_the_samples():
    calls = []

    def sample_bytes(limit):
        calls.append(limit)
        return np.arange(1, 101)

    options = ConvertOptions(mode="encoded")
    plan = plan_storage(options, None, num_samples=100, sample_bytes=sample_bytes)
    assert (plan.spec.chunks, plan.chunk_bytes) == (None, 0)
    assert plan.spec.blob_bytes == 5050
    assert calls == [None]  # every sample, for the exact length
    assert plan.reason.endswith("; uncompressed, so stored contiguous, with no padding")


def test_small_samples_keep_the_byte_target():
    jpegs = np.random.default_rng(0).integers(20_000, 50_000, 2000)  # ~35 kB files
    assert blob_chunk_bytes(jpegs, target=8 * MIB) == 8 * MIB


@pytest.mark.parametrize("whole_last_chunk", [False, True])
def test_large_samples_get_chunks_that_waste_little_of_their_last_one(whole_last_chunk):
    # The shared photo folder's raw sizes: mixed photos up to 2560x1600.
    sides = [(1600, 2560), (512, 512), (300, 451), (400, 600), (1200, 1920), (683, 1024)] * 3
    sizes = np.asarray([h * w * 3 for h, w in sides])
    chunk = blob_chunk_bytes(sizes, target=8 * MIB, whole_last_chunk=whole_last_chunk)
    assert MIN_BLOB_CHUNK_BYTES <= chunk < 8 * MIB
    end = int(aligned_offsets(sizes, chunk)[-1])
    stored = -(-end // chunk) * chunk if whole_last_chunk else end
    assert (stored - sizes.sum()) / stored <= PADDING_TARGET
    # The byte target wasted a quarter: each photo's last 8 MiB chunk was mostly empty.
    at_target = int(aligned_offsets(sizes, 8 * MIB)[-1])
    assert (at_target - sizes.sum()) / at_target > 0.2


def test_a_chunked_blob_chooses_its_chunk_from_the_sample_sizes():
    photos = Counter({(1600, 2560): 10, (512, 512): 7})
    compressed = ConvertOptions(mode="raw", compression=Compression(codec="zstd"))
    plan = plan_storage(compressed, photos, num_samples=17)
    assert plan.spec.chunks == (plan.chunk_bytes,)
    assert MIN_BLOB_CHUNK_BYTES <= plan.chunk_bytes < DEFAULT_CHUNK_BYTES
    # An explicit chunk size is exact.
    exact = ConvertOptions(mode="raw", compression=Compression(codec="zstd"), chunk_bytes=MIB)
    assert plan_storage(exact, photos, num_samples=17).chunk_bytes == MIB
    # Encoded: from the files' sizes, a random subset of them.
    asked = []

    def sample_bytes(limit):
        asked.append(limit)
        return np.full(min(limit, 10**6), 30_000)

    options = ConvertOptions(mode="encoded", compression=Compression(codec="lz4"))
    plan = plan_storage(options, None, num_samples=10**6, sample_bytes=sample_bytes)
    assert plan.chunk_bytes == DEFAULT_CHUNK_BYTES
    assert asked == [4096]


@pytest.mark.parametrize(
    ("num", "most", "expected"),
    [
        (2000, 55, 50),  # 224x224: 55 per chunk wasted 35 rows; 50 divides 2000
        (50, 42, 25),  # a small pack: 42 + 8 wasted 34 rows of the last chunk
        (7, 7, 7),
        (84, 42, 42),  # N % k = 0
        (1, 1, 1),
    ],
)
def test_even_chunk_samples(num, most, expected):
    assert even_chunk_samples(num, most) == expected


@pytest.mark.parametrize("num", [43, 84, 85, 125, 997, 10**5 + 1])
def test_even_chunk_samples_waste_little_and_stay_in_range(num):
    k = even_chunk_samples(num, 42)
    assert 21 <= k <= 42

    def waste(j):
        return -(-num // j) * j - num

    assert waste(k) <= max(num * PADDING_TARGET / 2, min(waste(j) for j in range(21, 43)))


def test_uncompressed_arrays_fill_their_last_chunk():
    sizes = Counter({(224, 224): 2000})
    plan = plan_storage(ConvertOptions(), sizes, num_samples=2000)
    assert plan.spec.chunks == (50, 224, 224, 3)
    # Compressed, the last chunk's empty rows compress away: the byte target stands.
    lz4 = ConvertOptions(compression=Compression(codec="lz4"))
    assert plan_storage(lz4, sizes, num_samples=2000).spec.chunks[0] == 55
