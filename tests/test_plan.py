"""write/plan.py: mode, array or blob, chunks and the reason given, from options and sizes."""

from collections import Counter

import pytest

from h5pack.core.layout import DEFAULT_CHUNK_BYTES, Compression
from h5pack.errors import OptionsError
from h5pack.write.options import ConvertOptions
from h5pack.write.plan import (
    BLOB_SLOT_BYTES,
    batch_size,
    block_slot_bytes,
    plan_storage,
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
    assert plan.reason == "auto mode chose raw pixels: all 100 images are 6x5"
    raw = plan_storage(ConvertOptions(mode="raw", chunk_bytes=900), ONE_SIZE, num_samples=100)
    assert raw.spec == plan.spec
    assert raw.reason == "raw mode: all 100 images are 6x5"


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
        "(e.g. 6x5, 8x4); pass --size H W to store raw pixels"
    )


def test_encoded_mode_says_so_and_names_max_side():
    options = ConvertOptions(mode="encoded", max_side=30)
    plan = plan_storage(options, None, num_samples=5)
    assert (plan.mode, plan.storage) == ("encoded", "blob")
    assert plan.spec.chunks == (DEFAULT_CHUNK_BYTES,)
    assert plan.reason == (
        "encoded mode: the files' bytes are stored as they are; "
        "files over 30 px are re-encoded to JPEG"
    )
    assert (plan.decode.max_side, plan.decode.quality) == (30, 90)


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
        "sizes (a byte blob with shapes); pass --size H W for one size"
    )


@pytest.mark.parametrize("mode", ["auto", "raw"])
def test_size_given_is_a_raw_array_at_that_size(mode):
    options = ConvertOptions(mode=mode, size=(7, 9), channels=1, chunk_samples=4)
    plan = plan_storage(options, None, num_samples=50)
    assert (plan.mode, plan.storage) == ("raw", "array")
    assert plan.spec.sample_shape == (7, 9, 1)
    assert plan.spec.chunks == (4, 7, 9, 1)
    assert (plan.decode.size, plan.decode.fixed_shape) == ((7, 9), (7, 9, 1))
    assert plan.reason.endswith(": every image is resized to 7x9")


@pytest.mark.parametrize("mode", ["auto", "raw"])
@pytest.mark.parametrize(
    "chunking", [{"chunk_samples": 4}, {"chunk_shape": (4, 6, 5, 3)}], ids=["samples", "shape"]
)
def test_chunk_samples_for_several_sizes_is_refused_naming_the_flag(mode, chunking):
    options = ConvertOptions(mode=mode, **chunking)
    with pytest.raises(OptionsError, match=r"--chunk-samples/--chunk-shape do not apply") as info:
        plan_storage(options, TWO_SIZES, num_samples=100)
    assert "--chunk-bytes" in str(info.value)
    assert "--size H W" in str(info.value)


def test_contiguous_layout_has_no_chunks():
    array = plan_storage(ConvertOptions(layout="contiguous"), ONE_SIZE, num_samples=100)
    assert (array.storage, array.spec.chunks) == ("array", None)
    assert array.group_samples == DEFAULT_CHUNK_BYTES // 90  # only batches the work
    options = ConvertOptions(layout="contiguous", mode="raw")
    blob = plan_storage(options, TWO_SIZES, num_samples=100)
    assert (blob.storage, blob.spec.chunks) == ("blob", None)
    assert blob.chunk_bytes == DEFAULT_CHUNK_BYTES
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
