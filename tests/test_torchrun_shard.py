"""``--shard auto`` under torchrun: 2 local ranks build both shards and the manifest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from h5pack import ConvertOptions, convert
from h5pack.core.packset import MANIFEST_NAME, load_manifest, shard_name
from h5pack.read.setreader import open_reader
from h5pack.synthetic import SampleSpec, make_image_folder

pytest.importorskip("torch.distributed.run")


@pytest.mark.slow
def test_torchrun_ranks_build_the_set(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    make_image_folder(folder, SampleSpec(num_images=24, num_classes=3, size=(12, 16)))
    out = tmp_path / "set"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD"))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", "-m", "h5pack", "convert", str(folder), str(out)]
    command += ["--shard", "auto", "-q"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"shard 0/2: written {shard_name(0, 2)}" in done.stdout
    assert f"shard 1/2: written {shard_name(1, 2)}" in done.stdout
    # whichever rank finished last wrote the manifest
    assert load_manifest(out).num_shards == 2
    assert (out / MANIFEST_NAME).is_file()
    convert(folder, tmp_path / "one.h5", ConvertOptions(workers=1))
    with open_reader(out) as shards, open_reader(tmp_path / "one.h5") as one:
        assert list(shards.paths) == list(one.paths)
        assert shards.meta.labels.tolist() == one.meta.labels.tolist()
        assert [a.tobytes() for a in shards.read_images(range(24))] == [
            b.tobytes() for b in one.read_images(range(24))
        ]
