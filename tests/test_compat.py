"""Packs written by h5pack 0.1.0 (format 1.0; 1.1 and a 1.1 set) must read the same forever."""

import numpy as np
import pytest

from h5pack import H5ImageDataset
from h5pack.check import verify_pack
from h5pack.core.format import FORMAT_VERSION, load_meta
from h5pack.read.reader import PackReader
from tests.compat_pack import (
    CLASSES,
    V1_ARRAY,
    V1_BLOB,
    V11_ARRAY,
    V11_ENCODED,
    V11_SET,
    v1_samples,
    v1_variable_samples,
    v11_samples,
)


@pytest.mark.parametrize(
    ("pack", "expected_images", "num_labels"),
    [
        (V1_ARRAY, v1_samples()[0], 7),
        (V1_BLOB, v1_variable_samples(), 5),
    ],
)
def test_frozen_v1_pack_reads_the_same(pack, expected_images, num_labels):
    _, labels, paths = v1_samples()
    meta = load_meta(pack)
    assert meta.format_version == 1 <= FORMAT_VERSION
    assert meta.classes == CLASSES
    assert sorted(meta.source_index.tolist()) == list(range(num_labels))
    with PackReader(pack) as reader:
        got = reader.read_images(np.arange(meta.num_samples))
        for i, image in enumerate(got):
            source = int(meta.source_index[i])
            np.testing.assert_array_equal(image, expected_images[source])
            assert reader.paths[i] == paths[source]
            assert meta.labels[i] == labels[source]
    dataset = H5ImageDataset(pack, output="hwc")
    image, label = dataset[0]
    np.testing.assert_array_equal(image, expected_images[int(meta.source_index[0])])
    assert label == labels[int(meta.source_index[0])]
    assert verify_pack(pack).ok


# -- format 1.1, frozen (issue 16.5): a change to writer and reader together shows here ------


@pytest.mark.parametrize(
    ("pack", "storage", "mode"),
    [(V11_ARRAY, "array", "raw"), (V11_ENCODED, "blob", "encoded")],
)
def test_frozen_v1_1_pack_reads_the_same(pack, storage, mode):
    images, labels, paths = v11_samples()
    if storage == "array":
        images = [a[:5] for a in images]
    meta = load_meta(pack)
    assert (meta.format_version, meta.format_minor) == (1, 1)
    assert (meta.storage, meta.mode) == (storage, mode)
    assert meta.classes == CLASSES
    assert meta.pack_id is not None
    assert meta.sample_xxh3 is not None  # every sample checked at memory speed
    assert sorted(meta.source_index.tolist()) == list(range(len(images)))
    with PackReader(pack) as reader:
        got = reader.read_images(np.arange(meta.num_samples))
        for i, image in enumerate(got):
            source = int(meta.source_index[i])
            np.testing.assert_array_equal(image, images[source])
            assert reader.paths[i] == paths[source]
            assert meta.labels[i] == labels[source]
    report = verify_pack(pack)
    assert report.ok
    assert report.num_verified == len(images)


def test_frozen_v1_1_set_reads_the_same():
    from h5pack import verify_packset
    from h5pack.read.packset import describe
    from h5pack.read.setreader import open_reader

    images, labels, paths = v11_samples()
    view = describe(V11_SET)
    assert view.num_shards == 2
    meta = view.meta
    assert meta.num_samples == len(images)
    assert meta.classes == CLASSES
    where = {p: i for i, p in enumerate(paths)}
    with open_reader(V11_SET) as reader:
        got = reader.read_images(np.arange(meta.num_samples))
        for i, image in enumerate(got):
            source = where[reader.paths[i]]
            np.testing.assert_array_equal(image, images[source])
            assert meta.labels[i] == labels[source]
    dataset = H5ImageDataset(V11_SET, output="hwc")
    assert sorted(where[p] for p in dataset.reader.paths) == list(range(len(images)))
    assert verify_packset(V11_SET).ok
