"""write/publish.py: the target is checked, written under a temp name and published whole.

A conversion killed midway leaves nothing under the target's name (and no temp on Ctrl-C).
"""

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5pack.errors import H5PackError, OptionsError, TargetExistsError
from h5pack.write import publish as publish_module
from h5pack.write.pipeline import pool_start_method
from h5pack.write.publish import (
    TempFiles,
    check_not_a_source,
    check_target,
    publish,
    release_reserved,
    reserve_room,
    sigterm_as_exit,
    temp_path,
)

REPO = Path(__file__).resolve().parents[1]

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
# The script slows samples down by patching a module: forked workers see the patch.
needs_fork = pytest.mark.skipif(pool_start_method() != "fork", reason="needs fork-started workers")

# Slows every sample down (in the parent with workers=1, in the forked workers otherwise), so
# that the conversion is surely running when the signal arrives: its 80 samples take 4 s or
# more, which a busy machine only lengthens.
SCRIPT = """
import sys, time
from h5pack.write import pipeline
original = pipeline.prepare_sample
def slow(*args, **kwargs):
    time.sleep(0.1)
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
    """The conversion's temporary files (its lock file, made first, is not one)."""
    return sorted(target.parent.glob(f".{target.name}.*.tmp*"))


def _leftovers(target):
    return sorted(target.parent.glob(f".{target.name}.*"))


def _wait_for_temp(proc, target):
    while not _temps(target):
        assert proc.poll() is None, proc.communicate()
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


def _group_gone(pgid, timeout=300.0):
    deadline = time.monotonic() + timeout
    while _live_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@needs_proc
@needs_fork
def test_sigkill_leaves_no_target_and_no_orphan_workers(tmp_path, source):
    target = tmp_path / "out.h5"
    proc = _start(source, target, workers=2)
    try:
        _wait_for_temp(proc, target)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        assert not target.exists()
        assert _group_gone(proc.pid), "worker processes outlived their killed parent"
    finally:
        if _live_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


@needs_proc
@needs_fork
@pytest.mark.parametrize(
    ("sig", "workers"), [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGTERM, 2)]
)
def test_interrupt_and_terminate_remove_the_temp_file(tmp_path, source, sig, workers):
    target = tmp_path / "out.h5"
    proc = _start(source, target, workers)
    try:
        _wait_for_temp(proc, target)
        proc.send_signal(sig)
        out, err = proc.communicate()
        assert proc.returncode != 0
        assert b"finished" not in out
        assert not target.exists()
        assert _leftovers(target) == [], err.decode()
        assert _group_gone(proc.pid)
    finally:
        if _live_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


# -- the pieces, in this process -----------------------------------------------------------


def test_check_target_refuses_a_missing_directory_and_an_existing_target(tmp_path):
    with pytest.raises(OptionsError, match=r"is not a directory; create it first") as info:
        check_target(tmp_path / "no" / "p.h5", overwrite=True)
    assert str(tmp_path / "no") in str(info.value)
    with pytest.raises(OptionsError, match=r"is a directory; give the pack's file name"):
        check_target(tmp_path, overwrite=True)
    existing = tmp_path / "p.h5"
    existing.write_bytes(b"keep")
    with pytest.raises(TargetExistsError, match=r"p\.h5 already exists; pass --overwrite"):
        check_target(str(existing), overwrite=False)
    assert check_target(str(existing), overwrite=True) == existing
    assert check_target(tmp_path / "new.h5", overwrite=False) == tmp_path / "new.h5"
    assert existing.read_bytes() == b"keep"


def test_temp_name_is_hidden_beside_the_target_and_names_the_process(tmp_path):
    target = tmp_path / "p.h5"
    assert temp_path(target) == tmp_path / f".p.h5.{os.getpid()}.tmp"
    assert temp_path(target, ".x") == tmp_path / f".p.h5.{os.getpid()}.x.tmp"


def _no_hard_links(source, target):
    raise PermissionError(1, "Operation not permitted")


def _finished(tmp_path):
    temp = temp_path(tmp_path / "p.h5")
    temp.write_bytes(b"new pack")
    return temp, temp.stat().st_ino


@pytest.mark.parametrize("hard_links", [True, False])
def test_publish_without_overwrite_never_clobbers_a_target_that_appeared(
    tmp_path, monkeypatch, hard_links
):
    if not hard_links:  # a file system without them: the fallback checks first
        monkeypatch.setattr(os, "link", _no_hard_links)
    target = tmp_path / "p.h5"
    temp, inode = _finished(tmp_path)
    target.write_bytes(b"appeared meanwhile")
    with pytest.raises(TargetExistsError, match=r"p\.h5 appeared during the conversion"):
        publish(temp, target, overwrite=False)
    assert target.read_bytes() == b"appeared meanwhile"
    assert temp.exists()  # left for the caller's TempFiles to remove
    target.unlink()
    publish(temp, target, overwrite=False)
    assert target.read_bytes() == b"new pack"
    assert target.stat().st_ino == inode  # the same file, linked or renamed, never copied
    assert not temp.exists()


def test_publish_with_overwrite_replaces_in_one_rename(tmp_path, monkeypatch):
    target = tmp_path / "p.h5"
    target.write_bytes(b"old pack")
    temp, inode = _finished(tmp_path)
    calls = []
    real_replace = os.replace

    def replace(source, destination):
        calls.append((source, destination))
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", replace)
    publish(temp, target, overwrite=True)
    assert calls == [(temp, target)]  # rename(2): readers see the old file or the new one
    assert target.read_bytes() == b"new pack"
    assert target.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.h5"]


