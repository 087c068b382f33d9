"""Parquet in Hugging Face datasets' layout (write.sources.parquet): files written by pyarrow."""

from __future__ import annotations

import io
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack import ConvertOptions, convert, convert_set
from h5pack.check import verify_pack
from h5pack.cli.main import cli
from h5pack.errors import DecodeError, SourceError
from h5pack.write.sources import ParquetSource, parquetrows, sample_source
from h5pack.write.sources.parquetrows import ParquetRow
from tests.helpers import pack_samples, photo_folder

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

CLASSES = ("cat", "dog", "eel")
TAGS = ("indoor", "outdoor", "night")
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
SCHEMA = pa.schema(
    [
        ("image", IMAGE),
        ("label", pa.int64()),
        ("caption", pa.string()),
        ("score", pa.float32()),
        ("tags", pa.list_(pa.int64())),
        ("boxes", pa.list_(pa.float64())),
    ],
    # What datasets' ArrowWriter writes: the features as JSON under the key "huggingface".
    metadata={
        "huggingface": json.dumps(
            {
                "info": {
                    "features": {
                        "image": {"_type": "Image"},
                        "label": {"names": list(CLASSES), "_type": "ClassLabel"},
                        "caption": {"dtype": "string", "_type": "Value"},
                        "score": {"dtype": "float32", "_type": "Value"},
                        "tags": {
                            "feature": {"names": list(TAGS), "_type": "ClassLabel"},
                            "_type": "Sequence",
                        },
                        "boxes": {
                            "feature": {"dtype": "float64", "_type": "Value"},
                            "_type": "Sequence",
                        },
                    }
                }
            }
        )
    },
)


def rows_of(folder: Path) -> list[dict[str, Any]]:
    """One HF row per image of an ImageFolder tree: its bytes and path, label and more."""
    files = sorted(p for p in folder.rglob("*.jpg"))
    return [
        {
            "image": {"bytes": p.read_bytes(), "path": p.relative_to(folder).as_posix()},
            "label": CLASSES.index(p.parent.name),
            "caption": f"{p.stem} of a {p.parent.name}: ünïcode",
            "score": i / 4,
            "tags": [i % 3, (i + 1) % 3][: 1 + i % 2],
            "boxes": [float(i), i + 0.5][: i % 3],
        }
        for i, p in enumerate(files)
    ]


def write_parquet(target: Path, rows: list[dict[str, Any]], *, row_group_size: int = 2) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(table, target, row_group_size=row_group_size)
    return target


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return photo_folder(tmp_path / "images", CLASSES, per_class=3)


@pytest.fixture
def dataset(folder: Path, tmp_path: Path) -> Path:
    """A HF dataset repo's data folder: the rows in two files of several row groups."""
    rows = rows_of(folder)
    data = tmp_path / "repo" / "data"
    write_parquet(data / "train-00000-of-00002.parquet", rows[:5])
    write_parquet(data / "train-00001-of-00002.parquet", rows[5:])
    return data


