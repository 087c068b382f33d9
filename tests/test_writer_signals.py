"""A conversion killed midway leaves nothing under the target's name (and no temp on Ctrl-C)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5pack.write.pipeline import pool_start_method

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc"),
    # The script slows samples down by patching a module: forked workers see the patch.
    pytest.mark.skipif(pool_start_method() != "fork", reason="needs fork-started workers"),
]

# Slows every sample down (in the parent with workers=1, in the forked workers otherwise), so
# that the conversion is surely running when the signal arrives.
SCRIPT = """
import sys, time
from h5pack.write import pipeline
original = pipeline.prepare_sample
def slow(*args, **kwargs):
    time.sleep(0.03)
    return original(*args, **kwargs)
pipeline.prepare_sample = slow
from h5pack.write.options import ConvertOptions
from h5pack.write.convert import convert
convert(sys.argv[1], sys.argv[2], ConvertOptions(workers=int(sys.argv[3]), chunk_samples=2))
print("finished")
"""


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "images" / "a"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(80):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / f"{i}.png")
    return root.parent


def _start(source, target, workers):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(source), str(target), str(workers)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _temps(target):
    return sorted(target.parent.glob(f".{target.name}.*"))


def _wait_for_temp(proc, target):
    deadline = time.monotonic() + 30
    while not _temps(target):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the conversion never started writing"
        time.sleep(0.005)
    time.sleep(0.2)  # well into writing chunks
    assert proc.poll() is None


def _live_members(pgid):
    """Processes of a process group that are alive (zombies wait for init, they count as gone)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(stat.parent.name)
    return alive


def _group_gone(pgid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while _live_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_sigkill_leaves_no_target_and_no_orphan_workers(tmp_path, source):
    target = tmp_path / "out.h5"
    proc = _start(source, target, workers=2)
    try:
        _wait_for_temp(proc, target)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert not target.exists()
        assert _group_gone(proc.pid), "worker processes outlived their killed parent"
    finally:
        if _live_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("sig", "workers"), [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGTERM, 2)]
)
def test_interrupt_and_terminate_remove_the_temp_file(tmp_path, source, sig, workers):
    target = tmp_path / "out.h5"
    proc = _start(source, target, workers)
    try:
        _wait_for_temp(proc, target)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert b"finished" not in out
        assert not target.exists()
        assert _temps(target) == [], err.decode()
        assert _group_gone(proc.pid)
    finally:
        if _live_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
