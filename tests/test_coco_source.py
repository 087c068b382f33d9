"""COCO instances: boxes, categories, iscrowd and masks equal the source (pycocotools)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import h5pack
from h5pack import ConvertOptions, PackReader, convert, convert_set, make_loader, merge_packs
from h5pack.check import pack_info, verify_pack
from h5pack.cli.main import cli
from h5pack.core import format as fmt
from h5pack.core.fields import CategoryField, InstanceMasksField, fields_of
from h5pack.errors import DecodeError
from h5pack.write.sources import CocoSource, sample_source
from h5pack.write.sources.coco import rle_counts
from tests.helpers import shared_photos

pycocotools = pytest.importorskip("pycocotools")
from pycocotools import mask as coco_mask  # noqa: E402
from pycocotools.coco import COCO  # noqa: E402

CATEGORIES = [(1, "person"), (3, "car"), (18, "dog"), (90, "toothbrush")]
FIELDS = ["boxes", "labels", "iscrowd", "masks", "image_id"]


def _photo(name: str, size: tuple[int, int]) -> np.ndarray:
    photos = shared_photos()
    if not (photos / name).is_file():
        pytest.skip(f"no shared photo {name}")
    with Image.open(photos / name) as image:
        return np.asarray(image.convert("RGB").resize(size, Image.Resampling.BILINEAR))


def _ann_to_mask(reference: COCO, ann: dict) -> np.ndarray:
    """The reference: pycocotools' own decoding (whose decode warns under NumPy 2)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return reference.annToMask(ann)


def _rle_string(mask: np.ndarray) -> dict:
    """A compressed RLE as COCO writes it: counts as a str."""
    rle = coco_mask.encode(np.asfortranarray(mask))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _rle_list(mask: np.ndarray) -> dict:
    """An uncompressed RLE as instances_*.json holds crowds: counts as a list."""
    flat = mask.T.reshape(-1)  # column-major
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0, *counts]
    return {"size": list(mask.shape), "counts": counts}


def make_coco(root: Path) -> tuple[Path, Path]:
    """Write an image folder and a COCO instances file as COCO lays them out."""
    images = root / "images"
    (images / "extra").mkdir(parents=True)
    Image.fromarray(_photo("chelsea.png", (160, 120))).save(images / "000000000139.jpg", quality=92)
    Image.fromarray(_photo("coffee.png", (128, 96))).save(images / "000000000285.jpg", quality=92)
    Image.fromarray(_photo("Dune.jpg", (96, 64))).save(images / "000000000632.png")
    synthetic = np.zeros((50, 70, 3), np.uint8)
    synthetic[10:30, 20:60] = (255, 0, 0)
    Image.fromarray(synthetic).save(images / "extra" / "shapes.png")
    crowd = np.zeros((120, 160), np.uint8)
    crowd[60:100, 5:70] = 1
    crowd[70:80, 100:150] = 1
    blob = np.zeros((96, 128), np.uint8)
    blob[40:90, 60:120] = 1
    annotations = [
        {"id": 3, "image_id": 139, "category_id": 18, "iscrowd": 0, "area": 900.0,
         "bbox": [20.25, 10.5, 50.33, 40.0],
         "segmentation": [[20.25, 10.5, 70.58, 10.5, 70.58, 50.5, 20.25, 50.5]]},
        {"id": 17, "image_id": 139, "category_id": 1, "iscrowd": 0, "area": 300.0,
         "bbox": [90.1, 5.2, 60.0, 45.7],
         "segmentation": [[90.1, 5.2, 130.4, 20.9, 100.3, 50.9],  # two parts: one object
                          [120.0, 30.0, 150.1, 30.0, 150.1, 50.0, 135.5, 48.2]]},
        {"id": 40, "image_id": 139, "category_id": 1, "iscrowd": 1, "area": 3100.0,
         "bbox": [5.0, 60.0, 145.0, 40.0], "segmentation": _rle_list(crowd)},
        {"id": 41, "image_id": 285, "category_id": 90, "iscrowd": 1, "area": 3000.0,
         "bbox": [60.0, 40.0, 60.0, 50.0], "segmentation": _rle_string(blob)},
        {"id": 1000, "image_id": 285, "category_id": 3, "iscrowd": 0, "area": 10.0,
         "bbox": [0.0, 0.0, 128.0, 96.0], "segmentation": [[0.4, 0.3, 127.6, 0.3, 64.0, 95.7]]},
        {"id": 1001, "image_id": 7, "category_id": 3, "iscrowd": 0, "area": 1.0,
         "bbox": [20.0, 10.0, 40.0, 20.0], "segmentation": [[20, 10, 60, 10, 60, 30, 20, 30]]},
    ]  # fmt: skip
    data = {
        "info": {"description": "a tiny COCO"},
        "licenses": [],
        "images": [
            {"id": 139, "file_name": "000000000139.jpg", "width": 160, "height": 120},
            {"id": 285, "file_name": "000000000285.jpg", "width": 128, "height": 96},
            {"id": 632, "file_name": "000000000632.png", "width": 96, "height": 64},
            {"id": 7, "file_name": "extra/shapes.png", "width": 70, "height": 50},
        ],
        "annotations": annotations,
        "categories": [{"id": i, "name": n, "supercategory": "thing"} for i, n in CATEGORIES],
    }
    path = root / "instances.json"
    path.write_text(json.dumps(data))
    return images, path