def decoded(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize("workers", [1, 2])
def test_rows_convert_to_samples_equal_to_their_source(
    dataset: Path, folder: Path, tmp_path: Path, workers: int
) -> None:
    source = sample_source(dataset)
    assert isinstance(source, ParquetSource)
    report = convert(dataset, tmp_path / "p.h5", ConvertOptions(mode="encoded", workers=workers))
    assert report.num_samples == 9
    assert report.meta.classes == CLASSES
    stored = pack_samples(tmp_path / "p.h5", ["caption", "score", "tags", "boxes"])
    given = {row["image"]["path"]: row for row in rows_of(folder)}
    assert set(stored) == set(given)
    for key, sample in stored.items():
        row = given[key]
        np.testing.assert_array_equal(sample["image"], decoded(row["image"]["bytes"]))
        assert sample["label"] == CLASSES[row["label"]] == key.split("/")[0]
        assert sample["caption"] == row["caption"]
        assert sample["score"] == np.float32(row["score"])
        assert sample["tags"] == [TAGS[t] for t in row["tags"]]
        np.testing.assert_array_equal(sample["boxes"], np.asarray(row["boxes"], np.float64))
    assert verify_pack(tmp_path / "p.h5", source=dataset).ok


@pytest.mark.parametrize("mode", ["encoded", "raw"])
def test_a_folder_and_its_parquet_give_the_same_samples(
    dataset: Path, folder: Path, tmp_path: Path, mode: str
) -> None:
    options = ConvertOptions(mode=mode, workers=2)
    convert(folder, tmp_path / "folder.h5", options)
    convert(dataset, tmp_path / "parquet.h5", options)
    from_folder = pack_samples(tmp_path / "folder.h5")
    from_parquet = pack_samples(tmp_path / "parquet.h5")
    assert from_parquet.keys() == from_folder.keys()
    for key, sample in from_folder.items():
        assert from_parquet[key]["label"] == sample["label"]
        np.testing.assert_array_equal(from_parquet[key]["image"], sample["image"])


@pytest.mark.parametrize("runs", [1, 2, 5])
def test_write_order_interleaves_runs_each_read_front_to_back(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, runs: int
) -> None:
    monkeypatch.setattr(parquetrows, "RUNS", runs)
    source = ParquetSource(dataset)
    order = source.split(seed=5)
    assert sorted(order.tolist()) == list(range(9))
    # 5 groups (5 rows in groups of 2, then 4) in `runs` runs of consecutive groups
    starts = np.arange(runs + 1) * 5 // runs
    group_starts = np.array([0, 2, 4, 5, 7, 9])[starts]
    run_of = np.searchsorted(group_starts, order, side="right") - 1
    for run in range(runs):
        assert (np.diff(order[run_of == run]) > 0).all()  # front to back
    assert (ParquetSource(dataset).split(seed=5) == order).all()
    assert (np.concatenate([source.split(i, 4, seed=5) for i in range(4)]) == order).all()
    assert (source.split(shuffle=False) == np.arange(9)).all()


def test_the_converting_process_reads_each_row_group_once_holding_one_per_run(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parquetrows, "RUNS", 2)
    source = ParquetSource(dataset)
    reads: list[tuple[str, int]] = []
    held: list[int] = []
    original = parquetrows._read

    def counted(image: parquetrows.ParquetRow) -> Any:
        reads.append((image.path, image.row_group))
        held.append(len(parquetrows._state()["groups"]))
        return original(image)

    monkeypatch.setattr(parquetrows, "_read", counted)
    parquetrows._STATE.clear()
    order = source.split(seed=1)
    images = [source.samples[i].image.read() for i in order]
    assert len(reads) == len(set(reads)) == 5
    assert max(held) <= 2  # one group a run
    assert parquetrows._state()["groups"] == {}  # each dropped after its last row
    given = [r["image"]["bytes"] for r in rows_of(dataset.parents[1] / "images")]
    assert images == [given[i] for i in order]
    assert [source.samples[i].image.read() for i in order[::-1]] == images[::-1]


def test_a_row_without_image_bytes_is_skipped_naming_its_file_and_row(
    folder: Path, tmp_path: Path
) -> None:
    rows = rows_of(folder)
    rows[3]["image"] = {"bytes": None, "path": None}
    rows[6]["image"]["bytes"] = b""
    data = write_parquet(tmp_path / "one.parquet", rows, row_group_size=4)
    report = convert(data, tmp_path / "p.h5", ConvertOptions(workers=2))
    assert report.num_samples == 7
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons == {
        "one.parquet:3": "one.parquet, row 3: no image bytes in its 'image' column",
        rows[6]["image"]["path"]: "one.parquet, row 6: no image bytes in its 'image' column",
    }
    with pytest.raises(DecodeError, match=r"one\.parquet, row [36]: no image bytes"):
        convert(data, tmp_path / "q.h5", ConvertOptions(workers=1, strict=True))
    assert not (tmp_path / "q.h5").exists()


def test_duplicate_keys_bad_labels_and_nulls_are_problems_naming_the_row(
    folder: Path, tmp_path: Path
) -> None:
    rows = rows_of(folder)
    rows[4]["image"]["path"] = rows[1]["image"]["path"]
    rows[5]["label"] = 7
    rows[7]["caption"] = None
    data = write_parquet(tmp_path / "d.parquet", rows)
    source = ParquetSource(data)
    reasons = {p.reason for p in source.problems}
    assert reasons == {
        f"d.parquet, row 4: the key {rows[1]['image']['path']!r} is already that of "
        "d.parquet, row 1",
        f"d.parquet, row 5: the label 7 is no class of {CLASSES}",
        "d.parquet, row 7: the column 'caption' is null",
    }
    parquetrows._STATE.clear()
    for i in source.split(seed=0):
        source.samples[i].image.read()
    assert parquetrows._state()["groups"] == {}  # dropped at their last sample, row 6's too
    report = convert(data, tmp_path / "p.h5", ConvertOptions(workers=1))
    assert report.num_samples == 6
    stored = pack_samples(tmp_path / "p.h5", ["caption"])
    assert stored[rows[1]["image"]["path"]]["caption"] == rows[1]["caption"]
    with pytest.raises(DecodeError, match=r"d\.parquet, row 4: the key"):
        convert(data, tmp_path / "q.h5", ConvertOptions(workers=1, strict=True))
    assert not (tmp_path / "q.h5").exists()


def test_several_splits_are_refused_and_a_glob_picks_one(
    dataset: Path, folder: Path, tmp_path: Path
) -> None:
    write_parquet(dataset / "test-00000-of-00001.parquet", rows_of(folder)[:2])
    with pytest.raises(SourceError, match=r"the splits \['test', 'train'\]: convert one"):
        ParquetSource(dataset).samples  # noqa: B018
    train = sample_source(dataset / "train-*.parquet")
    assert isinstance(train, ParquetSource)
    assert len(train.samples) == 9
    report = convert_set(
        dataset / "train-*.parquet", tmp_path / "set", ConvertOptions(workers=1), shards=2
    )
    assert sum(s.num_samples for s in report.shards) == 9


def test_rows_without_paths_are_keyed_by_file_and_row(folder: Path, tmp_path: Path) -> None:
    rows = rows_of(folder)
    for row in rows:
        row["image"]["path"] = None
    data = write_parquet(tmp_path / "x" / "a.parquet", rows[:4])
    write_parquet(tmp_path / "x" / "b.parquet", rows[4:])
    source = ParquetSource(tmp_path / "x")
    assert [s.key for s in source.samples] == [f"a.parquet:{i}" for i in range(4)] + [
        f"b.parquet:{i}" for i in range(5)
    ]
    assert source.files() == [data, tmp_path / "x" / "b.parquet"]


def test_an_image_folder_is_not_taken_for_parquet(folder: Path, dataset: Path) -> None:
    (folder / "notes.parquet").write_bytes(b"")  # a stray file among images
    assert not ParquetSource.matches(folder)
    assert ParquetSource.matches(dataset)
    assert ParquetSource.matches(dataset / "train-00000-of-00002.parquet")


def test_cli_converts_a_parquet_folder_and_takes_from(dataset: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["convert", str(dataset), str(tmp_path / "p.h5"), "-q"])
    assert result.exit_code == 0, result.output
    assert "packed 9 of 9 images" in result.output
    result = runner.invoke(
        cli, ["convert", str(dataset.parent), str(tmp_path / "q.h5"), "--from", "parquet", "-q"]
    )
    assert result.exit_code == 0, result.output


def test_other_shapes_of_hf_columns(folder: Path, tmp_path: Path) -> None:
    """An ``img`` column (as CIFAR's), string labels, fixed-size lists, booleans, datasets 4's
    ``List`` of a ClassLabel, a struct column left out with a note, a null label unlabelled."""
    files = sorted(folder.rglob("*.jpg"))
    features = {
        "img": {"_type": "Image"},
        "labels": {"feature": {"names": list(TAGS), "_type": "ClassLabel"}, "_type": "List"},
    }
    schema = pa.schema(
        [
            ("img", IMAGE),
            ("label", pa.string()),
            ("xy", pa.list_(pa.float32(), 2)),
            ("flag", pa.bool_()),
            ("labels", pa.list_(pa.int32())),
            ("meta", pa.struct([("a", pa.int64())])),
        ],
        metadata={"huggingface": json.dumps({"info": {"features": features}})},
    )
    rows = [
        {
            "img": {"bytes": p.read_bytes(), "path": None},
            "label": None if i == 2 else p.parent.name,
            "xy": [i, -i],
            "flag": i % 2 == 0,
            "labels": [2, 0][: i % 3],
            "meta": {"a": i},
        }
        for i, p in enumerate(files)
    ]
    data = tmp_path / "cifar.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), data, row_group_size=4)
    source = ParquetSource(data)
    assert source.notes == (
        f"the column 'meta' (struct<a: int64>) of {data} is left out: h5pack keeps numbers, "
        "strings, lists of numbers and class labels",
    )
    convert(data, tmp_path / "p.h5", ConvertOptions(workers=1))
    stored = pack_samples(tmp_path / "p.h5", ["xy", "flag", "labels"])
    for i, p in enumerate(files):
        sample = stored[f"cifar.parquet:{i}"]
        np.testing.assert_array_equal(sample["image"], decoded(p.read_bytes()))
        assert sample["label"] == (None if i == 2 else p.parent.name)
        np.testing.assert_array_equal(sample["xy"], np.float32([i, -i]))
        assert sample["flag"] == (i % 2 == 0)
        assert sample["labels"] == [TAGS[t] for t in [2, 0][: i % 3]]


def _read_all(images: list[ParquetRow]) -> list[bytes]:
    return [image.read() for image in images]


def test_a_process_that_did_not_list_reads_the_rows(dataset: Path) -> None:
    """As a Dask worker does: the rows pickle, and a fresh process opens the files itself."""
    source = ParquetSource(dataset)
    images = [source.samples[i].image for i in source.split(seed=2)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        found = pool.submit(_read_all, images).result()
    assert found == _read_all(images)  # type: ignore[arg-type]
