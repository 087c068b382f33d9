"""write/leftovers.py: what a killed conversion leaves is removed by the next one, and said.

A live conversion's files are never touched: its lock (on this machine or through another
pid namespace) or, for files without a lock file, its pid and start time say it is alive.
"""

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack.cli.main import cli
from h5pack.core.layout import Compression
from h5pack.read.reader import PackReader
from h5pack.write import arena as arena_module
from h5pack.write import leftovers
from h5pack.write import packing as packing_module
from h5pack.write.arena import Arena
from h5pack.write.convert import convert
from h5pack.write.leftovers import (
    OwnerLock,
    describe_removed,
    lock_path,
    remove_leftovers,
)
from h5pack.write.options import ConvertOptions
from h5pack.write.publish import TempFiles, temp_path
from tests.test_publish import _group_gone, _live_members, _start, needs_fork, needs_proc

SHM = Path("/dev/shm")


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "images" / "a"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(80):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / f"{i}.png")
    return root.parent


def _segments():
    """Named shared memory that a conversion could leave: multiprocessing's and h5pack's."""
    if not SHM.is_dir():
        return set()
    return {name for name in os.listdir(SHM) if name.startswith(("psm_", "h5p_"))}


def _dead_pid():
    """A pid that no process has (one that just exited)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# -- a killed conversion, then a clean one ---------------------------------------------------


@needs_proc
@needs_fork
def test_a_conversion_after_a_kill_removes_its_leftovers_and_says_so(tmp_path, source):
    target = tmp_path / "out" / "p.h5"
    target.parent.mkdir()
    segments_before = _segments()
    proc = _start(source, target, workers=2)
    try:
        while not list(target.parent.glob(".p.h5.*.tmp")):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.005)
        time.sleep(0.3)  # well into writing chunks, the arenas in use
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        assert _group_gone(proc.pid)
    finally:
        if _live_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    left = sorted(p.name for p in target.parent.iterdir())
    assert left == [f".p.h5.{proc.pid}.lock", f".p.h5.{proc.pid}.tmp"]
    # the arenas were anonymous memory: nothing named survives the kill
    assert _segments() - segments_before == set()

    events = []
    report = convert(source, target, ConvertOptions(workers=2), on_event=events.append)
    notes = [e.message for e in events if e.kind == "note"]
    assert notes == [f"removed 2 leftovers of a conversion that was killed: {left[0]}, {left[1]}"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["p.h5"]
    assert report.num_samples == 80
    assert _segments() - segments_before == set()


def test_the_cli_prints_what_it_removed(tmp_path, source):
    pid = _dead_pid()
    target = tmp_path / "p.h5"
    (tmp_path / f".p.h5.{pid}.tmp").write_bytes(b"half a pack")
    (tmp_path / f".p.h5.{pid}.tmp.blob").write_bytes(b"staged")
    result = CliRunner().invoke(cli, ["convert", str(source), str(target), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert (
        f"removed 2 leftovers of a conversion that was killed: .p.h5.{pid}.tmp, "
        f".p.h5.{pid}.tmp.blob" in result.output
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "p.h5"]


def test_write_arrays_removes_leftovers_too(tmp_path):
    from h5pack.write.convert import write_arrays

    pid = _dead_pid()
    stale = tmp_path / f".p.h5.{pid}.tmp"
    stale.write_bytes(b"half a pack")
    events = []
    samples = [np.zeros((4, 4, 3), np.uint8)] * 3
    write_arrays(tmp_path / "p.h5", samples, [0, 0, 0], on_event=events.append)
    assert not stale.exists()
    assert any(e.kind == "note" and stale.name in e.message for e in events)


# -- whose files are whose --------------------------------------------------------------


HOLDER = """
import sys, threading
from pathlib import Path
from h5pack.write.publish import TempFiles, temp_path
target = Path(sys.argv[1])
with TempFiles(target) as temps:
    temps.add(temp_path(target)).write_bytes(b"being written")
    print("ready", flush=True)
    threading.Event().wait()  # until the test kills this process
