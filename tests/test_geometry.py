"""One geometry: boxes, instance masks and a semantic mask follow their image's crop and flip.

The images hold solid shapes of distinct colours whose boxes, instance masks and semantic
mask are exactly the shapes (issue 27's consistency test).
"""

import numpy as np
import pytest
import torch

from h5pack import BoxesField, InstanceMasksField, MaskField
from h5pack.core.fields import fields_of
from h5pack.core.format import load_meta
from h5pack.core.spatialfields import grid, pack_masks, unpack_masks
from h5pack.errors import OptionsError
from h5pack.read.crop import CropSpec
from h5pack.training.loader import make_loader
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import interior, png

COLOURS = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
           (145, 30, 180), (70, 240, 240), (240, 50, 230)]  # fmt: skip
BACKGROUND = (128, 128, 128)
SIZE = (96, 128)


def _scenes(num, seed=0):
    """Images of solid rectangles and ellipses, each in its own cell: fields exactly them."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[: SIZE[0], : SIZE[1]]
    images, boxes, masks, classes, crowd, semantic = [], [], [], [], [], []
    for i in range(num):
        image = np.empty((*SIZE, 3), np.uint8)
        image[:] = BACKGROUND
        cells = rng.permutation(8)[: 1 + i % 6]  # a 2 x 4 grid of 48 x 32 cells
        shapes, colours = [], []
        for cell in cells:
            top, left = 48 * (cell // 4), 32 * (cell % 4)
            h, w = rng.integers(12, 40), rng.integers(10, 28)
            y, x = top + rng.integers(2, 46 - h), left + rng.integers(2, 30 - w)
            if cell % 2:
                dy, dx = (rows - y - h / 2) / (h / 2), (cols - x - w / 2) / (w / 2)
                shape = dy**2 + dx**2 < 1
            else:
                shape = (rows >= y) & (rows < y + h) & (cols >= x) & (cols < x + w)
            image[shape] = COLOURS[cell]
            shapes.append(shape)
            colours.append(int(cell))
        extents = [(np.flatnonzero(s.any(axis=0)), np.flatnonzero(s.any(axis=1))) for s in shapes]
        boxes.append(np.array([[c[0], r[0], c[-1] + 1, r[-1] + 1] for c, r in extents], np.float32))
        masks.append(np.stack(shapes).astype(np.uint8))
        classes.append(np.array(colours, np.int64))
        crowd.append(np.array([c % 2 for c in colours], np.uint8))
        semantic.append(_semantic(shapes, colours))
        images.append(image)
    fields = {
        BoxesField("boxes"): boxes,
        "category": classes,
        "iscrowd": crowd,
        InstanceMasksField("masks"): masks,
        MaskField("mask"): semantic,
    }
    return images, fields


def _semantic(shapes, colours):
    """A class per colour (its index + 1), 0 the background, 255 a 1-pixel border around each."""
    mask = np.zeros(SIZE, np.uint8)
    for shape, colour in zip(shapes, colours, strict=True):
        grown = shape.copy()
        grown[1:] |= shape[:-1]
        grown[:-1] |= shape[1:]
        grown[:, 1:] |= grown[:, :-1].copy()
        grown[:, :-1] |= grown[:, 1:].copy()
        mask[grown & ~shape] = 255
        mask[shape] = colour + 1
    return mask


def _is(pixels, colour):
    return np.abs(pixels - np.array(colour)).max(axis=2) <= 40


def _check_sample(pixels, boxes, category, iscrowd, masks, mask):
    """Each box frames its shape's colour; each mask agrees with the colour inside."""
    assert len(boxes) == len(category) == len(iscrowd) == len(masks)
    for box, cls, crowd, instance in zip(boxes, category, iscrowd, masks, strict=True):
        cls, colour = int(cls), COLOURS[int(cls)]
        assert int(crowd) == cls % 2  # the rows stayed together
        x1, y1, x2, y2 = box.tolist()
        assert min(x2 - x1, y2 - y1) >= 1  # no box left without area
        shown = _is(pixels, colour)
        rows, cols = np.flatnonzero(shown.any(axis=1)), np.flatnonzero(shown.any(axis=0))
        assert rows.size, f"box {box.tolist()} of colour {cls} frames nothing"
        extent = np.array([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1])
        if cls % 2 == 0:  # a rectangle, cut, is the rectangle of its box
            np.testing.assert_allclose([x1, y1, x2, y2], extent, atol=1.5)
        else:  # an ellipse, cut, lies in its box (clipped, it may not touch every side)
            assert (extent[:2] >= np.array([x1, y1]) - 1.5).all()
            assert (extent[2:] <= np.array([x2, y2]) + 1.5).all()
        inside = interior(instance)
        assert shown[inside & (instance == 1)].all()
        assert not shown[inside & (instance == 0)].any()
    for value in np.unique(mask).tolist():
        where = interior(mask) & (mask == value)
        if value == 0:
            assert _is(pixels, BACKGROUND)[where].all()
        elif value != 255:
            assert _is(pixels, COLOURS[value - 1])[where].all()
    for j in range(len(COLOURS)):  # a colour left in the crop kept its box
        if (interior(mask) & (mask == j + 1)).sum() > 4:
            assert j in [int(c) for c in category]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("crop", ["random-resized", "center", "resize"])
