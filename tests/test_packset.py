"""Pack sets: the manifest, reading shards as one pack, refusals that name the file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.core.packset import (
    MANIFEST_NAME,
    PackSetManifest,
    ShardEntry,
    load_manifest,
    shard_name,
    shard_slice,
    write_manifest,
)
from h5pack.errors import FormatError, OptionsError, PackNotFoundError
from h5pack.read.packset import describe
from h5pack.read.reader import ReaderOptions
from h5pack.read.setreader import PackSetReader, open_reader
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

SHAPE = (6, 5, 3)


def _images(num: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(num)]


def make_set(root: Path, counts=(7, 5, 9), codec: str = "zstd") -> tuple[Path, list[np.ndarray]]:
    """Shards of a set (written with write_arrays) and their manifest; returns the images."""
    root.mkdir(parents=True, exist_ok=True)
    every, entries = [], []
    options = ConvertOptions(chunk_samples=3, compression=Compression(codec=codec), seed=1)
    for index, count in enumerate(counts):
        images = _images(count, seed=index)
        labels = [(i + index) % 3 for i in range(count)]
        path = root / shard_name(index, len(counts))
        names = [f"s{index}/img_{i}.png" for i in range(count)]
        write_arrays(path, images, labels, options=options, classes=["a", "b", "c"], paths=names)
        meta = fmt.load_meta(path)
        every.extend(images[int(s)] for s in meta.source_index)  # in pack order
        entries.append(ShardEntry.of(path, meta))
    manifest = PackSetManifest(
        root=root,
        shards=tuple(entries),
        classes=("a", "b", "c"),
        num_samples=sum(counts),
        seed=1,
        num_shards=len(counts),
    )
    write_manifest(manifest)
    return root, every


def test_shard_slices_cover_every_position_once() -> None:
    for num in (0, 1, 7, 100):
        for shards in (1, 3, 8):
            covered = [i for s in range(shards) for i in range(*shard_slice(num, s, shards))]
            assert covered == list(range(num))
    with pytest.raises(OptionsError, match="--shard 3/3"):
        shard_slice(10, 3, 3)


def test_manifest_round_trips_and_is_written_atomically(tmp_path) -> None:
    root, _ = make_set(tmp_path / "set")
    manifest = load_manifest(root)
    assert manifest.num_samples == 21
    assert [e.num_samples for e in manifest.shards] == [7, 5, 9]
    assert load_manifest(root / MANIFEST_NAME) == manifest
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []


def test_reader_serves_every_shard_as_one_pack(tmp_path) -> None:
    root, images = make_set(tmp_path / "set")
    with PackSetReader(root) as reader:
        assert len(reader) == 21
        assert reader.chunk_map.num_chunks == 3 + 2 + 3
        order = np.random.default_rng(0).permutation(21)
        for i, got in zip(order, reader.read_images(order), strict=True):
            np.testing.assert_array_equal(got, images[i])
        batch = np.empty((21, *SHAPE), dtype=np.uint8)
        reader.read_into(order, batch)
        np.testing.assert_array_equal(batch, np.stack([images[i] for i in order]))
        shard_one = fmt.load_meta(root / shard_name(1, 3))
        assert reader.paths[7] == f"s1/img_{int(shard_one.source_index[0])}.png"
        assert len(reader.paths) == 21
        assert reader.meta.classes == ("a", "b", "c")


def test_one_window_over_all_shards_decompresses_each_chunk_once(tmp_path) -> None:
    root, _ = make_set(tmp_path / "set", counts=(6, 6, 6, 6))
    with PackSetReader(root, ReaderOptions(window_chunks=2)) as reader:
        for group in range(reader.chunk_map.num_chunks):  # chunk by chunk, twice each
            samples = list(reader.chunk_map.samples(group))
            reader.read_stored(samples[:1])
            reader.read_stored(samples[1:])
        assert reader.loads == reader.chunk_map.num_chunks


def test_open_files_are_bounded(tmp_path) -> None:
    root, images = make_set(tmp_path / "set", counts=(2,) * 12, codec="none")
    with PackSetReader(root, max_open=3) as reader:
        for i in range(len(reader)):
            np.testing.assert_array_equal(reader.read_images([i])[0], images[i])
            assert reader.open_shards <= 3


def test_a_list_of_packs_is_a_set(tmp_path) -> None:
    root, images = make_set(tmp_path / "set")
    paths = [root / shard_name(i, 3) for i in range(3)]
    view = describe(paths)
    assert view.meta.num_samples == 21
    with PackSetReader(paths) as reader:
        np.testing.assert_array_equal(reader.read_images([20])[0], images[20])


def test_missing_changed_and_mismatched_shards_are_refused_by_name(tmp_path) -> None:
    root, _ = make_set(tmp_path / "missing")
    (root / shard_name(1, 3)).unlink()
    with pytest.raises(PackNotFoundError, match=shard_name(1, 3)):
        PackSetReader(root)

    root, _ = make_set(tmp_path / "changed")
    victim = root / shard_name(2, 3)
    write_arrays(
        victim,
        _images(9, seed=99),
        [0] * 9,
        options=ConvertOptions(chunk_samples=3),
        overwrite=True,
        classes=["a", "b", "c"],
    )
    with pytest.raises(FormatError, match=rf"{shard_name(2, 3)}: the shard changed"):
        PackSetReader(root)

    root, _ = make_set(tmp_path / "truncated")
    victim = root / shard_name(0, 3)
    os.truncate(victim, victim.stat().st_size // 2)
    with pytest.raises(FormatError, match=shard_name(0, 3)):
        PackSetReader(root)

    other = tmp_path / "other.h5"
    write_arrays(other, _images(4, 5), [0] * 4, options=ConvertOptions(), classes=["x"])
    with pytest.raises(FormatError, match="cannot join a pack set"):
        PackSetReader([root / shard_name(1, 3), other])

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PackNotFoundError, match="no pack set manifest"):
        PackSetReader(empty)


def test_a_shard_replaced_after_opening_is_refused_when_reopened(tmp_path) -> None:
    root, _ = make_set(tmp_path / "set")
    reader = PackSetReader(root, max_open=1)
    reader.read_images([0])
    victim = root / shard_name(0, 3)
    replacement = tmp_path / "replacement.h5"
    write_arrays(
        replacement,
        _images(7, seed=42),
        [1] * 7,
        options=ConvertOptions(chunk_samples=3),
        classes=["a", "b", "c"],
    )
    reader.read_images([20])  # opens shard 2, closes shard 0
    os.replace(replacement, victim)
    with pytest.raises(FormatError, match="replaced since the pack set"):
        reader.read_images([0])
    reader.close()


def test_newer_or_foreign_manifests_are_refused(tmp_path) -> None:
    root, _ = make_set(tmp_path / "set")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["h5pack_packset"] = 99
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError, match="upgrade h5pack"):
        load_manifest(root)
    (root / MANIFEST_NAME).write_text("{}")
    with pytest.raises(FormatError, match="not an h5pack pack set manifest"):
        load_manifest(root)


def test_a_reader_from_a_view_reads_the_files_the_view_checked(tmp_path) -> None:
    root, images = make_set(tmp_path / "set")
    view = describe(root)
    assert view.is_set
    assert view.num_shards == 3
    assert [s.num_samples for s in view.shards] == [7, 5, 9]
    with open_reader(root, view=view) as reader:  # no metadata read again
        assert isinstance(reader, PackSetReader)
        assert reader.meta is view.meta
        np.testing.assert_array_equal(reader.read_images([8])[0], images[8])
    victim = root / shard_name(1, 3)
    replacement = tmp_path / "replacement.h5"
    write_arrays(
        replacement,
        _images(5, seed=42),
        [1] * 5,
        options=ConvertOptions(chunk_samples=3),
        classes=["a", "b", "c"],
    )
    os.replace(replacement, victim)
    with open_reader(root, view=view) as reader:  # e.g. a DataLoader worker, after the swap
        np.testing.assert_array_equal(reader.read_images([0])[0], images[0])  # shard 0: fine
        with pytest.raises(FormatError, match=shard_name(1, 3)):
            reader.read_images([8])


_UNDER_A_LOW_ULIMIT = """
import resource, sys
import numpy as np
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), hard))
from h5pack.training.loader import make_loader
root, want = sys.argv[1], np.load(sys.argv[2])
loader = make_loader(root, batch_size=8, num_workers=0, shuffle=True, seed=3)
seen = np.zeros(len(want), np.int64)
for images, labels in loader:
    for image in images.permute(0, 2, 3, 1).numpy():
        seen[int(np.flatnonzero((want == image).all(axis=(1, 2, 3)))[0])] += 1
