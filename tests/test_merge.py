"""write/merge.py and ``h5pack merge``: a merge equals a direct conversion; refusals; publish.

Shards are built with ``write_arrays`` in the given order (no shuffle), so the direct
conversion of all samples is the reference: same pixels, labels, paths and classes, in the
same order.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from h5pack import FormatError, OptionsError, TargetExistsError, merge_packs, verify_pack
from h5pack.cli.main import cli
from h5pack.core import format as fmt
from h5pack.core.layout import Compression, chunk_map_of
from h5pack.core.packset import PackSetManifest, ShardEntry, meta_digest, write_manifest
from h5pack.read.reader import PackReader
from h5pack.write.convert import write_arrays
from h5pack.write.mergecopy import tails_last_order
from h5pack.write.options import ConvertOptions
from tests.compat_pack import V1_ARRAY, v1_samples
from tests.helpers import png

CLASSES = ("ant", "bee", "cat")
ZSTD = Compression(codec="zstd")


def fixed(num: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(num)]


def varied(num: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 256, (int(rng.integers(3, 12)), 5, 3), dtype=np.uint8) for _ in range(num)
    ]


def encoded(num: int, seed: int = 0) -> list[bytes]:
    return [png(a) for a in varied(num, seed)]


def build(
    tmp_path: Path, samples: list, counts: list[int], name: str = "shard", **options: object
) -> tuple[list[Path], Path]:
    """Write ``samples`` as shards of ``counts`` samples and as one direct pack."""
    num = sum(counts)
    labels = [i % len(CLASSES) for i in range(num)]
    paths = [f"{CLASSES[i % 3]}/{i:04d}.png" for i in range(num)]
    opts = ConvertOptions(shuffle_samples=False, **options)  # type: ignore[arg-type]
    shards, lo = [], 0
    for k, count in enumerate(counts):
        path = tmp_path / f"{name}-{k}.h5"
        hi = lo + count
        write_arrays(
            path, samples[lo:hi], labels[lo:hi], classes=CLASSES, paths=paths[lo:hi], options=opts
        )
        shards.append(path)
        lo = hi
    direct = tmp_path / f"{name}-direct.h5"
    write_arrays(direct, samples, labels, classes=CLASSES, paths=paths, options=opts)
    return shards, direct


def assert_same(merged: Path, direct: Path, order: np.ndarray | None = None) -> None:
    """The merged pack serves what the direct conversion serves, and verifies.

    Merged sample ``j`` is direct sample ``order[j]`` (default: ``j``).
    """
    with PackReader(merged) as a, PackReader(direct) as b:
        num = len(b)
        assert len(a) == num
        order = np.arange(num) if order is None else order
        assert sorted(order.tolist()) == list(range(num))
        assert a.meta.classes == b.meta.classes
        assert a.paths == [b.paths[i] for i in order]
        np.testing.assert_array_equal(a.meta.labels, b.meta.labels[order])
        np.testing.assert_array_equal(a.meta.shapes, b.meta.shapes[order])
        for x, y in zip(a.read_images(range(num)), b.read_images(order), strict=True):
            np.testing.assert_array_equal(x, y)
        # every chunk group read whole, each sample checked against its digest on the way
        seen = [i for indices, _ in a.iter_chunks() for i in indices]
        assert sorted(seen) == list(range(num))
    report = verify_pack(merged)
    assert report.ok, report.problems
    assert report.num_verified == num


CASES = {
    # name: (samples, shard counts, options, chunks copied as stored, re-chunked)
    "array aligned, zstd": (fixed(20), [8, 8, 4], {"chunk_samples": 4, "compression": ZSTD}),
    "array misaligned, zstd": (fixed(20), [7, 8, 5], {"chunk_samples": 4, "compression": ZSTD}),
    "array misaligned, none": (fixed(20), [5, 8, 7], {"chunk_samples": 4}),
    "array contiguous": (fixed(20), [7, 8, 5], {"layout": "contiguous"}),
    "raw blob, lz4": (
        varied(20),
        [7, 8, 5],
        {"chunk_bytes": 400, "compression": Compression(codec="lz4")},
    ),
    "raw blob, contiguous": (varied(20), [7, 8, 5], {}),
    "encoded, gzip": (
        encoded(15),
        [6, 4, 5],
        {"chunk_bytes": 400, "compression": Compression(codec="gzip")},
    ),
    "encoded, none": (encoded(15), [6, 4, 5], {"mode": "encoded"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_merge_equals_a_direct_conversion(tmp_path, case):
    samples, counts, options = CASES[case]
    shards, direct = build(tmp_path, samples, counts, **options)
    report = merge_packs(shards, tmp_path / "merged.h5", keep_order=True)
    assert report.num_samples == sum(counts)
    assert report.moved_to_end == 0
    meta, reference = report.meta, fmt.load_meta(direct)
    assert (meta.mode, meta.storage, meta.chunks, meta.filter_ids) == (
        reference.mode,
        reference.storage,
        reference.chunks,
        reference.filter_ids,
    )
    assert meta.pack_id not in {fmt.load_meta(s).pack_id for s in shards}
    assert_same(tmp_path / "merged.h5", direct)


def test_aligned_arrays_are_copied_chunk_for_chunk(tmp_path):
    shards, _ = build(tmp_path, fixed(20), [8, 8, 4], chunk_samples=4, compression=ZSTD)
    report = merge_packs(shards, tmp_path / "merged.h5")
    assert (report.chunks_copied, report.chunks_rechunked) == (5, 0)
    # the stored (compressed) chunks are the shards' bytes
    with h5py.File(shards[1]) as shard, h5py.File(tmp_path / "merged.h5") as merged:
        assert shard["images"].id.read_direct_chunk((4, 0, 0, 0)) == merged[
            "images"
        ].id.read_direct_chunk((12, 0, 0, 0))


def test_keep_order_rechunks_from_the_first_misaligned_shard(tmp_path):
    # 8 rows: 2 chunks copied; 7 rows: 1 chunk copied, its last 3 rows and the next
    # shard's 5 shifted within chunks: 8 rows re-chunked into 2 chunks
    shards, direct = build(tmp_path, fixed(20), [8, 7, 5], chunk_samples=4, compression=ZSTD)
    report = merge_packs(shards, tmp_path / "merged.h5", keep_order=True)
    assert (report.chunks_copied, report.chunks_rechunked) == (3, 2)
    assert_same(tmp_path / "merged.h5", direct)


@pytest.mark.parametrize("compression", [ZSTD, Compression()])
def test_misaligned_arrays_move_partial_chunks_to_the_end(tmp_path, compression):
    # chunks of 4: shards of 7, 9, 6 rows keep 4, 8, 4 rows in place (4 chunks copied);
    # their 3 + 1 + 2 tail rows go last, re-chunked into 2 chunks
    shards, direct = build(tmp_path, fixed(22), [7, 9, 6], chunk_samples=4, compression=compression)
    report = merge_packs(shards, tmp_path / "merged.h5")
    assert (report.chunks_copied, report.chunks_rechunked, report.moved_to_end) == (4, 2, 6)
    order = np.array([*range(4), *range(7, 15), *range(16, 20), 4, 5, 6, 15, 20, 21])
    assert_same(tmp_path / "merged.h5", direct, order)
    # every sample once, with its own source index
    with PackReader(direct) as b:
        np.testing.assert_array_equal(report.meta.source_index, b.meta.source_index[order])
    result = CliRunner().invoke(cli, ["merge", *map(str, shards), str(tmp_path / "cli.h5"), "-q"])
    assert result.exit_code == 0, result.output
    assert "the 6 samples of the packs' last, partial chunks moved to the end" in result.output
    result = CliRunner().invoke(
        cli, ["merge", *map(str, shards), str(tmp_path / "kept.h5"), "-q", "--keep-order"]
    )
    assert result.exit_code == 0, result.output
    assert_same(tmp_path / "kept.h5", direct)


def test_tails_last_order_keeps_the_order_when_every_shard_but_the_last_is_whole():
    assert tails_last_order([4, 8, 3], 4) == ([4, 8, 3], None)
    rows, order = tails_last_order([4, 5, 3], 4)
    assert rows == [4, 4, 0]
    assert order is not None
    assert order.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]


def test_blobs_shift_by_whole_chunks_and_keep_every_chunk(tmp_path):
    opts = {"chunk_bytes": 400, "compression": Compression(codec="lz4")}
    shards, _ = build(tmp_path, varied(20), [7, 8, 5], **opts)
    report = merge_packs(shards, tmp_path / "merged.h5")
    metas = [fmt.load_meta(s) for s in shards]
    assert report.chunks_copied == sum(chunk_map_of(m).num_chunks for m in metas)
    assert report.chunks_rechunked == 0
    step = metas[0].chunks[0]
    offsets = report.meta.offsets
    starts = np.cumsum([0, *(m.num_samples for m in metas[:-1])])
    assert all(int(offsets[s]) % step == 0 for s in starts)  # each shard on a chunk boundary
    # the merged chunk map is the shards' maps one after another
    merged_map = chunk_map_of(report.meta)
    assert merged_map.num_chunks == sum(chunk_map_of(m).num_chunks for m in metas)


def test_blobs_shorter_than_a_chunk_are_laid_out_again_in_the_largest_chunk(tmp_path):
    # each shard's blob is shorter than the 2000 bytes planned: its chunk is cut to its length
    opts = {"chunk_bytes": 2000, "compression": Compression(codec="gzip")}
    shards, direct = build(tmp_path, encoded(15), [6, 4, 5], **opts)
    chunks = [fmt.load_meta(s).chunks[0] for s in shards]
    assert len(set(chunks)) == 3
    report = merge_packs(shards, tmp_path / "merged.h5")
    assert report.meta.chunks == (max(chunks),)
    assert report.meta.blob_chunk_bytes == max(chunks)
    assert report.chunks_copied + report.chunks_rechunked == chunk_map_of(report.meta).num_chunks
    assert report.chunks_rechunked >= 2
    assert_same(tmp_path / "merged.h5", direct)


def test_blobs_of_different_chunks_are_refused(tmp_path):
    gzip = Compression(codec="gzip")
    first = _shard(tmp_path / "a.h5", varied(10), chunk_bytes=300, compression=gzip)
    second = _shard(tmp_path / "b.h5", varied(10, seed=1), chunk_bytes=400, compression=gzip)
    with pytest.raises(FormatError) as caught:
        merge_packs([first, second], tmp_path / "merged.h5")
    assert str(caught.value).startswith(
        f"{first} cannot be merged with {second}: blob chunk 300 bytes here, 400 in {second}"
    )


def test_a_pack_set_merges_in_manifest_order(tmp_path):
    shards, direct = build(tmp_path, fixed(12), [4, 4, 4], chunk_samples=4, compression=ZSTD)
    root = tmp_path / "set"
    root.mkdir()
    entries = []
    for shard in shards:
        moved = root / shard.name
        shutil.move(shard, moved)
        meta = fmt.load_meta(moved)
        entries.append(
            ShardEntry(
                path=moved.name,
                num_samples=meta.num_samples,
                file_bytes=moved.stat().st_size,
                digest=meta_digest(meta),
            )
        )
    write_manifest(
        PackSetManifest(
            root=root, shards=tuple(entries), classes=CLASSES, num_samples=12, seed=0, num_shards=3
        )
    )
    result = CliRunner().invoke(cli, ["merge", str(root), str(tmp_path / "merged.h5"), "-q"])
    assert result.exit_code == 0, result.output
    assert "merged 12 samples from 3 packs" in result.output
    assert "3 chunks copied as stored" in result.output
    assert "moved" not in result.output
    assert_same(tmp_path / "merged.h5", direct)
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "merged.h5")])
    assert result.exit_code == 0, result.output
    assert "ok: 12 of 12 samples verified" in result.output


def test_one_pack_merges_to_a_copy(tmp_path):
    shards, direct = build(tmp_path, varied(9), [9], chunk_bytes=400, compression=ZSTD)
    merge_packs(shards[0], tmp_path / "copy.h5")
    assert_same(tmp_path / "copy.h5", direct)


def test_source_indices_that_collide_are_reindexed_in_order(tmp_path):
    shards, _ = build(tmp_path, fixed(10), [6, 4], chunk_samples=2)
    report = merge_packs(shards, tmp_path / "merged.h5")
    np.testing.assert_array_equal(report.meta.source_index, np.arange(10))


# -- refusals ----------------------------------------------------------------------------


def _shard(
    path: Path, samples: list, classes=CLASSES, paths: list[str] | None = None, **options: object
) -> Path:
    labels = [i % len(classes) for i in range(len(samples))]
    paths = paths or [f"{path.stem}/{i}.png" for i in range(len(samples))]
    opts = ConvertOptions(shuffle_samples=False, **options)  # type: ignore[arg-type]
    write_arrays(path, samples, labels, classes=classes, paths=paths, options=opts)
    return path


REFUSALS = {
    "classes": ({"classes": ("ant", "bee", "dog")}, "classes: 3 here, 3 in"),
    "codec": ({"compression": Compression(codec="lz4")}, "filters lz4[0] here, zstd[3] in"),
    "level": ({"compression": Compression(codec="zstd", level=5)}, "filters zstd[5] here, zstd[3]"),
    "shape": ({"samples": [np.zeros((7, 5, 3), np.uint8)] * 8}, "sample shape (7, 5, 3) here"),
    "mode": ({"samples": encoded(8), "mode": "encoded"}, "mode encoded here, raw"),
    "chunks": ({"chunk_samples": 2}, "chunk shape (2, 6, 5, 3) here, (4, 6, 5, 3)"),
}


@pytest.mark.parametrize("what", list(REFUSALS))
def test_packs_that_disagree_are_refused_naming_both_files(tmp_path, what):
    change, expected = REFUSALS[what]
    change = dict(change)
    first = _shard(tmp_path / "a.h5", fixed(8), chunk_samples=4, compression=ZSTD)
    samples = change.pop("samples", fixed(8, seed=2))
    classes = change.pop("classes", CLASSES)
    options = {"chunk_samples": 4, "compression": ZSTD, **change}
    if options.get("mode") == "encoded":  # chunked by bytes
        options = {"mode": "encoded", "compression": ZSTD}
    second = _shard(tmp_path / "b.h5", samples, classes, **options)
    target = tmp_path / "merged.h5"
    with pytest.raises(FormatError) as caught:
        merge_packs([first, second], target)
    message = str(caught.value)
    assert message.startswith(f"{second} cannot be merged with {first}: ")
    assert expected in message, message
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    result = CliRunner().invoke(cli, ["merge", str(first), str(second), str(target)])
    assert result.exit_code == 1
    assert f"{second} cannot be merged with {first}" in result.output
    assert "Traceback" not in result.output


# -- publishing --------------------------------------------------------------------------


def test_an_existing_target_is_refused_without_overwrite(tmp_path):
    shards, direct = build(tmp_path, fixed(8), [4, 4], chunk_samples=4)
    target = tmp_path / "merged.h5"
    target.write_bytes(b"keep me")
    with pytest.raises(TargetExistsError, match="pass --overwrite"):
        merge_packs(shards, target)
    result = CliRunner().invoke(cli, ["merge", *map(str, shards), str(target)])
    assert result.exit_code == 1
    assert target.read_bytes() == b"keep me"
    merge_packs(shards, target, overwrite=True)
    assert_same(target, direct)


def test_a_source_as_target_is_refused(tmp_path):
    shards, _ = build(tmp_path, fixed(8), [4, 4], chunk_samples=4)
    before = shards[0].read_bytes()
    with pytest.raises(ValueError, match="one of the images being packed"):
        merge_packs(shards, shards[0], overwrite=True)
    assert shards[0].read_bytes() == before


def test_a_failed_merge_leaves_no_target_and_no_temporary_file(tmp_path, monkeypatch):
    shards, _ = build(tmp_path, fixed(8), [4, 4], chunk_samples=4, compression=ZSTD)
    import h5pack.write.merge as merge_module

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(merge_module, "write_record", fail)
    target = tmp_path / "merged.h5"
    with pytest.raises(Exception, match=f"writing {target} failed"):
        merge_packs(shards, target)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


KILLED = """
import sys, threading
from h5pack import merge_packs
def slow(n):
    print("started", flush=True)
    threading.Event().wait()  # until the test kills this process
