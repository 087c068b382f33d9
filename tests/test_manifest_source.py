"""Manifests (write.manifest): a CSV or JSONL naming a folder's images, their labels and fields."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from h5pack import ConvertOptions, convert
from h5pack.cli.main import cli
from h5pack.core.fields import JSONField, MultiLabelField, ScalarField, TextField, fields_of
from h5pack.errors import DecodeError, SourceError
from h5pack.training.loader import make_loader
from h5pack.write.manifest import read_manifest
from h5pack.write.sources import sample_source
from tests.helpers import pack_samples, photo_folder
from tests.test_scan import PNG_BYTES, labelled, touch


@pytest.fixture
def loose_tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for rel in ["x/1.jpg", "x/2.jpg", "y/deep/3.png", "4.png", "unlisted.jpg"]:
        touch(root, rel)
    return root


def write_csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "labels.csv"
    path.write_text(text, encoding="utf-8")
    return path


# --- path,label CSVs, as before manifests -------------------------------------------------


def test_csv_integer_labels_with_header(tmp_path: Path, loose_tree: Path) -> None:
    csv_path = write_csv(tmp_path, "path,label\nx/2.jpg,3\n4.png,0\ny/deep/3.png, 1\n\n")
    result = read_manifest(loose_tree, csv_path)
    assert [(f.relative, f.label) for f in result.files] == [
        ("4.png", 0),
        ("x/2.jpg", 3),
        ("y/deep/3.png", 1),
    ]
    assert result.classes == ("0", "1", "2", "3")
    assert result.files[0].path == loose_tree / "4.png"
    assert result.unlisted == ("unlisted.jpg", "x/1.jpg")
    assert result.fields == ()


def test_csv_class_names_without_header(tmp_path: Path, loose_tree: Path) -> None:
    csv_path = write_csv(tmp_path, "x/1.jpg,zebra\n./4.png,ant\ny/deep/3.png,zebra\n")
    result = read_manifest(loose_tree, csv_path)
    assert result.classes == ("ant", "zebra")
    assert labelled(result) == {"4.png": "ant", "x/1.jpg": "zebra", "y/deep/3.png": "zebra"}


def test_csv_mixed_labels_are_all_names(tmp_path: Path, loose_tree: Path) -> None:
    result = read_manifest(loose_tree, write_csv(tmp_path, "x/1.jpg,7\n4.png,cat\n"))
    assert result.classes == ("7", "cat")
    assert labelled(result) == {"4.png": "cat", "x/1.jpg": "7"}


def test_csv_with_bom_and_quotes(tmp_path: Path, loose_tree: Path) -> None:
    touch(loose_tree, "with, comma.jpg")
    csv_path = tmp_path / "labels.csv"
    csv_path.write_bytes('\ufeffpath,label\n"with, comma.jpg",a\n'.encode())
    assert labelled(read_manifest(loose_tree, csv_path)) == {"with, comma.jpg": "a"}


@pytest.mark.parametrize(
    ("text", "line", "path", "message"),
    [
        ("path,label\nx/1.jpg,0\nmissing.jpg,1\n", 3, "missing.jpg", "does not exist"),
        ("x/1.jpg,0\nx/notes.txt,1\n", 2, "x/notes.txt", "is not an image"),
        ("x/1.jpg,0\nx,1\n", 2, "x", "is not a regular file"),
        ("x/1.jpg,0\nx/2.jpg,0,extra\n", 2, "x/2.jpg", "expected 2 columns"),
        ("x/1.jpg,0\nx/2.jpg\n", 2, "x/2.jpg", "expected 2 columns"),
        ("x/1.jpg,0\nx/2.jpg,\n", 2, "x/2.jpg", "non-empty"),
        ("x/1.jpg,0\nx/2.jpg,-1\n", 2, "x/2.jpg", "should be >= 0"),
        ("x/1.jpg,0\n./x/1.jpg,1\n", 2, "x/1.jpg", "already listed on line 1"),
        ("x/1.jpg,0\n../outside.jpg,0\n", 2, "../outside.jpg", "stay inside it"),
        ("x/1.jpg,0\n/etc/passwd.jpg,0\n", 2, "/etc/passwd.jpg", "stay inside it"),
    ],
)
def test_a_bad_line_is_a_problem_naming_the_manifest_and_line(
    tmp_path: Path, loose_tree: Path, text: str, line: int, path: str, message: str
) -> None:
    touch(loose_tree, "x/notes.txt")
    touch(tmp_path, "outside.jpg")
    csv_path = write_csv(tmp_path, text)
    result = read_manifest(loose_tree, csv_path)
    assert [f.relative for f in result.files] == ["x/1.jpg"]
    (problem,) = result.problems
    assert problem.path == path
    assert problem.reason.startswith(f"{csv_path}, line {line}: ")
    assert message in problem.reason


def test_an_empty_or_missing_manifest_is_an_error(tmp_path: Path, loose_tree: Path) -> None:
    with pytest.raises(SourceError, match="lists no images"):
        read_manifest(loose_tree, write_csv(tmp_path, "path,label\n"))
    with pytest.raises(SourceError, match=r"lists no images \(e\.g\. .*does not exist"):
        read_manifest(loose_tree, write_csv(tmp_path, "gone.jpg,1\n"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"path": "4.png",\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"lists no images \(e\.g\. .*line 1: not a JSON"):
        read_manifest(loose_tree, broken)
    with pytest.raises(SourceError, match="cannot read labels CSV"):
        read_manifest(loose_tree, tmp_path / "nope.csv")
    with pytest.raises(SourceError, match="cannot read labels JSONL"):
        read_manifest(loose_tree, tmp_path / "nope.jsonl")


def test_csv_non_utf8_path(tmp_path: Path) -> None:
    raw = b"\xff\xfe.png"
    with open(os.path.join(os.fsencode(tmp_path), raw), "wb") as f:
        f.write(PNG_BYTES)
    csv_path = tmp_path / "labels.csv"
    csv_path.write_bytes(raw + b",odd\n")
    result = read_manifest(tmp_path, csv_path)
    assert [os.fsencode(f.relative) for f in result.files] == [raw]
    assert result.files[0].path.read_bytes() == PNG_BYTES


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("path,label,my caption", "the column 'my caption' cannot be a field"),
        ("path,file_name,label", "in one column 'path' or 'file_name'"),
        ("path,score,score", "the column 'score' is given twice"),
        ("file_name,key", "the column 'key' cannot be a field"),
    ],
)
def test_a_header_that_cannot_give_fields_is_an_error(
    tmp_path: Path, loose_tree: Path, header: str, message: str
) -> None:
    cells = ",".join(["4.png"] + ["1"] * (header.count(",")))
    with pytest.raises(SourceError, match=message):
        read_manifest(loose_tree, write_csv(tmp_path, f"{header}\n{cells}\n"))


# --- manifests with fields: real photos, converted and read back ---------------------------

ROWS = [  # path, labels, caption, score, count, meta
    ("cat/Aqua.jpg", ["cat", "indoor"], "a cat, at rest", 0.25, 3, {"w": [1, 2], "ok": True}),
    ("cat/Dune.jpg", [], 'a "quoted" caption', -1.5, 0, None),
    ("dog/Blinds.jpg", ["dog"], "ünïcode | pipes", 1e-3, 7, {"nested": {"x": "y"}}),
    ("dog/FreshFlower.jpg", ["outdoor", "dog", "cat"], "", 2.0, -4, []),
]


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = photo_folder(tmp_path / "photos", ("cat", "dog"), per_class=2)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg")) == sorted(
        r[0] for r in ROWS
    )
    return root


def write_rows(tmp_path: Path, suffix: str) -> Path:
    target = tmp_path / f"manifest{suffix}"
    if suffix == ".csv":
        with target.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["file_name", "label", "labels", "caption", "score", "count"])
            for path, labels, caption, score, count, _ in ROWS:
                writer.writerow([path, path.split("/")[0], "|".join(labels), caption, score, count])
    else:
        lines = [
            {"path": p, "label": p.split("/")[0], "labels": labels, "caption": caption,
             "score": score, "count": count, **({"meta": meta} if meta is not None else {})}
            for p, labels, caption, score, count, meta in ROWS
        ]  # fmt: skip
        target.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return target


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_manifest_fields_convert_and_read_back_exact(
    photos: Path, tmp_path: Path, suffix: str
) -> None:
    manifest = write_rows(tmp_path, suffix)
    options = ConvertOptions(workers=2, labels_csv=manifest)
    report = convert(photos, tmp_path / "p.h5", options)
    assert report.num_samples == 4
    assert report.meta.classes == ("cat", "dog")
    kinds = {f.name: f for f in fields_of(report.meta)}
    assert kinds["labels"] == MultiLabelField("labels", classes=("cat", "dog", "indoor", "outdoor"))
    assert kinds["caption"] == TextField("caption")
    assert kinds["score"] == ScalarField("score", "<f8")
    assert kinds["count"] == ScalarField("count", "<i8")
    names = ["labels", "caption", "score", "count"]
    if suffix == ".jsonl":
        assert kinds["meta"] == JSONField("meta")
        names.append("meta")
    stored = pack_samples(tmp_path / "p.h5", names)
    plain = pack_samples(convert(photos, tmp_path / "plain.h5", ConvertOptions(workers=1)).path)
    for path, labels, caption, score, count, meta in ROWS:
        sample = stored[path]
        assert sample["label"] == path.split("/")[0]
        assert sample["labels"] == labels
        assert sample["caption"] == caption
        assert sample["score"] == score
        assert sample["count"] == count
        if suffix == ".jsonl":
            assert sample["meta"] == meta
        np.testing.assert_array_equal(sample["image"], plain[path]["image"])


def test_the_loader_gives_a_manifests_fields_by_name(photos: Path, tmp_path: Path) -> None:
    manifest = write_rows(tmp_path, ".jsonl")
    convert(photos, tmp_path / "p.h5", ConvertOptions(workers=1, labels_csv=manifest))
    fields = ["labels", "caption", "count", "meta"]
    loader = make_loader(tmp_path / "p.h5", 4, size=32, num_workers=0, fields=fields)
    batch = next(iter(loader))
    by_caption = {c: i for i, c in enumerate(batch["caption"])}
    classes = ("cat", "dog", "indoor", "outdoor")
    for _, labels, caption, _, count, meta in ROWS:
        i = by_caption[caption]
        assert [classes[int(c)] for c in batch["labels"][i]] == labels
        assert int(batch["count"][i]) == count
        assert batch["meta"][i] == meta


def test_bad_cells_are_skipped_naming_the_line_or_stop_with_strict(
    photos: Path, tmp_path: Path
) -> None:
    lines = [
        {"path": "cat/Aqua.jpg", "labels": ["cat"], "score": 1},
        {"path": "cat/Dune.jpg", "labels": ["cat", ""], "score": 2},
        {"path": "dog/Blinds.jpg", "labels": "dog", "score": None},
        {"path": "dog/Gone.jpg", "labels": "dog", "score": 3},
        {"path": "cat/Aqua.jpg", "labels": "dog", "score": 4},
    ]
    manifest = tmp_path / "m.jsonl"
    text = "".join(json.dumps(line) + "\n" for line in lines) + "[1, 2]\n"
    manifest.write_text(text, encoding="utf-8")
    report = convert(photos, tmp_path / "p.h5", ConvertOptions(workers=1, labels_csv=manifest))
    assert report.num_samples == 1
    assert {s.path: s.reason for s in report.skipped} == {
        "cat/Dune.jpg": f"{manifest}, line 2: the column 'labels' holds class names separated by "
        "'|' (or a JSON list of names), but this record has ['cat', '']",
        "dog/Blinds.jpg": f"{manifest}, line 3: the column 'score' holds integers, but this "
        "record has no value",
        "dog/Gone.jpg": f"{manifest}, line 4: 'dog/Gone.jpg' does not exist under {photos}",
        "cat/Aqua.jpg": f"{manifest}, line 5: 'cat/Aqua.jpg' is already listed on line 1",
        "line 6": f"{manifest}, line 6: not a JSON object, but list",
    }
    with pytest.raises(DecodeError, match=rf"{manifest}, line 2: the column 'labels'"):
        convert(photos, tmp_path / "q.h5", ConvertOptions(labels_csv=manifest, strict=True))
    assert not (tmp_path / "q.h5").exists()


def test_cli_takes_a_jsonl_manifest_and_notes_unlisted_images(photos: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"file_name": "cat/Aqua.jpg", "caption": "one"}\n', encoding="utf-8")
    source = sample_source(photos, labels_csv=manifest)
    assert source.classes == ()
    assert source.notes == (
        f"the labels JSONL {manifest} lists 1 of the 4 images under {photos}: 3 left out "
        "(cat/Dune.jpg, dog/Blinds.jpg, dog/FreshFlower.jpg); only listed images are packed",
    )
    args = ["convert", str(photos), str(tmp_path / "p.h5"), "--labels", str(manifest)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert pack_samples(tmp_path / "p.h5", ["caption"])["cat/Aqua.jpg"]["caption"] == "one"
