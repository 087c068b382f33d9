"""Fields: every kind written through write_arrays reads back equal; older packs list three."""

from pathlib import Path

import h5py
import numpy as np
import pytest

from h5pack import (
    ArrayField,
    BoxesField,
    BytesField,
    MaskField,
    RaggedField,
    ScalarField,
    TextField,
)
from h5pack.core import format as fmt
from h5pack.core.fields import LEGACY_FIELDS, fields_of, parse_fields
from h5pack.core.layout import Compression
from h5pack.errors import FormatError, OptionsError
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import jpeg, random_arrays

DATA = Path(__file__).parent / "data"
FROZEN = sorted(DATA.glob("*.h5")) + sorted((DATA / "v1_1_set").glob("*.h5"))


def _values(num: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "weight": (np.arange(num) / 4).astype(np.float32),
        "count": np.arange(num, dtype=np.int64) * 7,
        "embedding": rng.random((num, 2, 3)).astype(np.float16),
        "boxes": [rng.random((i % 4, 4)).astype(np.float32) for i in range(num)],
        "caption": [f"sample {i}: ünïcode" for i in range(num)],
        "raw": [bytes(range(i % 5)) for i in range(num)],
    }


def _stored(path: str, names: list[str]) -> dict:
    meta = fmt.load_meta(path)
    fields = {f.name: f for f in fields_of(meta)}
    order = np.arange(meta.num_samples)
    with h5py.File(path) as handle:
        return {n: fields[n].read(handle, order, meta.shapes) for n in names}


def _check_equal(found, given) -> None:
    if isinstance(given, str | bytes):
        assert found == given
    else:
        np.testing.assert_array_equal(found, given)
        assert np.asarray(found).dtype == np.asarray(given).dtype


@pytest.mark.parametrize("num", [12, 13, 15])  # N mod k = 0, 1, k - 1 for k = 4
@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_every_kind_round_trips_at_chunk_boundaries(tmp_path, num, codec):
    images = random_arrays(num)
    masks = [(image[:, :, 0] > 128).astype(np.uint8) for image in images]
    given = {**_values(num), MaskField("mask"): masks}
    options = ConvertOptions(chunk_samples=4, compression=Compression(codec=codec))
    report = write_arrays(tmp_path / "p.h5", images, [0] * num, options=options, fields=given)
    kinds = {f.name: f.kind for f in fields_of(report.meta)}
    assert kinds == {
        "image": "image",
        "label": "label",
        "key": "key",
        "weight": "scalar",
        "count": "scalar",
        "embedding": "array",
        "boxes": "ragged",
        "caption": "text",
        "raw": "bytes",
        "mask": "mask",
    }
    names = [*_values(num), "mask"]
    stored = _stored(report.path, names)
    source = report.meta.source_index
    for name in names:
        values = masks if name == "mask" else _values(num)[name]
        for i in range(num):
            _check_equal(stored[name][i], values[int(source[i])])
    with h5py.File(report.path) as handle:  # the images' chunk grouping
        assert handle[fmt.field_dataset("weight")].chunks == (4,)


def test_encoded_images_carry_fields_through_skipped_samples(tmp_path):
    rng = np.random.default_rng(1)
    files = [jpeg(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)) for _ in range(5)]
    files[2] = b"not an image"
    report = write_arrays(
        tmp_path / "p.h5",
        files,
        [0] * 5,
        options=ConvertOptions(mode="encoded", chunk_bytes=4096),
        fields={"weight": np.arange(5, dtype=np.float64)},
    )
    assert report.num_samples == 4
    stored = _stored(report.path, ["weight"])["weight"]
    assert [float(w) for w in stored] == [float(s) for s in report.meta.source_index]


