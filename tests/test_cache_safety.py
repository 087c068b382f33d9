"""The disk cache against another user, damage on the way or on disk, and a failing disk.

Issue 28: a private directory checked before use; every downloaded chunk checked (by the
reader, which decompresses it once) before it is cached or served; a damaged cached file
evicted with a warning naming it; a cache that cannot be written read around with one
warning; the budget bounding the whole directory.
Counts of GETs (the local S3 server's proxy), never times.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import stat
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from h5pack.core.layout import Compression
from h5pack.core.private import UnsafeDirectoryError, user_cache_dir
from h5pack.core.s3source import S3Source
from h5pack.read.diskcache import DiskCacheWarning
from h5pack.read.reader import ReaderOptions
from h5pack.training.epochs import EpochSpec
from h5pack.training.loader import make_loader
from tests.helpers import jpeg, make_pack, random_arrays, table_of_pack
from tests.s3local import Bucket

ROOT = os.geteuid() == 0
NOBODY = 65534


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack of 60 incompressible zstd chunks, 3.3 MB: more than a 2 MiB file system."""
    path = tmp_path_factory.mktemp("pack") / "p.h5"
    samples = random_arrays(480, shape=(48, 48, 3), seed=5)
    return make_pack(path, samples=samples, chunk_samples=8, compression=Compression(codec="zstd"))


@pytest.fixture(scope="module")
def local(pack: Path) -> list[tuple[int, bytes]]:
    return epoch(make_loader(pack, batch_size=16, num_workers=0, shuffle=False))


def epoch(loader: object, after_batch: object = None) -> list[tuple[int, bytes]]:
    seen = []
    for images, labels in loader:  # type: ignore[attr-defined]
        seen.extend(zip(labels.tolist(), [i.numpy().tobytes() for i in images], strict=True))
        if callable(after_batch):
            after_batch()
    return seen


def remote(bucket: Bucket, url: str, cache: Path, workers: int = 0, **reader: object) -> object:
    options = ReaderOptions(disk_cache_dir=cache, **reader)  # type: ignore[arg-type]
    return make_loader(
        url,
        batch_size=EpochSpec(batch_size=16, window_chunks=1),
        shuffle=False,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        storage_options=bucket.storage_options,
        reader=options,
    )


def chunk_gets(bucket: Bucket, pack: Path, *, nbytes: bool = False) -> int:
    """Return the ranged GETs of the pack's chunks since the last count (or their bytes).

    A GET may span several chunks adjacent in the plan and the file (read-ahead merging).
    """
    first = int(table_of_pack(pack)[0].min())
    found = 0
    for _, said in bucket.proxy.reset_counts().ranges:
        low, _, high = said.removeprefix("bytes=").partition("-")
        if low and int(low) >= first:
            found += int(high) - int(low) + 1 if nbytes else 1
    return found


# -- another user ----------------------------------------------------------------------


