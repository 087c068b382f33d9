"""Packs that cannot be one set: a pack given twice, a manifest missing shards (20 B, C, H)."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from h5pack.cli.main import cli
from h5pack.core.packset import MANIFEST_NAME
from h5pack.errors import FormatError
from h5pack.read.packset import describe
from h5pack.training.loader import make_loader
from h5pack.write.options import ConvertOptions
from h5pack.write.shards import convert_set
from tests.helpers import make_folder, make_pack


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack set of 4 shards converted from a folder of 16 images."""
    root = tmp_path_factory.mktemp("members")
    make_folder(root / "images", per_class=8)
    convert_set(root / "images", root / "set", ConvertOptions(workers=1), shards=4)
    return root / "set"


def _edited(split: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "set"
    shutil.copytree(split, copy)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    edit(manifest)
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    return copy


def _cli(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_a_pack_given_twice_is_refused_naming_both_entries(tmp_path) -> None:
    pack = make_pack(tmp_path / "a.h5")
    with pytest.raises(FormatError, match=r"a\.h5: given twice, entries 0 and 1 of the set"):
        make_loader([pack, pack], 4, num_workers=0)


def test_a_copy_of_a_pack_is_refused_by_its_pack_id(tmp_path) -> None:
    pack = make_pack(tmp_path / "a.h5")
    copy = tmp_path / "b.h5"
    shutil.copy(pack, copy)
    with pytest.raises(
        FormatError, match=r"b\.h5: the same pack as .*a\.h5 \(pack id \w+: a copy\)"
    ):
        describe([pack, copy])


def test_a_manifest_listing_a_shard_twice_fails_info_verify_and_the_loader(split, tmp_path) -> None:
    def twice(manifest):
        manifest["shards"].append(dict(manifest["shards"][0]))
        manifest["num_samples"] += manifest["shards"][0]["num_samples"]

    doubled = _edited(split, tmp_path, twice)
    with pytest.raises(
        FormatError, match=r"shard-00000-of-00004\.h5: given twice, entries 0 and 4"
    ):
        make_loader(doubled, 4, num_workers=0)
    assert _cli("info", doubled).exit_code == 1
    result = _cli("verify", doubled, "-q")
    assert result.exit_code == 1
    assert "given twice, entries 0 and 4" in result.output


def test_a_manifest_missing_a_shard_is_refused_naming_it(split, tmp_path) -> None:
    def drop(manifest):
        gone = manifest["shards"].pop(1)
        manifest["num_samples"] -= gone["num_samples"]
        manifest["num_shards"] = 3  # even a consistent-looking manifest: the shards know

    smaller = _edited(split, tmp_path, drop)
    message = r"lists 3 of the 4 shards .*: shard-00001-of-00004\.h5 not listed"
    with pytest.raises(FormatError, match=message):
        describe(smaller)
    result = _cli("info", smaller)
    assert result.exit_code == 1
    assert "shard-00001-of-00004.h5 not listed" in result.output
    result = _cli("verify", smaller, "-q")
    assert result.exit_code == 1
    assert "shard-00001-of-00004.h5 not listed" in result.output


def test_a_list_of_some_shards_of_a_split_is_a_deliberate_subset(split) -> None:
    shards = sorted(split.glob("shard-*.h5"))[:3]
    assert describe(shards).meta.num_samples == 12


def test_a_wrong_count_in_the_manifest_names_the_shard_with_the_right_numbers(split, tmp_path):
    def miscount(manifest):
        manifest["shards"][2]["num_samples"] = 6  # it holds 4; the total left alone

    wrong = _edited(split, tmp_path, miscount)
    message = r"shard-00002-of-00004\.h5: .*\(4 samples, the manifest recorded 6\)"
    with pytest.raises(FormatError, match=message):
        describe(wrong)

    def total(manifest):
        manifest["num_samples"] = 99

    wrong_total = _edited(split, tmp_path / "t", total)
    with pytest.raises(
        FormatError, match=r"holds 99 samples \(num_samples\), but its shard entries add up to 16"
    ):
        describe(wrong_total)