def test_boxes_and_masks_stay_on_their_shapes_after_crop_and_flip(tmp_path, workers, crop):
    images, fields = _scenes(16)
    options = ConvertOptions(mode="encoded", chunk_bytes=20_000)
    write_arrays(tmp_path / "p.h5", [png(i) for i in images], [0] * 16, options=options,
                 fields=fields)  # fmt: skip
    pipeline = CropSpec.of((56, 72), crop=crop, flip=True, scale=(0.2, 1.0))
    loader = make_loader(tmp_path / "p.h5", 4, num_workers=workers, pipeline=pipeline, seed=2)
    seen = 0
    for epoch in range(3 if crop == "random-resized" else 1):
        loader.set_epoch(epoch)
        for batch in loader:
            assert batch["mask"].shape == (len(batch["boxes"]), 56, 72)
            for j in range(len(batch["boxes"])):
                pixels = batch["image"][j].permute(1, 2, 0).numpy().astype(int)
                values = [batch[n][j].numpy() for n in ("boxes", "category", "iscrowd", "masks")]
                _check_sample(pixels, *values, batch["mask"][j].numpy())
                assert values[3].shape[1:] == (56, 72)
                seen += 1
    assert seen == 16 * (3 if crop == "random-resized" else 1)


def test_a_box_cropped_out_is_dropped_with_its_label_and_mask(tmp_path):
    image = np.empty((*SIZE, 3), np.uint8)
    image[:] = BACKGROUND
    image[10:30, 10:20] = COLOURS[0]  # left: cut away by a center crop to 40 wide
    image[40:60, 60:70] = COLOURS[1]  # centre: kept
    shapes = np.zeros((2, *SIZE), np.uint8)
    shapes[0, 10:30, 10:20] = shapes[1, 40:60, 60:70] = 1
    fields = {
        BoxesField("boxes"): [np.array([[10, 10, 20, 30], [60, 40, 70, 60]], np.float32)],
        "category": [np.array([0, 1])],
        InstanceMasksField("masks"): [shapes],
    }
    write_arrays(tmp_path / "p.h5", [image], [0], fields=fields)
    batch = next(iter(make_loader(tmp_path / "p.h5", 1, num_workers=0, size=(96, 40),
                                  crop="center")))  # fmt: skip
    np.testing.assert_array_equal(batch["boxes"][0].numpy(), [[16, 40, 26, 60]])
    assert batch["category"][0].tolist() == [1]
    assert batch["masks"][0].shape == (1, 96, 40)
    assert batch["masks"][0][0, 40:60, 16:26].all()
    assert batch["masks"][0].sum() == 200
    padded = next(iter(make_loader(tmp_path / "p.h5", 1, num_workers=0, size=(96, 40),
                                   crop="center", collate="padded")))  # fmt: skip
    assert padded["boxes"].shape == (1, 1, 4)
    assert padded["boxes_lengths"].tolist() == [1]


def test_per_box_fields_are_found_when_written_and_checked_when_named(tmp_path):
    images, fields = _scenes(6)
    write_arrays(tmp_path / "p.h5", images, [0] * 6, fields=fields)
    (boxes,) = [f for f in fields_of(load_meta(tmp_path / "p.h5")) if f.name == "boxes"]
    assert boxes.per_box == ("category", "iscrowd", "masks")
    wrong = {BoxesField("b", per_box=("n",)): [np.zeros((1, 4))] * 2, "n": [[1], [1, 2]]}
    with pytest.raises(OptionsError, match=r"field 'n' of sample 1 holds 2 rows, but its 1"):
        write_arrays(tmp_path / "q.h5", images[:2], [0, 0], fields=wrong)