@pytest.mark.skipif(not ROOT, reason="needs root, to give the directory to another uid")
def test_a_directory_of_another_user_is_refused(s3_bucket: Bucket, pack: Path, tmp_path: Path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    url = s3_bucket.put(pack, "p.h5")
    with pytest.raises(UnsafeDirectoryError, match=rf"{theirs} belongs to uid {NOBODY}"):
        epoch(remote(s3_bucket, url, theirs))
    assert list(theirs.iterdir()) == []  # nothing written into it


def test_a_planted_symlink_is_refused_and_nothing_is_written_outside(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("mine")
    planted = tmp_path / "cache"
    planted.symlink_to(victim)
    url = s3_bucket.put(pack, "p.h5")
    with pytest.raises(UnsafeDirectoryError, match=rf"{planted} is a symbolic link \(to {victim}"):
        epoch(remote(s3_bucket, url, planted))
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt"]
    assert (victim / "notes.txt").read_text() == "mine"


def test_a_directory_others_can_write_is_refused(s3_bucket: Bucket, pack: Path, tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # /tmp-like
    url = s3_bucket.put(pack, "p.h5")
    with pytest.raises(UnsafeDirectoryError, match=r"is writable by other users \(mode 1777\)"):
        epoch(remote(s3_bucket, url, shared))


def test_the_default_is_the_user_s_cache_private_to_them(
    s3_bucket: Bucket, pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "h5pack"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "h5pack"
    url = s3_bucket.put(pack, "p.h5")
    epoch(remote(s3_bucket, url, user_cache_dir()))
    assert stat.S_IMODE(user_cache_dir().stat().st_mode) == 0o700
    found = [(p, stat.S_IMODE(p.lstat().st_mode)) for p in user_cache_dir().rglob("*")]
    assert {m for p, m in found if p.is_dir()} == {0o700}
    assert {m for p, m in found if p.is_file()} == {0o600}
    names = {p.relative_to(user_cache_dir()).parts[0] for p, _ in found}
    assert {"ledger.sqlite", "chunks"} <= names
    assert len([p for p, _ in found if p.parent.name == "chunks"]) == 1  # the pack's folder


# -- damage ------------------------------------------------------------------------------


@pytest.fixture
def one_flipped_answer(monkeypatch: pytest.MonkeyPatch, pack: Path) -> list[int]:
    """Flip one byte in the first answer of a chunk's GET (a body changed on the way)."""
    offsets, sizes = table_of_pack(pack)
    size_at = dict(zip(offsets.tolist(), sizes.tolist(), strict=True))
    real = S3Source.read_ranges
    flipped: list[int] = []

    def read_ranges(self: S3Source, ranges: list[tuple[int, int]]) -> list[memoryview]:
        answers = real(self, ranges)
        for k, (start, _) in enumerate(ranges):
            if not flipped and start in size_at:  # the answer starts with a chunk: in it
                damaged = bytearray(answers[k])
                damaged[size_at[start] // 2] ^= 0x10
                answers[k] = memoryview(bytes(damaged))
                flipped.append(start)
        return answers

    monkeypatch.setattr(S3Source, "read_ranges", read_ranges)
    return flipped


def test_one_flipped_get_body_is_fetched_again_never_cached(
    s3_bucket: Bucket, pack: Path, local: list, tmp_path: Path, one_flipped_answer: list[int]
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    offsets, sizes = table_of_pack(pack)
    s3_bucket.proxy.reset_counts()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiskCacheWarning)  # the cache was never wrong
        assert epoch(remote(s3_bucket, url, tmp_path / "c")) == local
        assert one_flipped_answer  # it happened
        again = int(sizes[list(offsets).index(one_flipped_answer[0])])
        # every chunk once, and the damaged one again
        assert chunk_gets(s3_bucket, pack, nbytes=True) == int(sizes.sum()) + again
        assert epoch(remote(s3_bucket, url, tmp_path / "c")) == local  # the next run
    assert chunk_gets(s3_bucket, pack) == 0  # every chunk from a healthy cache


def test_the_first_epoch_decompresses_each_chunk_once(
    s3_bucket: Bucket, pack: Path, local: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from h5pack.read.direct import ChunkTable

    real, decompressed = ChunkTable.decompress_into, []

    def counted(self: ChunkTable, chunk: int, data: object, out: object) -> None:
        decompressed.append(chunk)
        real(self, chunk, data, out)  # type: ignore[arg-type]

    monkeypatch.setattr(ChunkTable, "decompress_into", counted)
    url = s3_bucket.put(pack, "p.h5")
    s3_bucket.proxy.reset_counts()
    assert epoch(remote(s3_bucket, url, tmp_path / "c")) == local  # downloaded, checked
    sizes = table_of_pack(pack)[1]
    assert sorted(decompressed) == list(range(len(sizes)))  # by the reader, once each
    assert chunk_gets(s3_bucket, pack, nbytes=True) == int(sizes.sum())
    assert epoch(remote(s3_bucket, url, tmp_path / "c")) == local
    assert chunk_gets(s3_bucket, pack) == 0  # then cached, as checked


def other_pack(tmp_path: Path, kind: str) -> Path:
    """An encoded (JPEG blob) pack, or a contiguous uncompressed one: other piece shapes."""
    if kind == "contiguous":
        samples = random_arrays(300, shape=(32, 32, 3), seed=2)  # 0.9 MB
        return make_pack(tmp_path / "c.h5", samples=samples, layout="contiguous")
    from h5pack.write.convert import convert
    from h5pack.write.options import ConvertOptions

    folder = tmp_path / "images"
    for i, image in enumerate(random_arrays(120, shape=(64, 48, 3), seed=3)):  # ~1 MB
        (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (folder / f"c{i % 2}" / f"{i}.jpg").write_bytes(jpeg(image))
    convert(folder, tmp_path / "e.h5", ConvertOptions(mode="encoded", chunk_bytes=16384))
    return tmp_path / "e.h5"


@pytest.mark.parametrize("kind", ["encoded", "contiguous"])
def test_a_flipped_body_of_other_layouts_is_fetched_again(
    s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    path = other_pack(tmp_path, kind)
    want = epoch(make_loader(path, batch_size=16, num_workers=0, shuffle=False))
    real = S3Source.read_ranges
    flipped: list[int] = []

    def read_ranges(self: S3Source, ranges: list[tuple[int, int]]) -> list[memoryview]:
        answers = real(self, ranges)
        if not flipped and answers and len(answers[0]) > 1000:  # data, not the index
            damaged = bytearray(answers[0])
            damaged[len(damaged) // 2] ^= 0x10
            answers[0] = memoryview(bytes(damaged))
            flipped.append(ranges[0][0])
        return answers

    monkeypatch.setattr(S3Source, "read_ranges", read_ranges)
    url = s3_bucket.put(path, "p.h5")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiskCacheWarning)
        assert epoch(remote(s3_bucket, url, tmp_path / "cache")) == want
        assert flipped
        s3_bucket.proxy.reset_counts()
        assert epoch(remote(s3_bucket, url, tmp_path / "cache")) == want
    opening = {"bytes=-262144", "bytes=0-262143"}  # the index (rclone: no suffix ranges)
    assert {r for _, r in s3_bucket.proxy.reset_counts().ranges} <= opening  # pieces: cached


def test_a_body_wrong_every_time_is_one_error_naming_object_bytes_and_cause(
    s3_bucket: Bucket, pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets, sizes = table_of_pack(pack)
    real = S3Source.read_ranges

    def damaged(self: S3Source, ranges: list[tuple[int, int]]) -> list[memoryview]:
        answers = real(self, ranges)
        return [
            memoryview(bytes(a) if s < offsets.min() else bytes(len(a)))  # zeros
            for a, (s, _) in zip(answers, ranges, strict=True)
        ]

    monkeypatch.setattr(S3Source, "read_ranges", damaged)
    url = s3_bucket.put(pack, "p.h5")
    begin, end = int(offsets[0]), int(offsets[0] + sizes[0] - 1)
    with pytest.raises(Exception, match=rf"{url}: bytes {begin}-{end} \(chunk 0\) .* in each of 3"):
        epoch(remote(s3_bucket, url, tmp_path / "c"))
    cached = list((tmp_path / "c" / "chunks").rglob("*"))
    assert [p for p in cached if p.is_file()] == []  # nothing damaged was kept


def test_a_damaged_cached_file_is_evicted_fetched_again_and_named(
    s3_bucket: Bucket, pack: Path, local: list, tmp_path: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    assert epoch(remote(s3_bucket, url, tmp_path / "c")) == local
    victim = sorted((tmp_path / "c" / "chunks").rglob("*"))[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x01
    victim.write_bytes(bytes(data))
    s3_bucket.proxy.reset_counts()
    with pytest.warns(DiskCacheWarning, match=rf"file {victim} does not match the digest"):
        assert epoch(remote(s3_bucket, url, tmp_path / "c")) == local
    assert chunk_gets(s3_bucket, pack) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiskCacheWarning)
        assert epoch(remote(s3_bucket, url, tmp_path / "c")) == local
    assert chunk_gets(s3_bucket, pack) == 0


# -- a disk that fails -------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if not ROOT:
        pytest.skip("needs root, to mount a 2 MiB tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)])
    if done.returncode:
        pytest.skip("this machine does not let the tests mount a tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_file_system_warns_once_and_the_epoch_completes(
    s3_bucket: Bucket, pack: Path, local: list, small_disk: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    with pytest.warns(DiskCacheWarning) as caught:  # a budget above the disk: it fills
        assert epoch(remote(s3_bucket, url, small_disk / "c", disk_cache_bytes=10**9)) == local
    said = [str(w.message) for w in caught if w.category is DiskCacheWarning]
    assert len(said) == 1, said
    assert f"the disk cache {small_disk / 'c'} cannot be used" in said[0]
    assert "reading on without it" in said[0]
    assert not list((small_disk / "c").rglob("*.tmp"))
    shutil.rmtree(small_disk / "c")
    # DataLoader workers: each its own cache, each warns once in its process; the run goes on
    with warnings.catch_warnings():  # the forked workers' filters: a warning, not an error
        warnings.simplefilter("default", DiskCacheWarning)
        loader = remote(s3_bucket, url, small_disk / "c", workers=2, disk_cache_bytes=10**9)
        assert sorted(epoch(loader)) == sorted(local)


def test_a_cache_removed_during_the_run_is_made_again(
    s3_bucket: Bucket, pack: Path, local: list, tmp_path: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    cache = tmp_path / "c"
    batches = []

    def remove_after_the_third() -> None:
        batches.append(1)
        if len(batches) == 3:
            shutil.rmtree(cache)  # a cleaner of old files

    with pytest.warns(DiskCacheWarning, match=rf"{cache} was removed .* it is made again"):
        assert epoch(remote(s3_bucket, url, cache), remove_after_the_third) == local
    assert (cache / "ledger.sqlite").exists()
    s3_bucket.proxy.reset_counts()
    assert epoch(remote(s3_bucket, url, cache)) == local
    assert chunk_gets(s3_bucket, pack) < len(table_of_pack(pack)[0])  # it caches again


# -- the budget bounds the directory -----------------------------------------------------


def du(path: Path) -> int:
    found = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True)
    return int(found.stdout.split()[0]) if found.returncode == 0 else 0


def _read_and_measure(url: str, storage: dict, cache: str, budget: int, out: str) -> None:
    loader = make_loader(
        url,
        batch_size=EpochSpec(batch_size=16, window_chunks=1),
        seed=int(out[-1]),
        num_workers=0,
        storage_options=storage,
        reader=ReaderOptions(disk_cache_dir=cache, disk_cache_bytes=budget),
    )
    sizes = []
    for e in range(2):
        loader.set_epoch(e)  # type: ignore[attr-defined]
        epoch(loader, lambda: sizes.append(du(Path(cache))))
    Path(out).write_text(" ".join(map(str, sizes)))


def test_two_processes_keep_the_whole_directory_within_the_budget(
    s3_bucket: Bucket, pack: Path, tmp_path: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    budget = 2 * 2**20  # about 60% of the pack
    context = multiprocessing.get_context("fork")
    outs = [str(tmp_path / f"du{k}") for k in range(2)]
    args = [(url, s3_bucket.storage_options, str(tmp_path / "c"), budget, o) for o in outs]
    procs = [context.Process(target=_read_and_measure, args=a) for a in args]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
        assert proc.exitcode == 0
    sizes = [int(s) for out in outs for s in Path(out).read_text().split()]
    assert len(sizes) == 2 * 2 * 30  # a figure after every batch of both
    assert max(sizes) <= budget * 1.05, max(sizes)
    assert max(sizes) > budget // 2  # it was used


# -- the other directories h5pack reuses --------------------------------------------------


def test_a_sweep_of_dead_staging_touches_only_this_user_s(tmp_path: Path) -> None:
    from h5pack.write.remote import Staging

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (tmp_path / "h5pack-staging-2-planted").symlink_to(outside)
    theirs = tmp_path / "h5pack-staging-3-theirs"
    theirs.mkdir()
    if ROOT:
        os.chown(theirs, NOBODY, NOBODY)
    dead = tmp_path / "h5pack-staging-1-dead"
    dead.mkdir()  # this user's, no lock: killed before it made one
    with Staging(tmp_path, what="a pack") as staging:
        assert staging.removed == [dead]
        assert stat.S_IMODE(staging.path.stat().st_mode) == 0o700
    assert (outside / "keep.txt").read_text() == "mine"
    assert theirs.is_dir() == ROOT  # as root, another uid's stays (as a user: it was ours)


def test_a_read_only_cache_warns_once_and_the_epoch_completes(
    s3_bucket: Bucket, pack: Path, local: list, small_disk: Path
) -> None:
    url = s3_bucket.put(pack, "p.h5")
    budget = 2**20
    filling = multiprocessing.get_context("fork").Process(
        target=_read_and_measure,
        args=(url, s3_bucket.storage_options, str(small_disk / "c"), budget, str(small_disk / "0")),
    )
    filling.start()  # in a process of its own: once it exits, nothing holds the disk open
    filling.join(300)
    assert filling.exitcode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with pytest.warns(DiskCacheWarning) as caught:
        assert epoch(remote(s3_bucket, url, small_disk / "c")) == local
    said = [str(w.message) for w in caught if w.category is DiskCacheWarning]
    assert len(said) == 1, said
    assert "cannot be used" in said[0]
    with pytest.warns(DiskCacheWarning, match=r"new cannot be used \(.*Read-only file system"):
        assert epoch(remote(s3_bucket, url, small_disk / "new")) == local  # cannot be made