@pytest.fixture
def coco(tmp_path: Path) -> tuple[Path, Path]:
    return make_coco(tmp_path / "coco")


def _read(path: Path) -> tuple[list[str], list[np.ndarray], dict[str, list]]:
    with PackReader(path) as reader:
        indices = range(reader.meta.num_samples)
        return list(reader.paths), reader.read_images(indices), reader.read_fields(indices, FIELDS)


@pytest.mark.parametrize("workers", [1, 2])
def test_coco_pack_equals_the_annotations_and_pycocotools_masks(coco, tmp_path, workers):
    images, annotations = coco
    progress: list[tuple[str, int | None]] = []  # (phase, total), then each step as ("", n)
    report = convert(
        sample_source(images, annotations=annotations),
        tmp_path / "coco.h5",
        ConvertOptions(workers=workers, mode="raw"),
        progress=lambda n: progress.append(("", n)),
        on_event=lambda e: progress.append((e.message, e.total)) if e.kind == "phase" else None,
    )
    assert report.num_samples == 4
    # the masks are made in the pool, after the images: a phase of their own, counted
    phase = progress.index(("decoding masks", 4))
    assert sum(n for name, n in progress[phase + 1 :] if name == "" and n) == 4
    assert not report.skipped
    reference = COCO(str(annotations))
    keys, pixels, fields = _read(tmp_path / "coco.h5")
    by_name = {img["file_name"]: img for img in reference.imgs.values()}
    for i, key in enumerate(keys):
        image = by_name[key]
        with Image.open(images / key) as source:
            np.testing.assert_array_equal(pixels[i], np.asarray(source.convert("RGB")))
        anns = reference.loadAnns(reference.getAnnIds(imgIds=[image["id"]]))
        assert int(fields["image_id"][i]) == image["id"]
        boxes = fields["boxes"][i]
        assert boxes.shape == (len(anns), 4)
        assert boxes.dtype == np.float32
        for box, ann in zip(boxes, anns, strict=True):
            x, y, w, h = ann["bbox"]
            np.testing.assert_allclose(box, [x, y, x + w, y + h], atol=0.01)
        assert fields["labels"][i].tolist() == [a["category_id"] for a in anns]
        assert fields["iscrowd"][i].tolist() == [a["iscrowd"] for a in anns]
        masks = fields["masks"][i]
        assert masks.shape == (len(anns), image["height"], image["width"])
        for mask, ann in zip(masks, anns, strict=True):
            np.testing.assert_array_equal(mask, _ann_to_mask(reference, ann))
    # an image without annotations is kept, without boxes
    empty = keys.index("000000000632.png")
    assert fields["boxes"][empty].shape == (0, 4)
    assert fields["masks"][empty].shape == (0, 64, 96)
    listed = {f.name: f for f in fields_of(fmt.load_meta(tmp_path / "coco.h5"))}
    assert isinstance(listed["labels"], CategoryField)
    assert dict(listed["labels"].categories) == dict(CATEGORIES)


def test_masks_are_compressed_in_the_images_chunk_grouping(coco, tmp_path):
    images, annotations = coco
    options = ConvertOptions(workers=1, mode="raw", size=(48, 64), chunk_samples=2)
    convert(sample_source(images, annotations=annotations), tmp_path / "c.h5", options)
    with h5py.File(tmp_path / "c.h5") as f:
        masks, offsets = f["fields/masks"], f["fields/masks.offsets"]
        assert f["images"].chunks[0] == 2 == offsets.chunks[0]
        assert masks.chunks[0] == offsets[2]  # the masks of the first image chunk's samples
        assert masks.id.get_create_plist().get_filter(0)[0] == 32015  # Zstandard
        stored = InstanceMasksField("masks").read(f, np.arange(len(offsets) - 1), f["shapes"][:])
        # bit-packed windows (decision 0042), then Zstandard: far below n x H x W bytes
        assert masks.id.get_storage_size() < sum(m.size for m in stored) / 8
    assert pack_info(tmp_path / "c.h5").plugins == ("Zstd (hdf5plugin)",)  # plain h5py: say so
    loader = make_loader(tmp_path / "c.h5", 2, num_workers=0, fields=["image", "masks", "boxes"])
    batch = next(iter(loader))
    assert len(batch["masks"]) == 2
    assert batch["masks"][0].shape[1:] == batch["image"].shape[2:]


def test_rle_strings_decode_to_pycocotools_runs():
    rng = np.random.default_rng(0)
    mask = (rng.random((37, 53)) > 0.7).astype(np.uint8)
    text = _rle_string(mask)["counts"]
    assert rle_counts(text) == _rle_list(mask)["counts"]
    assert rle_counts(text[:-1] + "o") is None  # ends inside a number