"""


@needs_proc
def test_a_live_conversions_files_are_kept_and_removed_once_it_is_killed(tmp_path):
    target = tmp_path / "p.h5"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(target)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"ready\n"
        files = sorted(tmp_path.iterdir())
        assert [p.name for p in files] == [
            f".p.h5.{holder.pid}.lock",
            f".p.h5.{holder.pid}.tmp",
        ]
        assert remove_leftovers(tmp_path) == []  # locked: alive
        holder.kill()
        holder.wait()
        assert remove_leftovers(tmp_path) == files
        assert list(tmp_path.iterdir()) == []
    finally:
        holder.kill()
        holder.communicate()


def test_a_lock_held_elsewhere_keeps_the_files_whatever_their_pid(tmp_path):
    """A conversion in another pid namespace: its pid means nothing here, its lock does."""
    pid = _dead_pid()
    lock = tmp_path / f".p.h5.{pid}.lock"
    temp = tmp_path / f".p.h5.{pid}.tmp"
    temp.write_bytes(b"being written")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: another owner
        assert remove_leftovers(tmp_path) == []
    finally:
        os.close(fd)
    assert remove_leftovers(tmp_path) == [lock, temp]


def test_files_without_a_lock_file_go_by_pid(tmp_path):
    """A pack set manifest's temporary file has no lock file: its pid decides."""
    dead = tmp_path / f".a.h5.{_dead_pid()}.tmp"
    mine = tmp_path / f".b.h5.{os.getpid()}.tmp"  # written now, by a live process
    manifest = tmp_path / f".packset.json.{_dead_pid()}.w1a2b3c4d.tmp"
    for path in (dead, mine, manifest):
        path.write_bytes(b"x")
    unrelated = [tmp_path / name for name in (".hidden", "p.h5", f".d.h5.{os.getpid()}")]
    for path in unrelated:
        path.write_bytes(b"x")
    assert remove_leftovers(tmp_path) == sorted([dead, manifest])
    assert sorted(tmp_path.iterdir()) == sorted([mine, *unrelated])


def test_owner_lock_makes_its_file_again_when_a_cleaner_removed_it(tmp_path, monkeypatch):
    path = lock_path(tmp_path / "p.h5")
    real_flock = fcntl.flock
    calls = []

    def cleaner_was_faster(fd, operation):
        real_flock(fd, operation)
        if not calls:  # between our open and our lock, a cleaner removed the file
            path.unlink()
        calls.append(operation)

    monkeypatch.setattr(fcntl, "flock", cleaner_was_faster)
    lock = OwnerLock(path)
    assert len(calls) == 2
    assert path.exists()
    assert remove_leftovers(tmp_path) == []
    lock.release()
    assert not path.exists()


def test_describe_removed_lists_a_few():
    paths = [Path(f"/d/.p.h5.{i}.tmp") for i in range(7)]
    assert describe_removed(paths[:1]) == (
        "removed 1 leftover of a conversion that was killed: .p.h5.0.tmp"
    )
    assert describe_removed(paths).endswith(".p.h5.4.tmp and 2 more")


# -- shared memory ----------------------------------------------------------------------


needs_shm = pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm")


@needs_shm
def test_an_anonymous_arena_has_no_name_anywhere():
    if not arena_module._USE_MEMFD:
        pytest.skip("no memfd here")
    before = _segments()
    arena = Arena(2, 64)
    try:
        assert arena.name == f"/proc/{os.getpid()}/fd/{arena._fd}"
        assert _segments() == before
        slot = arena.acquire()
        view = arena_module.slot_array(slot)  # how a worker opens it
        view[:3] = [7, 8, 9]
        assert arena.take(slot, 0, 3).tolist() == [7, 8, 9]
    finally:
        arena.close()


def _never(ref):
    return False  # a worker that may not open its parent's descriptors


@needs_fork
@pytest.mark.parametrize("reason", ["no memfd", "workers cannot open it"])
def test_conversion_without_an_arena_uses_pipes_and_leaves_no_segment(
    tmp_path, source, monkeypatch, reason
):
    if reason == "no memfd":
        monkeypatch.setattr(arena_module, "_USE_MEMFD", False)
    else:
        monkeypatch.setattr(packing_module, "attachable", _never)
    before = _segments()
    options = ConvertOptions(workers=2, chunk_samples=8, compression=Compression(codec="zstd"))
    report = convert(source, tmp_path / "p.h5", options)
    with PackReader(report.path) as reader:
        assert len(reader) == 80
    assert _segments() == before


def test_temp_names_match_what_the_cleaner_looks_for(tmp_path):
    target = tmp_path / "data.2024.h5"
    temp = temp_path(target)
    names = [temp, temp.with_name(temp.name + ".blob"), temp.with_name(temp.name + ".rebuilt")]
    names.append(temp_path(target, ".x"))
    with TempFiles(target) as temps:
        for path in names:
            temps.add(path).write_bytes(b"x")
        assert remove_leftovers(tmp_path) == []  # ours, and we are alive
    assert list(tmp_path.iterdir()) == []
    assert leftovers._TEMP.fullmatch(temp.name)["name"] == "data.2024.h5"