def test_masks_follow_a_resize_at_conversion_and_must_match_otherwise(tmp_path):
    image = np.zeros((8, 12, 3), np.uint8)
    mask = np.zeros((8, 12), np.uint8)
    mask[:, 6:] = 3
    report = write_arrays(
        tmp_path / "a.h5",
        [image],
        [0],
        options=ConvertOptions(size=(4, 6)),
        fields={MaskField("mask"): [mask]},
    )
    (stored,) = _stored(report.path, ["mask"])["mask"]
    assert stored.shape == (4, 6)
    assert stored[:, :3].max() == 0
    assert stored[:, 3:].min() == 3
    with pytest.raises(OptionsError, match="sample-000000: its 'mask' mask is 11x8"):
        write_arrays(tmp_path / "b.h5", [image], [0], fields={MaskField("mask"): [mask[:, 1:]]})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"weight": [1.0]}, "one value per sample"),
        ({"image": [1, 2]}, "a Python identifier other than"),
        ({"boxes": [np.zeros((1, 4)), np.zeros((1, 3, 1))]}, "cannot be told"),
        ({MaskField("m"): [np.zeros((2, 2)), np.zeros((2, 2))]}, "uint8 masks"),
        ({TextField("t"): [b"x", b"y"]}, "holds text"),
    ],
)
def test_bad_fields_are_refused_before_writing(tmp_path, fields, message):
    with pytest.raises(OptionsError, match=message):
        write_arrays(tmp_path / "p.h5", random_arrays(2), [0, 0], fields=fields)
    assert not (tmp_path / "p.h5").exists()


def test_listing_round_trips_and_refuses_unknown_kinds():
    fields = (
        *LEGACY_FIELDS,
        ScalarField("w", "float32"),
        ArrayField("e", "<f2", (2, 3)),
        RaggedField("b", "<f4", (4,)),
        BytesField("r"),
        TextField("t"),
        MaskField("m"),
        BoxesField("xyxy"),
    )
    from h5pack.core.fields import fields_text

    assert parse_fields(fields_text(fields), "p.h5") == fields
    with pytest.raises(FormatError, match=r"p\.h5: field 'x' is of kind 'polygon'"):
        parse_fields('[{"name": "x", "kind": "polygon"}]', "p.h5")


@pytest.mark.parametrize("path", FROZEN, ids=lambda p: p.name)
def test_frozen_packs_hold_image_label_and_key(path):
    assert fields_of(fmt.load_meta(path)) == LEGACY_FIELDS


def test_new_packs_list_their_fields_under_the_metadata_digest(tmp_path):
    report = write_arrays(tmp_path / "p.h5", random_arrays(3), [0, 1, 2])
    assert fields_of(report.meta) == LEGACY_FIELDS
    assert fmt.FIELDS_KEY in report.meta.digests
    with h5py.File(report.path, "r+") as handle:
        fmt.set_text(handle.attrs, fmt.FIELDS_KEY, '[{"name": "image", "kind": "image"}]')
    with pytest.raises(FormatError, match="'fields' no longer match"):
        fmt.load_meta(report.path)


def _pack_with_fields(path: Path) -> str:
    images = random_arrays(6)
    masks = [(image[:, :, 0] > 128).astype(np.uint8) for image in images]
    report = write_arrays(path, images, [0, 1] * 3, fields={**_values(6), MaskField("mask"): masks})
    return report.path


def test_info_lists_the_fields(tmp_path):
    from click.testing import CliRunner

    from h5pack.check import pack_info
    from h5pack.cli.main import cli

    path = _pack_with_fields(tmp_path / "p.h5")
    listed = {f["name"]: f for f in pack_info(path).to_dict()["fields"]}
    assert listed["boxes"] == {"name": "boxes", "kind": "ragged", "dtype": "<f4", "shape": [4]}
    assert listed["mask"] == {"name": "mask", "kind": "mask"}
    assert list(listed)[:3] == ["image", "label", "key"]
    result = CliRunner().invoke(cli, ["info", path])
    assert result.exit_code == 0, result.output
    assert "image, label, key, weight (scalar <f4)" in result.output
    assert "boxes (ragged <f4 x 4)" in result.output


@pytest.mark.parametrize("name", ["mask", "boxes.offsets", "caption", "weight"])
def test_verify_detects_a_damaged_field(tmp_path, name):
    from h5pack.check import verify_pack

    path = _pack_with_fields(tmp_path / "p.h5")
    assert verify_pack(path).ok
    with h5py.File(path, "r+") as handle:
        dataset = handle[fmt.field_dataset(*name.split("."))]
        first = dataset[0]
        dataset[0] = first + 1 if np.ndim(first) == 0 else np.asarray(first) + 1
    report = verify_pack(path)
    assert not report.ok
    (problem,) = report.problems
    field_name = name.split(".")[0]
    assert f"field {field_name!r}: 'fields/{name}' does not match the CRC32" in problem.message


