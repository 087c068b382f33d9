import os
from dataclasses import replace as dataclass_replace

import h5py
import numpy as np
import pytest

from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.errors import FormatError, H5PackError, PackNotFoundError


def test_missing_pack_is_file_not_found_and_names_path(tmp_path):
    path = tmp_path / "nope.h5"
    with pytest.raises(PackNotFoundError, match=r"nope\.h5") as info:
        fmt.load_meta(path)
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, H5PackError)


def test_directory_is_not_a_pack(tmp_path):
    with pytest.raises(FormatError, match="is a directory"):
        fmt.load_meta(tmp_path)


def test_text_file_is_not_hdf5(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("hello")
    with pytest.raises(FormatError, match="not a readable HDF5 file"):
        fmt.load_meta(path)


def test_plain_hdf5_is_not_a_pack(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(FormatError, match="not an h5pack pack"):
        fmt.load_meta(path)


def test_newer_format_version_refused(tmp_path):
    path = tmp_path / "future.h5"
    with h5py.File(path, "w") as f:
        f.attrs[fmt.FORMAT_MARKER_KEY] = fmt.FORMAT_MARKER
        f.attrs[fmt.FORMAT_VERSION_KEY] = fmt.FORMAT_VERSION + 1
    with pytest.raises(FormatError, match=f"format version {fmt.FORMAT_VERSION + 1}.*upgrade"):
        fmt.load_meta(path)


def test_missing_dataset_named(tmp_path):
    path = tmp_path / "broken.h5"
    with h5py.File(path, "w") as f:
        f.attrs[fmt.FORMAT_MARKER_KEY] = fmt.FORMAT_MARKER
        f.attrs[fmt.FORMAT_VERSION_KEY] = fmt.FORMAT_VERSION
        f.attrs[fmt.MODE_KEY] = "raw"
        f.attrs[fmt.STORAGE_KEY] = "array"
        f.attrs[fmt.NUM_SAMPLES_KEY] = 1
        f.create_dataset(fmt.IMAGES, data=np.zeros((1, 2, 2, 3), np.uint8))
    with pytest.raises(FormatError, match="dataset 'classes' is missing"):
        fmt.load_meta(path)


@pytest.mark.parametrize("name", ["cat/a.jpg", "ünï/çødé.png", os.fsdecode(b"bad\xffname.jpg")])
def test_paths_round_trip_including_non_utf8(name):
    stored = np.frombuffer(os.fsencode(name), dtype=np.uint8)  # as the writer stores it
    assert fmt.decode_path(stored) == name
    assert os.fsencode(fmt.decode_path(stored)) == os.fsencode(name)


# -- format 1.1: identity, digests, no variable-length data ----------------------------------


def _new_pack(path, *, paths=None, classes=("a", "bé", "c"), **options):
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    rng = np.random.default_rng(0)
    samples = [rng.integers(0, 256, (4 + i % 3, 5, 3), dtype=np.uint8) for i in range(12)]
    paths = paths or [f"c/{i}.png" for i in range(12)]
    write_arrays(
        path,
        samples,
        [i % 3 for i in range(12)],
        classes=classes,
        paths=paths,
        options=ConvertOptions(**options),
    )
    return path


def test_a_new_pack_is_format_1_1_with_an_id_and_every_digest(tmp_path):
    path = _new_pack(tmp_path / "p.h5", chunk_bytes=512)
    meta = fmt.load_meta(path)
    assert (meta.format_version, meta.format_minor) == (1, fmt.FORMAT_MINOR) == (1, 1)
    assert meta.pack_id is not None
    assert len(meta.pack_id) == 32
    # sample_xxh3 is written when the writer has the xxhash package
    with_xxh3 = {fmt.SAMPLE_XXH3} if integrity.has_sample_digest() else set()
    assert set(meta.digests) == with_xxh3 | {
        fmt.LABELS,
        fmt.CLASSES,
        fmt.PATHS,
        fmt.SHAPES,
        fmt.CHECKSUMS,
        fmt.SOURCE_INDEX,
        fmt.OFFSETS,
        fmt.SIZES,
        fmt.OPTIONS_KEY,
        fmt.SKIPPED_KEY,
        fmt.FIELDS_KEY,
    }
    assert meta.damaged == ()
    assert (meta.sample_xxh3 is not None) == bool(with_xxh3)
    with fmt.open_h5(path) as handle:
        assert fmt.read_paths(handle, meta) == [f"c/{int(s)}.png" for s in meta.source_index]
    identity = meta.identity
    assert identity is not None
    stat = os.stat(path)
    found = (identity.device, identity.inode, identity.size)
    assert found == (stat.st_dev, stat.st_ino, stat.st_size)


def test_a_new_pack_holds_no_variable_length_data_and_checksummed_metadata(tmp_path):
    path = _new_pack(tmp_path / "p.h5")
    data = path.read_bytes()
    assert data[8] >= 2  # superblock version 2 or 3: checksummed
    assert b"GCOL" not in data  # no global heap (HDF5 neither checksums nor bounds it)
    with h5py.File(path, "r") as handle:
        root = h5py.h5g.open(handle.id, b"/")
        assert root.get_create_plist().get_attr_phase_change()[0] >= len(handle.attrs)
        for key in handle.attrs:
            assert not h5py.check_string_dtype(handle.attrs.get_id(key).dtype) or (
                h5py.check_string_dtype(handle.attrs.get_id(key).dtype).length is not None
            )
        for name in (fmt.CLASSES, fmt.PATHS):
            assert h5py.check_string_dtype(handle[name].dtype).length is not None


@pytest.mark.parametrize(
    "name", ["ünï/çødé.png", os.fsdecode(b"bad\xffname.jpg"), "a/" + "x" * 300]
)
def test_fixed_length_paths_round_trip(tmp_path, name):
    paths = [name] + [f"c/{i}.png" for i in range(11)]
    path = _new_pack(tmp_path / "p.h5", paths=paths, shuffle_samples=False)
    meta = fmt.load_meta(path)
    with fmt.open_h5(path) as handle:
        assert os.fsencode(fmt.read_paths(handle, meta)[0]) == os.fsencode(name)
    assert meta.classes == ("a", "bé", "c")


def test_damaged_digests_are_named_or_recorded(tmp_path):
    path = _new_pack(tmp_path / "p.h5")
    with h5py.File(path, "r+") as handle:
        handle[fmt.SOURCE_INDEX][0] = 99
    with pytest.raises(FormatError, match=r"'source_index' no longer match the CRC32"):
        fmt.load_meta(path)
    assert fmt.load_meta(path, check_digests=False).damaged == (fmt.SOURCE_INDEX,)


def test_digests_are_over_a_canonical_byte_form():
    assert integrity.array_digest(np.arange(3, dtype=">i8"), "<i8") == integrity.array_digest(
        np.arange(3, dtype=np.int32), "<i8"
    )
    assert integrity.strings_digest([b"ab", b"c"]) != integrity.strings_digest([b"a", b"bc"])
    assert fmt.classes_digest(("x",)) == integrity.strings_digest([b"x"])


def test_identity_changes_name_what_changed(tmp_path):
    from h5pack.core.integrity import PackIdentity

    first = PackIdentity("a" * 32, 1, 2, 300, 4)
    assert first.changes(first) == []
    other = PackIdentity("b" * 32, 1, 5, 200, 6)
    assert first.changes(other) == [
        f"pack id {'a' * 32} then, {'b' * 32} now",
        "file 1:2 then, 1:5 now",
        "300 bytes then, 200 now",
        "modified since",
    ]
    fmt.check_identity("p.h5", None, other)
    with pytest.raises(FormatError, match=r"p\.h5 was replaced since the dataset was created"):
        fmt.check_identity("p.h5", first, other)


def test_truncated_pack_is_explained_in_plain_words(tmp_path):
    path = _new_pack(tmp_path / "p.h5")
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(FormatError, match="shorter than its header says: it was cut off"):
        fmt.load_meta(path)


# -- the record's two halves (issue 16.2) -------------------------------------------------


def test_format_docstring_examples() -> None:
    import doctest

    assert doctest.testmod(fmt).failed == 0


def test_sample_arrays_are_the_ones_every_half_reads_and_writes(tmp_path) -> None:
    from dataclasses import fields

    from h5pack.core.format import SAMPLE_ARRAYS, PackMeta, load_meta
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    attributes = {f.name for f in fields(PackMeta)}
    assert all(spec.attribute in attributes for spec in SAMPLE_ARRAYS)
    assert set(fmt.DIGESTED_ARRAYS) == {spec.name for spec in SAMPLE_ARRAYS}
    sizes = [np.zeros((3 + i, 4, 3), np.uint8) for i in range(5)]
    blob = write_arrays(tmp_path / "blob.h5", sizes, [0] * 5, options=ConvertOptions()).path
    same = [np.zeros((3, 4, 3), np.uint8)] * 5
    array = write_arrays(tmp_path / "array.h5", same, [0] * 5, options=ConvertOptions()).path
    for path, storage in ((blob, "blob"), (array, "array")):
        meta = load_meta(path)
        assert meta.storage == storage
        held = meta.sample_arrays()
        with h5py.File(path, "r") as handle:
            on_disk = {spec.name for spec in SAMPLE_ARRAYS if spec.name in handle}
            assert set(held) == on_disk  # what is written is what is read, and no more
            for name, array_read in held.items():
                np.testing.assert_array_equal(handle[name][()], array_read)


def test_write_record_refuses_what_the_format_does_not_hold(tmp_path) -> None:
    from h5pack.core.record import PackRecord, write_record

    record = PackRecord(
        mode="raw",
        storage="array",
        channels=3,
        classes=("a",),
        paths=["x.png"],
        arrays={"labels": np.zeros(1, np.int64)},
        texts={},
        blob_chunk_bytes=0,
        tool_version="test",
    )
    with h5py.File(tmp_path / "a.h5", "w") as handle, pytest.raises(FormatError, match="shapes"):
        write_record(handle, record)
    odd = dataclass_replace(record, arrays={"labels": np.zeros(1), "colour": np.zeros(1)})
    with h5py.File(tmp_path / "b.h5", "w") as handle, pytest.raises(FormatError, match="colour"):
        write_record(handle, odd)


def test_blob_slots_are_a_blob_packs_and_no_other(tmp_path) -> None:
    from h5pack.core.format import load_meta
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    sizes = [np.zeros((3 + i, 4, 3), np.uint8) for i in range(3)]
    blob = load_meta(write_arrays(tmp_path / "b.h5", sizes, [0] * 3, options=ConvertOptions()).path)
    offsets, slot_sizes = blob.blob_slots()
    assert sorted(slot_sizes.tolist()) == [36, 48, 60]  # each sample's bytes, in write order
    assert offsets.shape == (4,)
    same = [np.zeros((3, 4, 3), np.uint8)] * 3
    array = load_meta(write_arrays(tmp_path / "a.h5", same, [0] * 3, options=ConvertOptions()).path)
    with pytest.raises(FormatError, match="array storage locates no sample by byte offsets"):
        array.blob_slots()
