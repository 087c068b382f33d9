"""Fields in the loader: dict batches, subsets, masks cut with their images."""

import numpy as np
import pytest
import torch

from h5pack.core.fields import MaskField
from h5pack.errors import OptionsError
from h5pack.training.loader import make_loader
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import interior, png, random_arrays

SHAPE_COLOUR = (200, 30, 60)
BACKGROUND = (10, 120, 220)


def _pack(path, num=10):
    images = random_arrays(num)
    rng = np.random.default_rng(5)
    fields = {
        "weight": np.arange(num, dtype=np.float32) / 2,
        "boxes": [rng.random((i % 3, 4)).astype(np.float32) for i in range(num)],
        "caption": [f"caption {i}" for i in range(num)],
        MaskField("mask"): [(image[:, :, 0] > 128).astype(np.uint8) for image in images],
    }
    paths = [f"s{i}" for i in range(num)]
    options = ConvertOptions(chunk_samples=4)
    write_arrays(path, images, [i % 2 for i in range(num)], paths=paths, options=options,
                 fields=fields)  # fmt: skip
    return images, fields


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pack_of_fields_gives_dict_batches(tmp_path, workers):
    images, fields = _pack(tmp_path / "p.h5")
    loader = make_loader(tmp_path / "p.h5", 4, num_workers=workers, return_path=True, seed=1)
    seen = 0
    for batch in loader:
        assert list(batch) == ["image", "label", "key", "weight", "boxes", "caption", "mask"]
        assert batch["image"].shape[1:] == (3, 8, 10)
        assert batch["weight"].dtype == torch.float32
        assert batch["mask"].shape == (len(batch["key"]), 8, 10)
        for j, key in enumerate(batch["key"]):
            i = int(key[1:])
            image = batch["image"][j].permute(1, 2, 0).numpy()
            np.testing.assert_array_equal(image, images[i])
            assert int(batch["label"][j]) == i % 2
            assert float(batch["weight"][j]) == i / 2
            np.testing.assert_array_equal(batch["boxes"][j].numpy(), fields["boxes"][i])
            assert batch["caption"][j] == f"caption {i}"
            mask = fields[next(k for k in fields if isinstance(k, MaskField))][i]
            np.testing.assert_array_equal(batch["mask"][j].numpy(), mask)
            seen += 1
    assert seen == 10


def test_fields_picks_a_subset_and_names_an_unknown_one(tmp_path):
    _pack(tmp_path / "p.h5")
    (batch, *_) = make_loader(tmp_path / "p.h5", 5, num_workers=0, fields=["weight", "image"])
    assert list(batch) == ["weight", "image"]
    with pytest.raises(OptionsError, match=r"fields should name some of .*'boxes'.*\['nope'\]"):
        make_loader(tmp_path / "p.h5", 5, num_workers=0, fields=["nope"])


def test_image_label_packs_keep_their_tuple_unless_fields_are_asked(tmp_path):
    write_arrays(tmp_path / "p.h5", random_arrays(6), [0, 1] * 3)
    images, labels = next(iter(make_loader(tmp_path / "p.h5", 3, num_workers=0)))
    assert images.shape == (3, 3, 8, 10)
    batch = next(iter(make_loader(tmp_path / "p.h5", 3, num_workers=0, fields=["label"])))
    assert list(batch) == ["label"]
    assert torch.equal(batch["label"], labels)


def _shapes(num, size=(48, 64)):
    """Images with a solid disc in SHAPE_COLOUR on BACKGROUND, and the disc as a mask."""
    rng = np.random.default_rng(7)
    images, masks = [], []
    rows, cols = np.mgrid[: size[0], : size[1]]
    for _ in range(num):
        cy, cx = rng.integers(12, size[0] - 12), rng.integers(16, size[1] - 16)
        disc = (rows - cy) ** 2 + ((cols - cx) / 1.5) ** 2 < rng.integers(64, 144)
        image = np.empty((*size, 3), np.uint8)
        image[:] = BACKGROUND
        image[disc] = SHAPE_COLOUR
        images.append(image)
        masks.append(disc.astype(np.uint8) * 3)
    return images, masks


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("encoded", [False, True])
def test_a_mask_cropped_with_its_image_stays_aligned(tmp_path, workers, encoded):
    images, masks = _shapes(12)
    samples = [png(image) for image in images] if encoded else images
    options = ConvertOptions(mode="encoded" if encoded else "raw")
    write_arrays(tmp_path / "p.h5", samples, [0] * 12, options=options,
                 fields={MaskField("mask"): masks})  # fmt: skip
    loader = make_loader(tmp_path / "p.h5", 4, num_workers=workers, size=(24, 32),
                         crop="random-resized", flip=True, seed=3)  # fmt: skip
    with_disc = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            for image, mask in zip(batch["image"], batch["mask"], strict=True):
                pixels, mask = image.permute(1, 2, 0).numpy().astype(int), mask.numpy()
                assert set(np.unique(mask).tolist()) <= {0, 3}
                inside = interior(mask)
                for value, colour in ((3, SHAPE_COLOUR), (0, BACKGROUND)):
                    where = inside & (mask == value)
                    assert np.abs(pixels[where] - colour).max(initial=0) <= 12
                with_disc += int(mask.any())
    assert with_disc > 0  # some crops hold part of the disc


def _weighted(path, first, num=6):
    images = random_arrays(num, seed=first)
    paths = [f"{first + i}" for i in range(num)]
    weights = np.arange(first, first + num, dtype=np.float32)
    masks = [np.full((8, 10), (first + i) % 7, np.uint8) for i in range(num)]
    write_arrays(path, images, [0] * num, paths=paths, options=ConvertOptions(chunk_samples=4),
                 fields={"weight": weights, MaskField("mask"): masks})  # fmt: skip
    return path


def _check_weighted(batches):
    seen = []
    for batch in batches:
        for key, weight, mask in zip(batch["key"], batch["weight"], batch["mask"], strict=True):
            assert float(weight) == int(key)
            assert set(np.unique(mask.numpy()).tolist()) == {int(key) % 7}
            seen.append(int(key))
    return sorted(seen)


def test_a_pack_set_and_a_mix_deliver_their_fields(tmp_path):
    a, b = _weighted(tmp_path / "a.h5", 0), _weighted(tmp_path / "b.h5", 100)
    as_set = make_loader([a, b], 4, num_workers=0, return_path=True, size=6)
    assert _check_weighted(as_set) == [*range(6), *range(100, 106)]
    mixed = make_loader([a, b], 4, weights=[1, 1], num_workers=0, return_path=True, size=6)
    assert len(_check_weighted(mixed)) == 12


def test_fields_without_the_image_read_no_image(tmp_path):
    from h5pack.core.layout import Compression

    images = random_arrays(8)
    options = ConvertOptions(chunk_samples=4, compression=Compression(codec="gzip"))
    write_arrays(tmp_path / "p.h5", images, [1] * 8, options=options,
                 fields={"weight": np.ones(8)})  # fmt: skip
    loader = make_loader(tmp_path / "p.h5", 4, num_workers=0, fields=["label", "weight"])
    batches = list(loader)
    assert [list(b) for b in batches] == [["label", "weight"]] * 2
    assert torch.equal(batches[0]["label"], torch.ones(4, dtype=torch.int64))
    assert loader.dataset.reader.loads == 0  # no chunk of images decompressed
    with_image = make_loader(tmp_path / "p.h5", 4, num_workers=0, fields=["image"])
    assert next(iter(with_image))["image"].shape == (4, 3, 8, 10)