@pytest.mark.parametrize("storage", ["array", "blob"])
def test_merge_carries_every_field_and_refuses_packs_of_other_fields(tmp_path, storage):
    from h5pack.write.merge import merge_packs

    sizes = [(8, 10)] * 5 if storage == "array" else [(8 + i, 10) for i in range(5)]
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for size in sizes]
    masks = [(image[:, :, 1] > 100).astype(np.uint8) for image in images]
    values = {**_values(5), MaskField("mask"): masks}
    chunking = {"chunk_samples": 2} if storage == "array" else {"chunk_bytes": 600}
    halves = []
    for k, part in enumerate((slice(0, 3), slice(3, 5))):
        given = {key: column[part] for key, column in values.items()}
        halves.append(
            write_arrays(
                tmp_path / f"{k}.h5",
                images[part],
                [0] * len(images[part]),
                paths=[f"{k}-{i}" for i in range(len(images[part]))],
                options=ConvertOptions(shuffle_samples=False, **chunking),
                fields=given,
            ).path
        )
    merged = merge_packs(halves, tmp_path / "m.h5", keep_order=True)
    names = [*_values(5), "mask"]
    stored = _stored(merged.path, names)
    for name in names:
        given = masks if name == "mask" else _values(5)[name]
        for i in range(5):
            _check_equal(stored[name][i], given[i])
    weight = {"weight": np.ones(1, np.float32)}
    write_arrays(tmp_path / "other.h5", images[:1], [0], paths=["x"], fields=weight)
    pattern = r"field 'count' \(scalar <i8\) is in .*0\.h5, not in .*other\.h5"
    with pytest.raises(FormatError, match=pattern):
        merge_packs([halves[0], tmp_path / "other.h5"], tmp_path / "n.h5")


def test_a_mix_joins_fields_by_name_and_names_a_missing_one(tmp_path):
    from h5pack.training.mixed import H5MixDataset

    images = random_arrays(4)
    a = write_arrays(tmp_path / "a.h5", images, [0] * 4, fields={"weight": np.ones(4)}).path
    b = write_arrays(tmp_path / "b.h5", images, [0] * 4, fields={"weight": np.zeros(4)}).path
    c = write_arrays(tmp_path / "c.h5", images, [0] * 4).path
    d = write_arrays(tmp_path / "d.h5", images, [0] * 4, fields={"weight": ["x"] * 4}).path
    assert H5MixDataset([a, b]).fields == ("image", "label", "weight")
    missing = r"field 'weight' \(scalar <f8\) is in .*a\.h5, not in .*c\.h5: .* pass fields="
    with pytest.raises(OptionsError, match=missing):
        H5MixDataset([a, c])
    with pytest.raises(OptionsError, match=missing):
        H5MixDataset([a, c], fields=["image", "weight"])
    with pytest.raises(OptionsError, match=r"field 'weight' is scalar <f8 in .*a\.h5 but text"):
        H5MixDataset([a, d])
    dropped = H5MixDataset([a, c], fields=["image", "label"])  # the field left out
    assert dropped.fields == ("image", "label")
    assert [f.name for f in fields_of(dropped.meta)] == ["image", "label", "key"]
    assert H5MixDataset([c, a], fields=["label"]).fields == ("label",)
    from h5pack.training.loader import make_loader

    loader = make_loader([a, c], 4, weights=[1, 1], fields=["label"], num_workers=0)
    assert [sorted(batch) for batch in loader] == [["label"], ["label"]]


def test_nearest_takes_each_output_pixel_from_the_source_pixel_under_its_centre():
    from h5pack.core.fields import nearest

    source = np.random.default_rng(0).integers(0, 255, (37, 53), dtype=np.uint8)
    for top, left, height, width, out_h, out_w in [(0, 0, 37, 53, 11, 70), (5, 9, 20, 13, 64, 7)]:
        rows = top + ((np.arange(out_h) + 0.5) * height / out_h).astype(int)
        cols = left + ((np.arange(out_w) + 0.5) * width / out_w).astype(int)
        found = nearest(source, (top, left, height, width), (out_h, out_w))
        np.testing.assert_array_equal(found, source[np.ix_(rows, cols)])