def test_publish_without_hard_links_never_clobbers_a_target_that_appears_at_the_last_moment(
    tmp_path, monkeypatch
):
    """The fallback renames with renameat2(RENAME_NOREPLACE): no check-then-replace race."""
    monkeypatch.setattr(os, "link", _no_hard_links)
    target = tmp_path / "p.h5"
    temp, _ = _finished(tmp_path)
    real_replace = os.replace
    real_rename = publish_module._renameat2

    def appears_first(source, destination, *args):  # another writer wins the race
        target.write_bytes(b"appeared meanwhile")
        return (real_rename if args else real_replace)(source, destination, *args)

    monkeypatch.setattr(os, "replace", appears_first)
    monkeypatch.setattr(publish_module, "_renameat2", appears_first)
    with pytest.raises(TargetExistsError, match=r"p\.h5 appeared during the conversion"):
        publish(temp, target, overwrite=False)
    assert target.read_bytes() == b"appeared meanwhile"
    assert temp.exists()


def test_publish_falls_back_to_check_and_replace_without_renameat2(tmp_path, monkeypatch):
    def unsupported(source, target, flags):
        raise OSError(errno.ENOSYS, "renameat2 is not available")

    monkeypatch.setattr(os, "link", _no_hard_links)
    monkeypatch.setattr(publish_module, "_renameat2", unsupported)
    target = tmp_path / "p.h5"
    temp, inode = _finished(tmp_path)
    publish(temp, target, overwrite=False)
    assert target.stat().st_ino == inode
    assert not temp.exists()


def test_publish_failure_is_an_h5pack_error(tmp_path):
    temp, _ = _finished(tmp_path)
    temp.unlink()
    with pytest.raises(H5PackError, match=r"cannot move .*p\.h5"):
        publish(temp, tmp_path / "p.h5", overwrite=True)


def test_check_not_a_source_refuses_the_same_file_however_it_is_named(tmp_path):
    images = tmp_path / "images" / "a"
    images.mkdir(parents=True)
    source = images / "0.jpg"
    source.write_bytes(b"a photo")
    other = images / "1.jpg"
    other.write_bytes(b"another photo")
    sources = [source, other]
    with pytest.raises(OptionsError, match="one of the images being packed") as info:
        check_not_a_source(source, sources)
    assert f"the target {source} is {source}," in str(info.value)
    link = tmp_path / "link.h5"
    link.symlink_to(source)
    with pytest.raises(OptionsError, match="through a symbolic link"):
        check_not_a_source(link, sources)
    hard = tmp_path / "hard.h5"
    os.link(source, hard)
    with pytest.raises(OptionsError, match=re.escape(f"{hard} is a hard link to {source}")):
        check_not_a_source(hard, sources)
    # a source that is a symlink to the target: the pack would replace what it points to
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(b"a photo kept elsewhere")
    (images / "2.jpg").symlink_to(outside)
    with pytest.raises(OptionsError, match=r"outside\.jpg"):
        check_not_a_source(outside, [*sources, images / "2.jpg"])
    unrelated = tmp_path / "p.h5"
    unrelated.write_bytes(b"an old pack")
    check_not_a_source(unrelated, sources)
    check_not_a_source(tmp_path / "new.h5", sources)
    assert source.read_bytes() == b"a photo"


def test_temp_files_remove_all_removes_its_files_only(tmp_path):
    temps = TempFiles()
    kept = tmp_path / "kept"
    kept.write_bytes(b"x")
    made = [temps.add(tmp_path / name) for name in ("a.tmp", "b.blob", "never-created")]
    assert made == temps.paths
    for path in made[:2]:
        path.write_bytes(b"partial")
    temps.remove_all()
    temps.remove_all()  # twice is harmless
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def _sigterm_self():
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the handler runs between bytecodes
        time.sleep(0.001)


def test_sigterm_becomes_system_exit_inside_and_is_restored_after():
    previous = signal.getsignal(signal.SIGTERM)
    with sigterm_as_exit(), pytest.raises(SystemExit) as info:
        _sigterm_self()
    assert info.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous


def test_temp_files_remove_all_never_raises_and_removes_the_rest(tmp_path, caplog):
    temps = TempFiles()
    stuck = temps.add(tmp_path / "stuck")
    stuck.mkdir()  # unlink fails (IsADirectoryError), as on a read-only file system
    removable = temps.add(tmp_path / "b.tmp")
    removable.write_bytes(b"partial")
    temps.remove_all()
    assert not removable.exists()
    assert "could not remove" in caplog.text
    assert str(stuck) in caplog.text


def test_temp_files_hold_the_lock_file_while_open(tmp_path):
    target = tmp_path / "p.h5"
    with TempFiles(target) as temps:
        lock = tmp_path / f".p.h5.{os.getpid()}.lock"
        assert lock.exists()
        temps.add(temp_path(target)).write_bytes(b"partial")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_temp_files_refuse_a_directory_they_cannot_write(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "open", read_only)
    message = f"cannot write in {tmp_path}: Read-only file system"
    with pytest.raises(H5PackError, match=re.escape(message)):
        TempFiles(tmp_path / "p.h5").__enter__()


def test_reserved_room_is_allocated_past_the_end_and_given_back(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    size = path.stat().st_size
    reserved = reserve_room(path, 1 << 20, what="a test")
    if reserved == 0:
        pytest.skip("this file system cannot reserve room (no fallocate)")
    assert path.stat().st_size == size  # the size is kept
    assert path.stat().st_blocks * 512 >= 1 << 20
    release_reserved(path, reserved)
    assert path.stat().st_blocks * 512 < 1 << 20
    assert path.read_bytes() == b"x" * 4096


def test_reserving_more_than_is_free_is_a_clean_error(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with pytest.raises(H5PackError, match=r"no space left on the device of .* for a test"):
        reserve_room(path, 1 << 62, what="a test")
