"""A resize at writing moves boxes and masks with the image (``write.fitting``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import h5pack
from h5pack import ConvertOptions, convert, write_arrays
from h5pack.check import verify_pack
from h5pack.core.fields import BoxesField, MaskField
from h5pack.write.sources import sample_source

pytest.importorskip("pycocotools")

COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
# (height, width) of each image; its shapes' boxes (x, y, w, h), one per colour
IMAGES = {
    "wide.png": ((90, 160), [(10, 20, 60, 40), (100, 5, 50, 70), (0, 70, 20, 20)]),
    "tall.png": ((150, 80), [(5, 10, 30, 100), (40, 120, 40, 30), (50, 0, 30, 8)]),
}
RESIZES = [((64, 64), "stretch"), ((64, 64), "crop"), ((48, 96), "crop"), ((64, 64), "pad")]


def _coco(root: Path, rotated: bool = False) -> Path:
    """Solid rectangles on black whose boxes and polygons are their extents."""
    images, anns = [], []
    for k, (name, ((height, width), boxes)) in enumerate(IMAGES.items()):
        pixels = np.zeros((height, width, 3), np.uint8)
        for j, (x, y, w, h) in enumerate(boxes):
            pixels[y : y + h, x : x + w] = COLOURS[j]
            polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": k + 1,
                    "category_id": j + 1,
                    "iscrowd": 0,
                    "bbox": [x, y, w, h],
                    "segmentation": [polygon],
                    "area": w * h,
                }
            )
        image = Image.fromarray(pixels)
        if rotated:  # stored turned; EXIF orientation 6 turns it back when decoded
            exif = Image.Exif()
            exif[0x0112] = 6
            image.transpose(Image.Transpose.ROTATE_90).save(root / name, exif=exif)
        else:
            image.save(root / name)
        images.append({"id": k + 1, "file_name": name, "width": width, "height": height})
    categories = [{"id": j + 1, "name": f"c{j}"} for j in range(len(COLOURS))]
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": categories}))
    return path


def _check_frames(pack: Path) -> int:
    """Assert every stored box frames its colour and each mask is its colour; count boxes."""
    pack_, seen = h5pack.open(pack), 0
    for i in range(len(pack_)):
        sample = pack_[i]
        image, boxes, labels, masks = (sample[k] for k in ("image", "boxes", "labels", "masks"))
        assert masks.shape[1:] == image.shape[:2], sample["key"]
        assert len(boxes) == len(labels) == len(masks) == len(sample["iscrowd"])
        for box, label, mask in zip(boxes, labels, masks, strict=True):
            colour = np.all(np.abs(image.astype(int) - COLOURS[label - 1]) < 60, axis=-1)
            ys, xs = np.nonzero(colour)
            assert ys.size, f"{sample['key']}: no pixel of colour {label}"
            extent = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            np.testing.assert_allclose(box, extent, atol=1.01, err_msg=sample["key"])
            inner = np.zeros_like(colour)  # away from the shape's edges
            x1, y1, x2, y2 = (round(float(v)) for v in box)
            inner[y1 + 1 : y2 - 1, x1 + 1 : x2 - 1] = True
            assert mask[inner].all(), sample["key"]
            assert not mask[~_grown(colour)].any(), sample["key"]
            seen += 1
    return seen


def _grown(colour: np.ndarray) -> np.ndarray:
    """The pixels next to ``colour`` (where a resized edge may fall)."""
    grown = colour.copy()
    grown[1:] |= colour[:-1]
    grown[:-1] |= colour[1:]
    grown[:, 1:] |= grown[:, :-1].copy()
    grown[:, :-1] |= grown[:, 1:].copy()
    return grown


@pytest.mark.parametrize(("size", "resize"), RESIZES)
def test_resized_coco_boxes_frame_their_shapes(tmp_path: Path, size, resize) -> None:
    annotations = _coco(tmp_path)
    pack = tmp_path / "out.h5"
    options = ConvertOptions(mode="raw", size=size, resize=resize)
    convert(sample_source(tmp_path, annotations=annotations), pack, options=options)
    kept = _check_frames(pack)
    if resize == "crop" and size == (64, 64):  # the centre crop cuts shapes off both images
        assert kept < sum(len(b) for _, b in IMAGES.values())
    report = verify_pack(pack, source=sample_source(tmp_path, annotations=annotations))
    assert report.ok, report.problems


def test_exif_rotated_images_keep_their_boxes(tmp_path: Path) -> None:
    """Annotations are in the displayed frame: the EXIF-oriented image h5pack stores."""
    annotations = _coco(tmp_path, rotated=True)
    pack = tmp_path / "out.h5"
    options = ConvertOptions(mode="raw", size=(64, 64), resize="pad")
    convert(sample_source(tmp_path, annotations=annotations), pack, options=options)
    assert _check_frames(pack) == 6


def test_arrays_drop_boxes_cut_off_with_their_rows(tmp_path: Path) -> None:
    image = np.zeros((40, 100, 3), np.uint8)
    image[10:30, 40:60] = 255
    boxes = np.array([[40, 10, 60, 30], [0, 0, 10, 40], [95, 5, 100, 20]], np.float32)
    pack = tmp_path / "a.h5"
    write_arrays(
        pack,
        [image],
        [0],
        options=ConvertOptions(size=(20, 20), resize="crop"),
        fields={BoxesField("boxes"): [boxes], "names": [np.array([7, 8, 9], np.int64)]},
    )
    got = h5pack.open(pack)[0]
    np.testing.assert_allclose(got["boxes"], [[5, 5, 15, 15]])  # scale 0.5, 15 px cut left
    assert got["names"].tolist() == [7]


@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
def test_semantic_masks_follow_the_image(tmp_path: Path, resize: str) -> None:
    image = np.zeros((60, 120, 3), np.uint8)
    image[10:50, 30:90] = 255
    mask = (image[:, :, 0] // 255).astype(np.uint8) * 7
    pack = tmp_path / "m.h5"
    options = ConvertOptions(size=(30, 40), resize=resize)  # type: ignore[arg-type]
    write_arrays(pack, [image], [0], options=options, fields={MaskField("mask"): [mask]})
    got = h5pack.open(pack)[0]
    shape = got["image"][:, :, 0] > 127
    assert got["mask"].shape == shape.shape
    edges = _grown(shape) & _grown(~shape)  # pixels on either side of the shape's edge
    assert np.array_equal((got["mask"] == 7)[~edges], shape[~edges])
    assert set(np.unique(got["mask"]).tolist()) == {0, 7}


def test_verify_finds_a_moved_box_after_a_resize(tmp_path: Path) -> None:
    annotations = _coco(tmp_path)
    pack = tmp_path / "out.h5"
    options = ConvertOptions(mode="raw", size=(64, 64), resize="pad")
    convert(sample_source(tmp_path, annotations=annotations), pack, options=options)
    coco = json.loads(annotations.read_text())
    coco["annotations"][0]["bbox"][0] += 4  # 4 px in wide.png: 1.6 px once stored
    annotations.write_text(json.dumps(coco))
    report = verify_pack(pack, source=sample_source(tmp_path, annotations=annotations))
    assert [(p.path, p.message) for p in report.problems] == [
        ("wide.png", "changed: field 'boxes' differs from the source's by up to 1.6")
    ]
