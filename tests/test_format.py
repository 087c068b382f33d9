import os

import h5py
import numpy as np
import pytest

from h5pack.core import format as fmt
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
    assert fmt.decode_path(fmt.encode_path(name)) == name
    assert os.fsencode(fmt.decode_path(fmt.encode_path(name))) == os.fsencode(name)