assert (seen == 1).all(), seen
print("ok", len(seen))
"""


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """250 shards of 2 distinct images, and the images in set order (an .npy file)."""
    folder = tmp_path_factory.mktemp("many")
    root, images = make_set(folder / "set", counts=(2,) * 250, codec="none")
    # every image distinct, so a delivered image names its sample
    assert len({image.tobytes() for image in images}) == len(images)
    np.save(folder / "want.npy", np.stack(images))
    return root, folder / "want.npy"


def _under_a_limit(root: Path, want: Path, limit: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", _UNDER_A_LOW_ULIMIT, str(root), str(want), str(limit)]
    return subprocess.run(command, capture_output=True, text=True)


@pytest.mark.slow  # 250 shards
def test_a_set_of_more_shards_than_open_files_allowed_trains(many_shards) -> None:
    # 250 shards need 500 descriptors if all stay open; the process may hold 200
    result = _under_a_limit(*many_shards, limit=200)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["ok", "500"]


@pytest.mark.slow  # 250 shards
def test_too_few_open_files_for_the_set_says_so(many_shards) -> None:
    # 64 open shards take 128 descriptors; a process allowed 60 runs out: one clear error
    result = _under_a_limit(*many_shards, limit=60)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "H5PackError" in last
    assert "too many open files (this process may hold 60" in last
    assert "raise `ulimit -n`" in last
    assert ".h5:" in last  # the shard it could not open