def _broken(images: Path, annotations: Path) -> dict:
    data = json.loads(annotations.read_text())
    (images / "000000000632.png").rename(images / "gone.png")
    data["images"].append({"id": 8, "file_name": "dup_a.png", "width": 70, "height": 50})
    data["images"].append({"id": 8, "file_name": "dup_b.png", "width": 70, "height": 50})
    for name in ("dup_a.png", "dup_b.png", "sized.png"):
        Image.fromarray(np.zeros((50, 70, 3), np.uint8)).save(images / name)
    data["images"].append({"id": 9, "file_name": "sized.png", "width": 71, "height": 50})
    bad = {"image_id": 7, "category_id": 3, "iscrowd": 0, "bbox": [1, 1, 5, 5]}
    data["annotations"] += [
        {**bad, "id": 500, "image_id": 999},
        {**bad, "id": 501, "category_id": 2},
        {**bad, "id": 502, "bbox": [60, 40, 20, 5]},
        {**bad, "id": 503, "segmentation": [[1, 1, 90, 1, 5, 5]]},
        {**bad, "id": 504, "segmentation": {"size": [49, 70], "counts": [3500]}},
        {**bad, "id": 505, "segmentation": {"size": [50, 70], "counts": "0"}},
    ]
    annotations.write_text(json.dumps(data))
    return {
        "000000000632.png": "listed in the annotations, but not in the image folder",
        "dup_a.png": "its image id is given to several images of the annotations",
        "dup_b.png": "its image id is given to several images of the annotations",
        "sized.png": "its size differs from the width and height the annotations give",
        "annotation 500": "its image_id names no image",
        "annotation 501 (extra/shapes.png)": "its category_id names no category of the annotations",
        "annotation 502 (extra/shapes.png)": "its bbox lies outside its image",
        "annotation 503 (extra/shapes.png)": "its segmentation does not fit its image",
        "annotation 504 (extra/shapes.png)": "its segmentation does not fit its image",
        "annotation 505 (extra/shapes.png)": "its segmentation does not fit its image",
    }


def test_bad_annotations_are_skipped_naming_them_or_stop_with_strict(coco, tmp_path):
    images, annotations = coco
    expected = _broken(images, annotations)
    report = convert(CocoSource(images, annotations), tmp_path / "p.h5", ConvertOptions(workers=1))
    assert {s.path: s.reason for s in report.skipped} == expected
    keys, _, fields = _read(tmp_path / "p.h5")
    assert sorted(keys) == ["000000000139.jpg", "000000000285.jpg", "extra/shapes.png"]
    assert fields["image_id"][keys.index("extra/shapes.png")] == 7
    assert fields["labels"][keys.index("extra/shapes.png")].tolist() == [3]  # the good one
    with pytest.raises(DecodeError, match=r"000000000632\.png: listed in the annotations, but not"):
        convert(CocoSource(images, annotations), tmp_path / "q.h5", ConvertOptions(strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco", "p.h5"]


def test_cli_converts_coco_and_warns_naming_the_annotation(coco, tmp_path):
    images, annotations = coco
    data = json.loads(annotations.read_text())
    data["annotations"][0]["category_id"] = 2
    annotations.write_text(json.dumps(data))
    runner = CliRunner()
    args = ["convert", str(images), str(tmp_path / "p.h5"), "--annotations", str(annotations)]
    result = runner.invoke(cli, [*args, "-q"])
    assert result.exit_code == 0, result.output
    assert "packed 4 of 4 images" in result.output
    assert "annotation 3 (000000000139.jpg): its category_id names no category" in result.output
    result = runner.invoke(cli, [*args[:2], str(tmp_path / "q.h5"), *args[3:], "--strict", "-q"])
    assert result.exit_code == 1
    assert "annotation 3 (000000000139.jpg)" in result.output
    assert not (tmp_path / "q.h5").exists()
    result = runner.invoke(cli, [*args, "--masks", str(images), "-q"])
    assert result.exit_code == 2
    assert "give one" in result.output


def test_shards_and_their_merge_hold_every_sample_with_its_fields(coco, tmp_path):
    images, annotations = coco
    source = CocoSource(images, annotations)
    convert(source, tmp_path / "one.h5", ConvertOptions(workers=1))
    report = convert_set(source, tmp_path / "set", ConvertOptions(workers=1), shards=2)
    assert [s.num_samples for s in report.shards] == [2, 2]
    merge_packs(sorted((tmp_path / "set").glob("*.h5")), tmp_path / "merged.h5")
    assert not verify_pack(tmp_path / "merged.h5").problems
    one, merged = h5pack.open(tmp_path / "one.h5"), h5pack.open(tmp_path / "merged.h5")
    assert sorted(merged.keys) == sorted(one.keys)
    for key in one.keys:
        mine, theirs = one[one.find(key)], merged[merged.find(key)]
        assert mine.keys() == theirs.keys()
        for name, value in mine.items():
            np.testing.assert_array_equal(value, theirs[name], err_msg=f"{key}: {name}")
