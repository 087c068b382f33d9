"""Random access (``h5pack.open``): every sample by index and by key, local and in a bucket."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import h5pack
from h5pack import BoxesField, MaskField
from h5pack.core import format as fmt
from h5pack.errors import FormatError, OptionsError
from h5pack.read.setreader import open_reader
from h5pack.write.options import ConvertOptions
from h5pack.write.sources import sample_source
from tests.helpers import make_folder, pil_rgb, random_arrays
from tests.s3local import Bucket

DATA = Path(__file__).parent / "data"
NUM = 13  # chunks of 4: the last holds one sample


def _fields(images: list[np.ndarray]) -> dict:
    rng = np.random.default_rng(1)
    return {
        "weight": np.linspace(0.5, 1.0, len(images), dtype=np.float32),
        "caption": [f"picture {i}: ünïcode" for i in range(len(images))],
        "labels": [np.arange(i % 3, dtype=np.int64) + 1 for i in range(len(images))],
        BoxesField("boxes"): [rng.random((i % 3, 4)).astype(np.float32) * 9 for i in range(13)],
        MaskField("mask"): [(image[:, :, 0] > 128).astype(np.uint8) for image in images],
    }


def _fields_pack(path: Path) -> tuple[Path, list[np.ndarray], dict]:
    images = random_arrays(NUM, (12, 10, 3))
    fields = _fields(images)
    options = ConvertOptions(chunk_samples=4)
    h5pack.write_arrays(path, images, [i % 2 for i in range(NUM)], fields=fields, options=options)
    return path, images, {getattr(k, "name", k): v for k, v in fields.items()}


def _check_sample(found: dict, images: list, given: dict, source: int) -> None:
    np.testing.assert_array_equal(found["image"], images[source])
    assert found["label"] == source % 2
    assert found["key"] == f"sample-{source:06d}"
    assert found["caption"] == given["caption"][source]
    for name in ("weight", "labels", "boxes", "mask"):
        np.testing.assert_array_equal(found[name], given[name][source])
        assert np.asarray(found[name]).dtype == np.asarray(given[name][source]).dtype


def test_every_sample_of_a_pack_of_fields_by_index_key_slice_and_iteration(tmp_path):
    path, images, given = _fields_pack(tmp_path / "f.h5")
    order = fmt.load_meta(path).source_index  # stored shuffled: sample i is given[order[i]]
    with h5pack.open(path) as pack:
        assert len(pack) == NUM
        listed = ["image", "label", "key", "weight", "caption", "labels", "boxes", "mask"]
        assert list(pack.fields) == listed
        assert pack.fields["boxes"] == BoxesField("boxes", per_box=("labels",))  # one per box
        assert pack.classes == ["0", "1"]
        for i in range(NUM):
            sample = pack[i]
            _check_sample(sample, images, given, int(order[i]))
            assert pack.find(sample["key"]) == i
            assert pack[i - NUM]["key"] == sample["key"]  # negative indices count from the end
        assert [s["key"] for s in pack] == list(pack.keys)
        assert [s["key"] for s in pack[3:10:2]] == [pack[i]["key"] for i in range(3, 10, 2)]
        assert [s["key"] for s in pack[[12, 0, 5]]] == [pack[i]["key"] for i in (12, 0, 5)]
        assert [s["key"] for s in pack[np.array([7, -1])]] == [pack[7]["key"], pack[12]["key"]]
        assert pack[5:5] == []


def test_fields_picks_what_each_sample_holds(tmp_path):
    path, _, given = _fields_pack(tmp_path / "f.h5")
    order = fmt.load_meta(path).source_index
    with h5pack.open(path, fields=["caption", "key"]) as pack:
        assert list(pack.fields) == ["caption", "key"]
        assert pack[4] == {"caption": given["caption"][order[4]], "key": f"sample-{order[4]:06d}"}
    with pytest.raises(OptionsError, match=r"should name some of .*f\.h5's fields"):
        h5pack.open(path, fields=["depth"])


def test_an_image_folder_reads_back_its_pixels_labels_and_keys(tmp_path):
    files = make_folder(tmp_path / "src", classes=("cat", "dog", "fox"), per_class=5, vary=True)
    h5pack.convert(tmp_path / "src", tmp_path / "a.h5", ConvertOptions(chunk_bytes=2048))
    with h5pack.open(tmp_path / "a.h5") as pack:
        assert pack.classes == ["cat", "dog", "fox"]
        assert list(pack.fields) == ["image", "label", "key"]
        assert sorted(pack.keys) == sorted(
            p.relative_to(tmp_path / "src").as_posix() for p in files
        )
        for file in files:
            key = file.relative_to(tmp_path / "src").as_posix()
            sample = pack[pack.find(key)]
            assert sample["key"] == key
            assert pack.classes[sample["label"]] == file.parent.name
            np.testing.assert_array_equal(sample["image"], pil_rgb(file))
            assert sample["image"].dtype == np.uint8


def test_a_coco_pack_gives_boxes_masks_and_categories_by_id(tmp_path):
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO

    from tests.test_coco_source import CATEGORIES, _ann_to_mask, make_coco

    images, annotations = make_coco(tmp_path / "coco")
    source = sample_source(images, annotations=annotations)
    h5pack.convert(source, tmp_path / "coco.h5", ConvertOptions(mode="raw"))
    data, reference = json.loads(annotations.read_text()), COCO(str(annotations))
    with h5pack.open(tmp_path / "coco.h5") as pack:
        assert pack.classes == dict(CATEGORIES)  # ids with gaps: {1: 'person', 3: 'car'...}
        assert len(pack) == len(data["images"])
        for image in data["images"]:
            sample = pack[pack.find(image["file_name"])]
            assert sample["key"] == image["file_name"]
            assert sample["image"].shape == (image["height"], image["width"], 3)
            with Image.open(images / image["file_name"]) as file:
                np.testing.assert_array_equal(sample["image"], np.asarray(file.convert("RGB")))
            anns = [a for a in data["annotations"] if a["image_id"] == image["id"]]
            xywh = np.array([a["bbox"] for a in anns], np.float64).reshape(-1, 4)
            xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
            np.testing.assert_allclose(sample["boxes"], xyxy, atol=0.01)
            assert sample["labels"].tolist() == [a["category_id"] for a in anns]
            assert [pack.classes[c] for c in sample["labels"].tolist()] == [
                dict(CATEGORIES)[a["category_id"]] for a in anns
            ]
            assert sample["iscrowd"].tolist() == [a["iscrowd"] for a in anns]
            assert sample["masks"].shape == (len(anns), image["height"], image["width"])
            for mask, ann in zip(sample["masks"], anns, strict=True):  # pycocotools' masks
                np.testing.assert_array_equal(mask, _ann_to_mask(reference, ann))


def test_bad_indices_and_keys_are_named(tmp_path):
    path, _, _ = _fields_pack(tmp_path / "f.h5")
    pack = h5pack.open(path)
    with pytest.raises(IndexError, match=rf"index 13 is out of range for {path}"):
        pack[NUM]
    with pytest.raises(IndexError, match="index -14"):
        pack[-NUM - 1]
    with pytest.raises(KeyError, match=r"no sample of .*f\.h5 has the key 'nope'"):
        pack.find("nope")
    with pytest.raises(TypeError, match="indexed by an int, a slice or a list of ints"):
        pack["image"]  # type: ignore[call-overload]
    with pytest.raises(FileNotFoundError):
        h5pack.open(tmp_path / "missing.h5")


def test_a_pack_pickles_as_a_path_and_reopens(tmp_path):
    path, images, given = _fields_pack(tmp_path / "f.h5")
    pack = h5pack.open(path)
    pack.find("sample-000001")
    data = pickle.dumps(pack)
    assert b"sample-000001" not in data  # neither the keys nor a handle travel
    again = pickle.loads(data)
    order = fmt.load_meta(path).source_index
    _check_sample(again[3], images, given, int(order[3]))
    pack.close()
    assert pack[0]["key"] == again[0]["key"]  # a closed pack opens again on use


def test_a_damaged_sample_is_refused_by_its_digest(tmp_path):
    images = random_arrays(8, (12, 10, 3))
    path = tmp_path / "a.h5"
    h5pack.write_arrays(
        path, images, [0] * 8, options=ConvertOptions(shuffle_samples=False, layout="contiguous")
    )
    with fmt.open_h5(path) as handle:
        offset = handle[fmt.IMAGES].id.get_offset()
    data = bytearray(path.read_bytes())
    data[offset + 3 * images[0].size + 5] ^= 0xFF  # one byte of sample 3
    path.write_bytes(bytes(data))
    with h5pack.open(path) as pack:
        np.testing.assert_array_equal(pack[2]["image"], images[2])
        with pytest.raises(FormatError, match=r"sample 3 \(sample-000003\) does not match its"):
            pack[3]


@pytest.mark.parametrize("name", [*sorted(p.name for p in DATA.glob("*.h5")), "v1_1_set"])
def test_frozen_packs_and_sets_open_as_image_label_and_key(name):
    with h5pack.open(DATA / name) as pack, open_reader(DATA / name) as reader:
        assert list(pack.fields) == ["image", "label", "key"]
        assert pack.classes == list(reader.meta.classes)
        for i in range(len(pack)):
            sample = pack[i]
            assert pack.find(sample["key"]) == i
            assert sample["key"] == reader.paths[i]
            assert sample["label"] == int(reader.meta.labels[i])
            np.testing.assert_array_equal(sample["image"], reader.read_images([i])[0])


def test_a_pack_set_reads_across_its_shards(tmp_path):
    make_folder(tmp_path / "src", classes=("a", "b"), per_class=9)
    h5pack.convert_set(tmp_path / "src", tmp_path / "set", shards=3)
    with h5pack.open(tmp_path / "set") as pack:
        assert len(pack) == 18
        assert pack.classes == ["a", "b"]
        for i in range(18):
            key = pack[i]["key"]
            assert pack.find(key) == i
            np.testing.assert_array_equal(pack[i]["image"], pil_rgb(tmp_path / "src" / key))


def test_a_pack_in_a_bucket_reads_only_what_it_needs(s3_bucket: Bucket, tmp_path: Path):
    num = 200  # 2.4 MB of images in chunks of 16: larger than the tail read at open
    images = random_arrays(num, (64, 64, 3))
    rng = np.random.default_rng(2)
    given = {
        "caption": [f"picture {i}" for i in range(num)],
        "boxes": [rng.random((i % 3, 4)).astype(np.float32) for i in range(num)],
        "mask": [rng.integers(0, 3, (64, 64), dtype=np.uint8) for _ in range(num)],
    }
    fields = {"caption": given["caption"], BoxesField("boxes"): given["boxes"]}
    fields[MaskField("mask")] = given["mask"]
    path = tmp_path / "f.h5"
    options = ConvertOptions(chunk_samples=16)
    h5pack.write_arrays(path, images, [i % 2 for i in range(num)], fields=fields, options=options)
    order = fmt.load_meta(path).source_index
    url = s3_bucket.put(path, "f.h5")
    proxy, settings = s3_bucket.proxy, s3_bucket.storage_options
    with h5pack.open(url, fields=["image", "label", "key"], storage_options=settings) as pack:
        assert proxy.reset_counts().gets == 1  # the tail: compact index and metadata
        sample = pack[37]
        read = proxy.reset_counts()  # one GET of its chunk's 16 images, nothing else
        assert (read.gets, read.body_bytes) == (1, 16 * images[0].nbytes)
        assert pack[40]["key"] == f"sample-{order[40]:06d}"  # the same chunk: no request
        assert pack.find(f"sample-{order[100]:06d}") == 100  # the keys came with the index
        assert proxy.reset_counts().gets == 0
        np.testing.assert_array_equal(sample["image"], images[order[37]])
        assert (sample["label"], sample["key"]) == (order[37] % 2, f"sample-{order[37]:06d}")
    with h5pack.open(url, storage_options=settings) as pack:
        proxy.reset_counts()
        for i in (150, 3):
            sample = pack[i]
            np.testing.assert_array_equal(sample["image"], images[order[i]])
            for name, values in given.items():
                np.testing.assert_array_equal(sample[name], values[order[i]])
        read = proxy.reset_counts()  # two chunks of images and of each field: not the file
        assert read.body_bytes < path.stat().st_size // 2
        again = pickle.loads(pickle.dumps(pack))
        assert again[-1]["caption"] == given["caption"][order[-1]]


def test_a_pack_set_in_a_bucket_reads_as_the_local_one(s3_bucket: Bucket):
    url = s3_bucket.put_tree(DATA / "v1_1_set", "set")
    with (
        h5pack.open(url, storage_options=s3_bucket.storage_options) as remote,
        h5pack.open(DATA / "v1_1_set") as local,
    ):
        assert len(remote) == len(local)
        assert remote.classes == local.classes
        for i, sample in enumerate(remote):
            assert remote.find(sample["key"]) == i
            expected = local[i]
            assert (sample["key"], sample["label"]) == (expected["key"], expected["label"])
            np.testing.assert_array_equal(sample["image"], expected["image"])
