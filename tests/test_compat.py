"""Packs written by h5pack 0.1.0 (format v1) must read the same forever."""

import numpy as np
import pytest

from h5pack import H5ImageDataset
from h5pack.check import verify_pack
from h5pack.core.format import FORMAT_VERSION, load_meta
from h5pack.read.reader import PackReader
from tests.compat_pack import CLASSES, V1_ARRAY, V1_BLOB, v1_samples, v1_variable_samples


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
