"""Fields carried beyond one pack: verify --source, pack sets, merges and their messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import h5pack
from h5pack import BoxesField, MaskField
from h5pack.check import verify_pack
from h5pack.cli.main import cli
from h5pack.errors import FormatError
from h5pack.write.merge import merge_packs
from h5pack.write.options import ConvertOptions
from h5pack.write.sources.arrays import ArraySource
from tests.helpers import make_folder, random_arrays

NUM = 9


def _source(seed: int = 0, num: int = NUM) -> dict:
    """Images, labels, keys and fields of a detection-like source."""
    rng = np.random.default_rng(seed)
    images = random_arrays(num, (12, 10, 3), seed=seed)
    return {
        "samples": images,
        "labels": [i % 3 for i in range(num)],
        "paths": [f"s{seed}/img-{i}.png" for i in range(num)],
        "fields": {
            "caption": [f"a photo {i}" for i in range(num)],
            "labels": [np.arange(i % 3, dtype=np.int64) for i in range(num)],
            "weight": rng.random(num).astype(np.float32),
            BoxesField("boxes"): [
                rng.random((i % 3, 4)).astype(np.float32) * 9 for i in range(num)
            ],
            MaskField("mask"): [(im[:, :, 0] > 99).astype(np.uint8) for im in images],
        },
    }


def _write(path: Path, given: dict) -> Path:
    options = ConvertOptions(chunk_samples=4)
    return h5pack.write_arrays(path, **given, classes=("a", "b", "c"), options=options).path


def _origin(sample: dict, *sources: dict) -> tuple[dict, int]:
    """Return the fields given for ``sample`` (by its key ``sN/img-I.png``) and its I."""
    seed, number = sample["key"].removesuffix(".png").split("/img-")
    return sources[int(seed[1:])]["fields"], int(number)


def _changed(report) -> dict[str, str]:
    return {p.path: p.message for p in report.problems}


def test_verify_source_compares_every_field(tmp_path):
    given = _source()
    path = _write(tmp_path / "a.h5", given)
    report = verify_pack(path, source=ArraySource(**given, classes=("a", "b", "c")))
    assert report.problems == ()
    assert report.num_compared == NUM
    fields = given["fields"]
    fields["caption"] = [*fields["caption"][:1], "another caption", *fields["caption"][2:]]
    boxes = [b.copy() for b in fields[BoxesField("boxes")]]
    boxes[2][0, 1] += 0.005  # within the tolerance of box coordinates
    boxes[5][1, 3] += 0.5
    fields[BoxesField("boxes")] = boxes
    masks = [m.copy() for m in fields[MaskField("mask")]]
    masks[4][3, 3] ^= 1
    fields[MaskField("mask")] = masks
    fields["labels"] = [*fields["labels"][:7], np.array([5], np.int64), fields["labels"][8]]
    report = verify_pack(path, source=ArraySource(**given, classes=("a", "b", "c")))
    assert _changed(report) == {
        "s0/img-1.png": "changed: field 'caption' is 'a photo 1', 'another caption' in the source",
        "s0/img-5.png": "changed: field 'boxes' differs from the source's by up to 0.5",
        "s0/img-4.png": "changed: field 'mask' differs from the source's in 1 of 120 values",
        "s0/img-7.png": "changed: field 'labels' differs from the source's in 1 of 1 values",
    }
    assert report.changed == 4


def test_a_manifests_fields_open_by_key_and_verify_against_it(tmp_path):
    files = make_folder(tmp_path / "src", classes=("cat", "dog"), per_class=3)
    keys = [f.relative_to(tmp_path / "src").as_posix() for f in files]
    rows = [
        {"path": key, "labels": ["indoor", "cat"][: i % 3], "caption": f"photo {i}"}
        | {"meta": {"n": i, "tags": ["a"] * i}}
        for i, key in enumerate(keys)
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    options = ConvertOptions(labels_csv=manifest)
    path = h5pack.convert(tmp_path / "src", tmp_path / "p.h5", options).path
    with h5pack.open(path) as pack:
        assert pack.classes == ["cat", "indoor"]  # the multi-label field's names
        for row in rows:
            sample = pack[pack.find(row["path"])]
            assert [pack.classes[i] for i in sample["labels"]] == row["labels"]
            assert (sample["caption"], sample["meta"]) == (row["caption"], row["meta"])
    assert verify_pack(path, source=tmp_path / "src", labels_csv=manifest).problems == ()
    rows[4]["caption"], rows[2]["meta"]["n"] = "another", 7
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = verify_pack(path, source=tmp_path / "src", labels_csv=manifest)
    assert _changed(report) == {
        rows[4]["path"]: "changed: field 'caption' is 'photo 4', 'another' in the source",
        rows[2]["path"]: 'changed: field \'meta\' is \'{"n":2,"tags":["a","a"]}\', '
        '\'{"n":7,"tags":["a","a"]}\' in the source',
    }


def test_a_pack_set_of_packs_with_fields_reads_each_field_across_them(tmp_path):
    first, second = _source(0), _source(1, num=5)
    paths = [_write(tmp_path / "a.h5", first), _write(tmp_path / "b.h5", second)]
    with h5pack.open(paths) as pack:
        assert len(pack) == NUM + 5
        for sample in pack:
            given, number = _origin(sample, first, second)
            np.testing.assert_array_equal(sample["boxes"], given[BoxesField("boxes")][number])
            assert sample["caption"] == given["caption"][number]
    plain = _write(tmp_path / "c.h5", {**_source(2), "fields": {}})
    message = r"field 'caption' \(text\) is in .*a\.h5, not in .*c\.h5"
    with pytest.raises(FormatError, match=message):
        h5pack.open([paths[0], plain])


def test_merge_carries_fields_and_names_the_one_that_differs(tmp_path):
    first, second = _source(0), _source(1, num=5)
    paths = [_write(tmp_path / "a.h5", first), _write(tmp_path / "b.h5", second)]
    merged = merge_packs(paths, tmp_path / "m.h5").path
    with h5pack.open(merged) as pack:
        for sample in pack:
            given, number = _origin(sample, first, second)
            np.testing.assert_array_equal(sample["mask"], given[MaskField("mask")][number])
            np.testing.assert_array_equal(sample["labels"], given["labels"][number])
    other = _source(3)
    other["fields"]["weight"] = other["fields"]["weight"].astype(np.float64)
    _write(tmp_path / "d.h5", other)
    with pytest.raises(
        FormatError, match=r"field 'weight' is scalar <f8 in .*d\.h5 but scalar <f4"
    ):
        merge_packs([paths[0], tmp_path / "d.h5"], tmp_path / "n.h5")


def test_verify_source_with_coco_annotations_names_a_moved_box(tmp_path):
    pytest.importorskip("pycocotools")
    from tests.test_coco_source import make_coco

    images, annotations = make_coco(tmp_path / "coco")
    args = ["convert", str(images), str(tmp_path / "c.h5"), "--annotations", str(annotations)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    verify = ["verify", str(tmp_path / "c.h5"), "--source", str(images)]
    result = CliRunner().invoke(cli, [*verify, "--annotations", str(annotations), "-q"])
    assert result.exit_code == 0, result.output
    assert "4 images in the source" in result.output
    assert "0 changed of 4 compared" in result.output
    data = json.loads(annotations.read_text())
    data["annotations"][0]["bbox"][0] += 3.0  # image 139's first box, 3 px to the right
    data["annotations"][1]["category_id"] = 3  # its second: a car, not a person
    annotations.write_text(json.dumps(data))
    result = CliRunner().invoke(cli, [*verify, "--annotations", str(annotations), "-q"])
    assert result.exit_code == 1
    problems = [line.split(": ", 1)[1] for line in result.output.splitlines() if "(0000" in line]
    assert problems == [
        "changed: field 'boxes' differs from the source's by up to 3",
        "changed: field 'labels' differs from the source's in 1 of 3 values",
    ]
    assert "1 changed of 4 compared" in result.output  # one sample, two fields
    result = CliRunner().invoke(cli, [*verify[:2], "--annotations", str(annotations)])
    assert result.exit_code == 2
    assert "needs --source" in result.output
