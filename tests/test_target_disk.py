"""A target on a full or read-only file system: one clean error, nothing left, the old pack kept.

Small tmpfs file systems are mounted under ``tmp_path`` (root with CAP_SYS_ADMIN only;
skipped elsewhere) and the CLI runs in a subprocess, because the failure being guarded
against was a crash (SIGSEGV in HDF5's exit handler) after screens of "Exception ignored".
"""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5pack.core import format as fmt

REPO = Path(__file__).resolve().parents[1]
CLI = "from h5pack.cli.main import main; main()"
OLD_PACK = b"the old pack, which must survive"

# Fills the file system the moment the conversion has reserved its room, as another writer
# could: the rest of the pack must still be written into the room reserved.
GREEDY = """
import os, sys
from h5pack.write import publish
reserve = publish.TempFiles.reserve
def reserve_then_fill(self, nbytes, *, what):
    reserve(self, nbytes, what=what)
    fd = os.open(os.path.join(os.path.dirname(sys.argv[3]), "greedy"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    os.close(fd)
publish.TempFiles.reserve = reserve_then_fill
from h5pack.cli.main import main
main()
"""


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """Mount a tmpfs of ``size`` at ``path`` (skip the test where that is not allowed)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def _ballast(disk: Path, leave: int) -> None:
    """Fill ``disk`` until ``leave`` bytes are free."""
    (disk / "ballast").write_bytes(bytes(max(0, _free(disk) - leave)))


def _run(*args: str, script: str = CLI) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )


def _assert_one_clean_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("Error: ")
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in result.stderr
    assert "Exception ignored" not in result.stderr


@pytest.fixture(scope="module")
def many_small(tmp_path_factory):
    """4,000 images of 4x4 pixels: 192 KB of pixels, and more metadata than that."""
    root = tmp_path_factory.mktemp("many") / "images"
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (4000, 4, 4, 3), dtype=np.uint8)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
    for i, image in enumerate(pixels):
        path = root / "ab"[i % 2] / f"a_rather_long_file_name_{i:06d}.png"
        Image.fromarray(image).save(path)
    return root


def test_a_read_only_target_directory_is_one_clean_error(tmp_path, many_small):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "p.h5").write_bytes(OLD_PACK)
        remounted = subprocess.run(
            ["mount", "-o", "remount,ro", str(disk)], capture_output=True, check=False
        )
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remounted.stderr!r}")
        result = _run("convert", str(many_small), str(disk / "p.h5"), "--overwrite", "-q")
        _assert_one_clean_error(result, str(disk), "Read-only file system")
        assert sorted(p.name for p in disk.iterdir()) == ["p.h5"]
        assert (disk / "p.h5").read_bytes() == OLD_PACK


def test_a_disk_that_cannot_take_the_metadata_is_one_clean_error(tmp_path, many_small):
    """The pixels fit, the metadata does not: refused before HDF5 writes its metadata."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "p.h5").write_bytes(OLD_PACK)
        _ballast(disk, (192 + 100) * 1024)  # the pixels and half their metadata
        result = _run("convert", str(many_small), str(disk / "p.h5"), "--overwrite", "-q")
        _assert_one_clean_error(result, "no space left", str(disk))
        assert sorted(p.name for p in disk.iterdir()) == ["ballast", "p.h5"]
        assert (disk / "p.h5").read_bytes() == OLD_PACK


# each level converts 4,000 images: the fast subset keeps the lowest and one higher
@pytest.mark.parametrize(
    "free_kib", [64, *(pytest.param(k, marks=pytest.mark.slow) for k in (150, 250, 450)), 350]
)
def test_every_level_of_a_full_disk_ends_cleanly(tmp_path, many_small, free_kib):
    """Whatever the level, the outcome is a pack or one clean error: never a crash."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "p.h5").write_bytes(OLD_PACK)
        _ballast(disk, free_kib * 1024)
        result = _run("convert", str(many_small), str(disk / "p.h5"), "--overwrite", "-q")
        assert sorted(p.name for p in disk.iterdir()) == ["ballast", "p.h5"]
        if result.returncode == 0:
            assert fmt.load_meta(disk / "p.h5").num_samples == 4000
        else:
            _assert_one_clean_error(result, "space")
            assert (disk / "p.h5").read_bytes() == OLD_PACK


@pytest.mark.parametrize(
    "flags",
    [
        [],
        pytest.param(
            ["--compression", "zstd", "--chunk-samples", "64", "--workers", "2"],
            marks=pytest.mark.slow,
        ),
        pytest.param(["--mode", "encoded"], marks=pytest.mark.slow),
        ["--mode", "encoded", "--chunk-bytes", "4096", "--compression", "lz4"],
    ],
)
def test_the_reserved_room_holds_against_another_writer(tmp_path, many_small, flags):
    with tmpfs(tmp_path / "disk", "4m") as disk:
        target = disk / "p.h5"
        result = _run("convert", str(many_small), str(target), "-q", *flags, script=GREEDY)
        assert result.returncode == 0, result.stderr[-2000:]
        assert _free(disk) < 1 << 20  # the other writer took the rest
        assert sorted(p.name for p in disk.iterdir()) == ["greedy", "p.h5"]
        verified = _run("verify", str(target))
        assert verified.returncode == 0, verified.stdout + verified.stderr