def test_padded_batches_pad_with_zeros_and_say_each_length(tmp_path):
    images, fields = _scenes(6)
    write_arrays(tmp_path / "p.h5", images, [0] * 6, fields=fields)
    loader = make_loader(tmp_path / "p.h5", 6, num_workers=0, collate="padded", return_path=True)
    batch = next(iter(loader))
    order = [int(key.rsplit("-", 1)[1]) for key in batch["key"]]
    lengths = batch["boxes_lengths"].tolist()
    assert lengths == [i + 1 for i in order] == batch["masks_lengths"].tolist()
    assert batch["boxes"].shape == (6, 6, 4)
    assert batch["masks"].shape == (6, 6, *SIZE)
    assert batch["category"].shape == (6, 6)
    assert batch["category"].dtype == torch.int64
    boxes, _, _, masks, _ = fields.values()
    for j, (i, n) in enumerate(zip(order, lengths, strict=True)):
        np.testing.assert_array_equal(batch["boxes"][j, :n].numpy(), boxes[i])
        assert not batch["boxes"][j, n:].any()
        assert not batch["masks"][j, n:].any()
        np.testing.assert_array_equal(batch["masks"][j, :n].numpy(), masks[i])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_gets_each_samples_dict_after_the_crop(tmp_path, workers):
    images, fields = _scenes(8)
    write_arrays(tmp_path / "p.h5", images, [3] * 8, fields=fields)
    loader = make_loader(tmp_path / "p.h5", 4, num_workers=workers, size=48, flip=True,
                         transform=_count_boxes)  # fmt: skip
    batches = list(loader)
    for batch in batches:
        assert sorted(batch) == ["boxes", "category", "count", "image", "label", "masks"]
        assert batch["image"].shape == (4, 3, 48, 48)
        assert batch["label"].tolist() == [3] * 4
        assert batch["count"].tolist() == [len(b) for b in batch["boxes"]]
    plain = make_loader(tmp_path / "p.h5", 4, num_workers=0, size=48, transform=lambda d: 0)
    assert next(iter(plain)) == [0, 0, 0, 0]  # what a transform returns, as it is


def _count_boxes(sample):
    """A transform as users write one: checks what it gets, returns a new dict."""
    assert isinstance(sample, dict)
    assert isinstance(sample["label"], int)
    assert sample["image"].shape == (3, 48, 48)
    assert sample["image"].dtype == torch.uint8
    boxes, masks = sample["boxes"], sample["masks"]
    assert boxes.dtype == torch.float32
    assert boxes.shape[1:] == (4,)
    assert masks.shape == (len(boxes), 48, 48)
    assert sample["mask"].shape == (48, 48)
    keep = {k: sample[k] for k in ("image", "label", "boxes", "category", "masks")}
    return {**keep, "count": len(boxes)}


def test_instance_masks_unpack_and_cut_as_the_nearest_pixel_rule():
    rng = np.random.default_rng(3)
    masks = (rng.random((4, 37, 53)) > 0.6).astype(np.uint8)
    masks[1] = 0
    masks[2] = 0
    masks[2, 5:9, 40:52] = 1
    blob = pack_masks(masks)
    np.testing.assert_array_equal(unpack_masks(blob, (37, 53)), masks)
    field = InstanceMasksField("m")
    for box, size, flip in [((0, 0, 37, 53), (11, 70), False), ((5, 9, 20, 13), (64, 7), True)]:
        rows, cols = grid(box, size, flip)
        expected = masks[:, rows][:, :, cols]
        np.testing.assert_array_equal(field.transform(blob, box, flip, size), expected)


def test_a_workers_masks_and_boxes_cross_as_one_buffer_each(tmp_path):
    images, fields = _scenes(16)
    write_arrays(tmp_path / "p.h5", images, [0] * 16, fields=fields)
    loader = make_loader(tmp_path / "p.h5", 8, num_workers=2, size=40, flip=True, seed=5)
    for batch in loader:
        for name in ("masks", "boxes", "category"):  # one shared file or array, not 8
            assert len({t.untyped_storage().data_ptr() for t in batch[name]}) == 1, name
        assert all(
            m.shape == (len(b), 40, 40) for m, b in zip(batch["masks"], batch["boxes"], strict=True)
        )
