"""Sharded conversion (issue 11.1): the split, reuse and refusal of shards, the manifest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from h5pack import Compression, ConvertOptions, TargetExistsError, convert, convert_set, load_meta
from h5pack.cli.convert import parse_shard
from h5pack.cli.main import cli
from h5pack.core.packset import MANIFEST_NAME, load_manifest, shard_name
from h5pack.errors import OptionsError
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.dask import INSTALL_HINT
from tests.helpers import contents

ONE = ConvertOptions(workers=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 small JPEGs in 4 classes (sorted by class), a corrupt one and a dangling link."""
    root = tmp_path_factory.mktemp("shards") / "images"
    make_image_folder(root, SampleSpec(num_images=40, num_classes=4, size=(12, 16)))
    (root / "class_02" / "broken.jpg").write_bytes(b"not a jpeg at all")
    (root / "class_01" / "dangling.jpg").symlink_to(root / "nowhere.jpg")
    return root


@pytest.fixture(scope="module")
def single(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain conversion of the folder."""
    target = tmp_path_factory.mktemp("single") / "all.h5"
    convert(folder, target, ONE)
    return target


def shard_paths(out: Path, n: int) -> list[Path]:
    return [out / shard_name(i, n) for i in range(n)]


def test_a_set_holds_every_image_once_as_one_conversion(
    folder: Path, single: Path, tmp_path: Path
) -> None:
    report = convert_set(folder, tmp_path / "set", ONE, shards=3)
    assert report.manifest == os.fspath(tmp_path / "set" / MANIFEST_NAME)
    assert [s.status for s in report.shards] == ["written"] * 3
    # Sample for sample, the shards in order are the plain conversion: same write order.
    whole = contents(single)
    assert contents(tmp_path / "set") == whole
    assert len({path for path, *_ in whole}) == len(whole) == 40
    classes = load_meta(single).classes
    metas = [load_meta(p) for p in shard_paths(tmp_path / "set", 3)]
    assert all(m.classes == classes for m in metas)
    # The write-time shuffle is global: shard 0 is not the first class's files.
    assert len(set(metas[0].labels.tolist())) >= 3  # unshuffled: class_00 and class_01
    # source_index: global scan positions, each once (41 files, the corrupt one skipped).
    positions = np.concatenate([m.source_index for m in metas]).tolist()
    assert len(set(positions)) == 40
    assert set(positions) < set(range(41))
    # Scan problems in shard 0 only; the corrupt file in the shard whose slice held it.
    skipped = [[s.path for s in m.skipped] for m in metas]
    assert "class_01/dangling.jpg" in skipped[0]
    assert sum("class_01/dangling.jpg" in s for s in skipped) == 1
    assert sum("class_02/broken.jpg" in s for s in skipped) == 1
    # The manifest counts what the shards hold (a skipped file makes one shard shorter).
    manifest = load_manifest(tmp_path / "set")
    assert [e.num_samples for e in manifest.shards] == [m.num_samples for m in metas]
    assert manifest.num_samples == 40
    assert sum(s.num_planned for s in report.shards) == 41


def test_independent_shard_runs_equal_one_run(folder: Path, tmp_path: Path) -> None:
    convert_set(folder, tmp_path / "one", ONE, shards=2)
    first = convert_set(folder, tmp_path / "apart", ONE, shards=2, only=1)
    # The manifest is written last: not while a shard is missing.
    assert first.manifest is None
    assert first.missing == (0,)
    assert not (tmp_path / "apart" / MANIFEST_NAME).exists()
    last = convert_set(folder, tmp_path / "apart", ONE, shards=2, only=0)
    assert last.manifest is not None
    assert last.missing == ()
    pairs = zip(shard_paths(tmp_path / "one", 2), shard_paths(tmp_path / "apart", 2), strict=True)
    for a, b in pairs:
        assert contents(a) == contents(b)
    assert contents(tmp_path / "apart") == contents(tmp_path / "one")


def test_a_rerun_reuses_the_shards_and_rewrites_the_manifest(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "set"
    convert_set(folder, out, ONE, shards=2)
    (out / MANIFEST_NAME).unlink()
    stamps = [p.stat().st_mtime_ns for p in shard_paths(out, 2)]
    again = convert_set(folder, out, ONE, shards=2)
    assert [s.status for s in again.shards] == ["reused", "reused"]
    assert [p.stat().st_mtime_ns for p in shard_paths(out, 2)] == stamps
    assert (out / MANIFEST_NAME).is_file()


def test_a_shard_of_another_split_is_refused_by_name(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "set"
    convert_set(folder, out, ONE, shards=2, only=0)
    name = shard_name(0, 2)
    with pytest.raises(TargetExistsError, match=rf"{name} exists but is not shard 0/2.*seed"):
        convert_set(folder, out, ConvertOptions(workers=1, seed=1), shards=2, only=0)
    zstd = ConvertOptions(workers=1, compression=Compression(codec="zstd"))
    with pytest.raises(TargetExistsError, match=rf"{name} exists.*compression"):
        convert_set(folder, out, zstd, shards=2, only=0)
    replaced = convert_set(
        folder, out, ConvertOptions(workers=1, seed=1), shards=2, only=0, overwrite=True
    )
    assert replaced.shards[0].status == "written"
    assert load_meta(out / name).shard["seed"] == 1


def test_a_damaged_shard_is_refused_by_name(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "set"
    convert_set(folder, out, ONE, shards=2)
    (out / MANIFEST_NAME).unlink()
    damaged = out / shard_name(1, 2)
    damaged.write_bytes(damaged.read_bytes()[:-4096])  # cut off, like an interrupted copy
    with pytest.raises(TargetExistsError, match=rf"{shard_name(1, 2)} exists.*cannot be read"):
        convert_set(folder, out, ONE, shards=2)
    again = convert_set(folder, out, ONE, shards=2, overwrite=True)
    assert [s.status for s in again.shards] == ["reused", "written"]
    assert again.manifest is not None


def test_a_manifest_of_another_split_is_refused(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "set"
    convert_set(folder, out, ONE, shards=2)
    with pytest.raises(TargetExistsError, match=rf"{MANIFEST_NAME} describes a pack set of 2"):
        convert_set(folder, out, ONE, shards=3)
    report = convert_set(folder, out, ONE, shards=3, overwrite=True)
    assert load_manifest(out).num_shards == 3
    assert report.manifest is not None


def test_more_shards_than_images_is_a_usage_error(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="at most 41 shards"):
        convert_set(folder, tmp_path / "set", ONE, shards=42)
    with pytest.raises(OptionsError, match="--shard 2/2"):
        convert_set(folder, tmp_path / "set", ONE, shards=2, only=2)


# A conversion that stops for good in the middle of shard 1 (after its first batch), for
# the test below to kill: its temporary file exists then.
_HANG = """
import sys, threading
from dataclasses import replace
from pathlib import Path
import h5pack.write.shards as shards
from h5pack import ConvertOptions, convert_set

original = shards.write_samples

def write_samples(target, plan, samples, table, pool, **kwargs):
    def hang(count):
        if target.name.startswith("shard-00001"):
            Path(sys.argv[3]).write_text("in shard 1")
            threading.Event().wait()  # until the test kills this process
        pool.step(count)
    return original(target, plan, samples, table, replace(pool, step=hang), **kwargs)

shards.write_samples = write_samples
convert_set(sys.argv[1], sys.argv[2], ConvertOptions(workers=1), shards=3)
"""


def test_restart_after_a_killed_shard(folder: Path, single: Path, tmp_path: Path) -> None:
    out, marker = tmp_path / "set", tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", _HANG, str(folder), str(out), str(marker)])
    try:
        while not marker.exists() and child.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), "the conversion did not reach shard 1"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    names = sorted(p.name for p in out.iterdir())
    assert shard_name(0, 3) in names
    assert shard_name(1, 3) not in names  # never half a shard under its name
    assert MANIFEST_NAME not in names
    assert any(n.startswith(f".{shard_name(1, 3)}.") for n in names)  # the killed one's
    again = convert_set(folder, out, ONE, shards=3)
    assert [s.status for s in again.shards] == ["reused", "written", "written"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(shard_name(i, 3) for i in range(3)), MANIFEST_NAME]
    )
    assert contents(out) == contents(single)


def test_cli_writes_shards_and_says_what_is_missing(folder: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "set"
    result = runner.invoke(
        cli, ["convert", str(folder), str(out), "--shard", "1/2", "--workers", "1", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert f"shard 1/2: written {shard_name(1, 2)}" in result.output
    assert "1 of 2 shards still missing (0)" in result.output
    result = runner.invoke(cli, ["convert", str(folder), str(out), "--shards", "2", "-q"])
    assert result.exit_code == 0, result.output
    assert f"shard 0/2: written {shard_name(0, 2)}" in result.output
    assert f"shard 1/2: reused {shard_name(1, 2)}" in result.output
    assert f"manifest {out / MANIFEST_NAME}" in result.output
    result = runner.invoke(cli, ["convert", str(folder), str(out), "--shards", "3", "-q"])
    assert result.exit_code == 1
    assert "describes a pack set of 2 shards" in result.output
    result = runner.invoke(
        cli, ["convert", str(folder), str(out), "--shards", "2", "--shard", "0/3"]
    )
    assert result.exit_code == 2
    assert "--shards 2 and --shard 0/3 disagree" in result.output
    result = runner.invoke(cli, ["info", str(out / shard_name(1, 2))])
    assert result.exit_code == 0, result.output
    assert "shard     1 of 2 (seed 0); read the whole set" in result.output


_NO_RANKS: dict[str, Any] = dict.fromkeys(
    ["RANK", "WORLD_SIZE", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"]
)


def test_shard_auto_reads_torchrun_then_slurm() -> None:
    assert parse_shard("3/8", {}) == (3, 8)
    assert parse_shard("auto", {"RANK": "1", "WORLD_SIZE": "2"}) == (1, 2)
    slurm = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4"}
    assert parse_shard("auto", {**slurm, "SLURM_ARRAY_TASK_MIN": "2"}) == (3, 4)
    assert parse_shard("auto", {**slurm, "SLURM_ARRAY_TASK_ID": "0"}) == (0, 4)
    # torchrun's variables win: a torchrun inside a Slurm array job splits by rank
    both = {**slurm, "RANK": "0", "WORLD_SIZE": "3"}
    assert parse_shard("auto", both) == (0, 3)
    with pytest.raises(OptionsError, match=r"RANK and WORLD_SIZE.*SLURM_ARRAY_TASK_ID"):
        parse_shard("auto", {})
    with pytest.raises(OptionsError, match="SLURM_ARRAY_TASK_ID=5 - SLURM_ARRAY_TASK_MIN=0"):
        parse_shard("auto", slurm)
    with pytest.raises(OptionsError, match="WORLD_SIZE should be an integer"):
        parse_shard("auto", {"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(OptionsError, match="--shard should be I/N"):
        parse_shard("1of2", {})
    with pytest.raises(OptionsError, match=r"should be in 0\.\.1, but got 2"):
        parse_shard("2/2", {})


def test_cli_shard_auto(folder: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["convert", str(folder), str(tmp_path / "set"), "--shard", "auto", "-q"]
    result = runner.invoke(cli, args, env=_NO_RANKS)
    assert result.exit_code == 2
    assert "RANK and WORLD_SIZE (set by torchrun)" in result.output
    env = {**_NO_RANKS, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}
    result = runner.invoke(cli, [*args, "--workers", "1"], env=env)
    assert result.exit_code == 0, result.output
    assert f"shard 1/2: written {shard_name(1, 2)}" in result.output
    recorded = json.loads(json.dumps(dict(load_meta(tmp_path / "set" / shard_name(1, 2)).shard)))
    assert (recorded["index"], recorded["num_shards"]) == (1, 2)


def test_dask_without_distributed_says_what_to_install(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    args = ["convert", str(folder), str(tmp_path / "set"), "--shards", "2", "--dask", "local"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert INSTALL_HINT in result.output