merge_packs(sys.argv[1:-1], sys.argv[-1], progress=slow)
"""


def test_a_killed_merge_leaves_no_target(tmp_path):
    shards, _ = build(tmp_path, fixed(8), [4, 4], chunk_samples=4)
    target = tmp_path / "merged.h5"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, *map(str, shards), str(target)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"  # inside the merge, file open
        assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert not target.exists()
    merge_packs(shards, target)  # and the next merge there removes the leftovers
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- virtual packs: retired (docs/decisions/0160-no-virtual-packs.md) ---------------------


def test_merging_into_a_virtual_pack_is_refused_naming_what_replaces_it(tmp_path):
    shards, _ = build(tmp_path, fixed(8), [4, 4], chunk_samples=4)
    target = tmp_path / "view.h5"
    with pytest.raises(OptionsError, match=r"virtual packs .* are retired") as caught:
        merge_packs(shards, target, virtual=True)
    assert "packset.json) as a pack set" in str(caught.value)
    assert "merge without --virtual" in str(caught.value)
    result = CliRunner().invoke(cli, ["merge", *map(str, shards), str(target), "--virtual"])
    assert result.exit_code == 2
    assert "are retired" in result.output
    assert "as a pack set" in result.output
    assert not target.exists()


def test_an_old_virtual_pack_is_refused_naming_it_and_its_replacement(tmp_path):
    shards, _ = build(tmp_path, fixed(8), [4, 4], chunk_samples=4)
    target = tmp_path / "view.h5"
    merge_packs(shards, target)
    with h5py.File(target, "r+") as handle:  # what merge --virtual recorded
        handle.attrs["virtual_sources"] = json.dumps([{"path": s.name} for s in shards])
    for read in (PackReader, fmt.load_meta, lambda path: merge_packs(path, tmp_path / "m.h5")):
        with pytest.raises(FormatError, match=f"{target} is a virtual pack") as caught:
            read(target)
        assert "merge its sources again without --virtual" in str(caught.value)
        assert "as a pack set" in str(caught.value)
    result = CliRunner().invoke(cli, ["info", str(target)])
    assert result.exit_code == 1
    assert f"{target} is a virtual pack" in result.output


def test_an_hdf5_virtual_images_dataset_is_refused_by_name(tmp_path):
    shards, _ = build(tmp_path, fixed(8), [4, 4], chunk_samples=4)
    target = tmp_path / "view.h5"
    merge_packs(shards, target)
    with h5py.File(target, "r+") as handle:  # no record: HDF5 would serve fill values
        images = handle["images"]
        layout = h5py.VirtualLayout(shape=images.shape, dtype=images.dtype)
        layout[:4] = h5py.VirtualSource(str(shards[0]), "images", shape=(4, *images.shape[1:]))
        del handle["images"]
        handle.create_virtual_dataset("images", layout, fillvalue=0)
    with pytest.raises(FormatError, match=f"{target}: its images are an HDF5 virtual dataset"):
        PackReader(target)


def test_a_format_1_0_pack_merges(tmp_path):
    # the frozen 1.0 pack: no pack id, no XXH3; the merged pack is 1.1 and checks CRC32
    source = tmp_path / "a.h5"
    shutil.copy(V1_ARRAY, source)
    report = merge_packs(source, tmp_path / "merged.h5")
    assert fmt.load_meta(source).pack_id is None
    assert report.meta.sample_xxh3 is None
    assert report.meta.format_minor == 1
    images = v1_samples()[0]
    with PackReader(tmp_path / "merged.h5") as merged:
        expected = [images[int(i)] for i in merged.meta.source_index]
        for x, y in zip(merged.read_images(range(7)), expected, strict=True):
            np.testing.assert_array_equal(x, y)
    assert verify_pack(tmp_path / "merged.h5").ok


def test_packs_holding_the_same_path_are_refused(tmp_path):
    paths = ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png"]
    first = _shard(tmp_path / "a.h5", fixed(4), paths=paths, chunk_samples=4)
    second = _shard(tmp_path / "b.h5", fixed(4, seed=1), paths=paths[::-1], chunk_samples=4)
    with pytest.raises(FormatError) as caught:
        merge_packs([first, second], tmp_path / "merged.h5")
    assert str(caught.value).startswith(
        f"{second} cannot be merged with {first}: both hold 'dog/1.png'"
    )
    assert not (tmp_path / "merged.h5").exists()
