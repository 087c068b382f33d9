"""info and verify on pack sets (issue 11): every shard checked, problems named by shard file.

Also the ``mixing`` line of ``h5pack info`` (issue 12): whether a pack's chunks mix labels.
"""

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack.check import packset_info, probe_packs, verify_pack, verify_packset
from h5pack.cli.main import cli
from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.layout import Compression
from h5pack.core.packset import (
    MANIFEST_NAME,
    PackSetManifest,
    ShardEntry,
    shard_name,
    write_manifest,
)
from h5pack.errors import FormatError, PackNotFoundError
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.damage_cases import image_ranges

CLASSES = ("cat", "dog", "fox")
COUNTS = (7, 5, 9)  # samples per shard: 21 in all
SHAPE = (6, 5, 3)


def _images(num: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(num)]


def _global_positions(path: Path, offset: int) -> None:
    """Number a shard's samples in the global scan, as a sharded conversion does."""
    with h5py.File(path, "r+") as handle:
        positions = handle[fmt.SOURCE_INDEX][()] + offset
        handle[fmt.SOURCE_INDEX][...] = positions
        digests = json.loads(handle.attrs[fmt.METADATA_DIGESTS_KEY])
        digests[fmt.SOURCE_INDEX] = integrity.array_digest(
            positions, fmt.DIGESTED_ARRAYS[fmt.SOURCE_INDEX]
        )
        handle.attrs[fmt.METADATA_DIGESTS_KEY] = json.dumps(digests, sort_keys=True)


def _manifest(root: Path, names: list[str]) -> Path:
    entries = []
    for name in names:
        entries.append(ShardEntry.of(root / name, fmt.load_meta(root / name)))
    return write_manifest(
        PackSetManifest(
            root=root,
            shards=tuple(entries),
            classes=CLASSES,
            num_samples=sum(e.num_samples for e in entries),
            seed=0,
            num_shards=len(entries),
        )
    )


def make_set(root: Path, *, folder: Path | None = None, **options) -> tuple[Path, list[Path]]:
    """Three shards of 21 images (global positions and paths) and their manifest.

    With ``folder``, the images are also written there as PNG files, ImageFolder-style.
    """
    root.mkdir(parents=True)
    images = _images(sum(COUNTS))
    labels = [i % 3 for i in range(len(images))]
    relatives = [f"{CLASSES[label]}/{i:02d}.png" for i, label in enumerate(labels)]
    if folder is not None:
        for image, relative in zip(images, relatives, strict=True):
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / relative)
    options.setdefault("chunk_samples", 3)
    names, start = [], 0
    for index, count in enumerate(COUNTS):
        name = shard_name(index, len(COUNTS))
        part = slice(start, start + count)
        write_arrays(
            root / name,
            images[part],
            labels[part],
            classes=CLASSES,
            paths=relatives[part],
            options=ConvertOptions(**options),
        )
        _global_positions(root / name, start)
        names.append(name)
        start += count
    _manifest(root, names)
    return root, [root / n for n in names]


def _run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


# -- info -----------------------------------------------------------------------------------


def test_info_of_a_set_sums_its_shards(tmp_path):
    root, shards = make_set(tmp_path / "set", compression=Compression(codec="zstd"))
    info = packset_info(root, timeout_s=600)
    assert (info.num_shards, info.num_samples, info.has_manifest) == (3, 21, True)
    assert info.classes == (("cat", 7), ("dog", 7), ("fox", 7))
    assert [(Path(r.path).name, r.num_samples, r.skipped) for r in info.shards] == [
        (s.name, n, 0) for s, n in zip(shards, COUNTS, strict=True)
    ]
    assert info.file_bytes == sum(s.stat().st_size for s in shards)
    assert info.stored_bytes == 21 * int(np.prod(SHAPE))
    assert (info.mode, info.storage, info.sample_shape) == ("raw", "array", SHAPE)
    assert info.codec == "zstd level 3"
    assert info.layout == f"chunked {(3, *SHAPE)}"
    assert info.num_chunks == 3 + 2 + 3
    assert info.path == str(root / MANIFEST_NAME)
    assert packset_info(root / MANIFEST_NAME).shards == info.shards  # the manifest, too


def test_cli_info_of_a_set_text_and_json(tmp_path):
    root, shards = make_set(tmp_path / "set")
    result = _run("info", root)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"set       {root / MANIFEST_NAME} (pack set of 3 shards, ")
    assert "samples   21 in 3 classes" in lines
    assert "classes   cat 7, dog 7, fox 7" in lines
    table = lines[lines.index(next(line for line in lines if line.startswith("shards"))) :]
    assert table[0].split() == ["shards", "path", "samples", "size", "skipped"]
    for row, shard, count in zip(table[1:], shards, COUNTS, strict=True):
        assert row.split()[0] == str(shard)
        assert row.split()[1] == str(count)
        assert row.split()[-1] == "0"
    data = json.loads(_run("info", "--json", root / MANIFEST_NAME).output)
    assert (data["num_shards"], data["num_samples"]) == (3, 21)
    assert [s["num_samples"] for s in data["shards"]] == list(COUNTS)
    assert data["classes"][2] == {"name": "fox", "samples": 7}
    assert data["mixing"]["mixes_labels"] is True


def test_cli_info_of_a_contiguous_set_counts_no_chunks(tmp_path):
    root, _ = make_set(tmp_path / "set", layout="contiguous", chunk_samples=None)
    lines = _run("info", root).output.splitlines()
    assert "layout    contiguous" in lines  # no "0 chunks, 7.0 samples/chunk"
    chunked, _ = make_set(tmp_path / "chunked")
    assert "layout    chunked (3, 6, 5, 3), 8 chunks, 2.6 samples/chunk" in (
        _run("info", chunked).output.splitlines()
    )


def test_cli_info_of_a_list_of_packs(tmp_path):
    _, shards = make_set(tmp_path / "set")
    result = _run("info", "--json", *shards[:2])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["num_shards"], data["num_samples"], data["has_manifest"]) == (2, 12, False)


def test_info_names_a_missing_truncated_or_changed_shard(tmp_path):
    root, shards = make_set(tmp_path / "set")
    saved = shards[1].read_bytes()
    shards[1].unlink()
    result = _run("info", root)
    assert result.exit_code == 1
    assert str(shards[1]) in result.output
    with pytest.raises(PackNotFoundError, match=shards[1].name):
        packset_info(root, timeout_s=600)
    shards[1].write_bytes(saved[: len(saved) // 2])  # truncated
    result = _run("info", root)
    assert result.exit_code == 1
    assert str(shards[1]) in result.output
    assert "Traceback" not in result.output
    # another pack under the shard's name: the manifest's record no longer matches
    write_arrays(shards[1], _images(5), [0, 1, 2, 0, 1], classes=CLASSES, overwrite=True)
    with pytest.raises(FormatError, match=f"{shards[1]}: the shard changed"):
        packset_info(root, timeout_s=600)


def test_info_refuses_packs_that_cannot_form_one_set(tmp_path):
    first, second = tmp_path / "a.h5", tmp_path / "b.h5"
    write_arrays(first, _images(4), [0, 1, 2, 0], classes=CLASSES)
    write_arrays(second, _images(4), [0, 1, 1, 0], classes=("a", "b"))
    result = _run("info", first, second)
    assert result.exit_code == 1
    assert f"{second} cannot join a pack set with {first}" in result.output
    assert "classes" in result.output


def test_probe_packs_reports_each_pack_and_goes_on_after_a_hang(tmp_path):
    from tests.test_damage import _heap_damaged_v1

    _, shards = make_set(tmp_path / "set")
    looping = _heap_damaged_v1(tmp_path)
    # The limit, in CPU seconds, covers a child's start (the first pack's, the one after the
    # hang), which a busy machine slows but does not make costlier; the hang costs it once.
    paths = [shards[0], looping, tmp_path / "none.h5", shards[2]]
    errors = probe_packs(paths, timeout_s=5)
    assert errors[0] is None
    assert errors[3] is None  # the pack after the hang is probed too
    assert isinstance(errors[1], FormatError)
    assert str(errors[1]).startswith(f"{looping}: reading the pack's metadata did not finish")
    assert isinstance(errors[2], PackNotFoundError)


# -- verify -----------------------------------------------------------------------------------


def test_verify_a_good_set(tmp_path):
    root, _ = make_set(tmp_path / "set", compression=Compression(codec="gzip"))
    seen = []
    report = verify_pack(root, progress=seen.append, timeout_s=600)  # verify_pack takes sets
    assert report.ok, report.problems
    assert (report.num_samples, report.num_verified, report.num_shards) == (21, 21, 3)
    assert sum(seen) == 21
    result = _run("verify", "-q", root)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "ok: 21 of 21 samples verified in 3 shards"


def _verify_cli(*args) -> tuple[int, list[str]]:
    result = _run("verify", "-q", *args)
    return result.exit_code, result.output.splitlines()


def test_verify_names_a_missing_shard(tmp_path):
    root, shards = make_set(tmp_path / "set")
    shards[2].unlink()
    report = verify_packset(root)
    assert [str(p) for p in report.problems] == [
        f"{shards[2]}: missing: the manifest lists it, but there is no such file"
    ]
    assert (report.num_verified, report.num_samples) == (12, 21)
    code, lines = _verify_cli(root)
    assert code == 1
    assert lines[0] == str(report.problems[0])
    assert lines[-1] == "FAILED: 1 problems; 12 of 21 samples verified in 3 shards"


def test_verify_names_a_truncated_shard(tmp_path):
    root, shards = make_set(tmp_path / "set")
    data = shards[0].read_bytes()
    shards[0].write_bytes(data[: len(data) * 2 // 3])
    report = verify_packset(root, timeout_s=600)
    assert not report.ok
    assert {p.shard for p in report.problems} == {str(shards[0])}
    assert report.num_verified == 14  # the other two shards
    code, lines = _verify_cli(root)
    assert code == 1
    assert lines[0].startswith(f"{shards[0]}: ")
    assert lines[-1].startswith("FAILED: ")


def _flip_chunk(path: Path, which: int) -> None:
    start, stop = image_ranges(path)[which]
    with open(path, "r+b") as raw:
        raw.seek((start + stop) // 2)
        byte = raw.read(1)
        raw.seek((start + stop) // 2)
        raw.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_verify_names_the_shard_of_a_corrupted_sample(tmp_path, codec):
    root, shards = make_set(tmp_path / "set", compression=Compression(codec=codec))
    _flip_chunk(shards[1], 1)
    report = verify_packset(root)
    assert not report.ok
    assert {p.shard for p in report.problems} == {str(shards[1])}
    for problem in report.problems:  # samples of the shard's chunk 1, by index in the shard
        assert problem.index in (3, 4, 5)
        assert problem.path
        assert str(problem).startswith(f"{shards[1]}: sample {problem.index} ({problem.path}): ")
    # the manifest's record still matches: only the pixels changed
    assert not any("manifest" in p.message for p in report.problems)


def test_verify_names_a_shard_whose_digest_differs_from_the_manifest(tmp_path):
    root, shards = make_set(tmp_path / "set")
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["shards"][2]["digest"] = "00000000"
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    report = verify_packset(root)
    (problem,) = report.problems
    assert problem.shard == str(shards[2])
    assert "metadata that differs from what the manifest recorded" in problem.message
    assert report.num_verified == 21  # the samples themselves are fine
    code, lines = _verify_cli(root)
    assert code == 1
    assert lines[-1] == "FAILED: 1 problems; 21 of 21 samples verified in 3 shards"


def test_verify_finds_an_image_in_two_shards(tmp_path):
    root, shards = make_set(tmp_path / "set", shuffle_samples=False)
    # shard 2 rebuilt with shard 1's last image as its first (same path, same position)
    images = _images(sum(COUNTS))
    labels = [i % 3 for i in range(len(images))]
    relatives = [f"{CLASSES[label]}/{i:02d}.png" for i, label in enumerate(labels)]
    part = slice(11, 21)  # shard 2 holds 12..20, plus 11 (shard 1's last)
    write_arrays(
        shards[2],
        images[part],
        labels[part],
        classes=CLASSES,
        paths=relatives[part],
        options=ConvertOptions(chunk_samples=3, shuffle_samples=False),
        overwrite=True,
    )
    _global_positions(shards[2], 11)
    _manifest(root, [s.name for s in shards])
    report = verify_packset(root)
    (problem,) = report.problems
    assert (problem.shard, problem.index, problem.path) == (str(shards[2]), 0, "fox/11.png")
    assert problem.message == (
        f"duplicate: the same source image is sample 4 of {shards[1]} (an image belongs in "
        "exactly one shard)"
    )


def test_verify_a_list_of_packs_from_separate_conversions(tmp_path):
    # each numbers its own images from 0: not duplicates; their classes must agree
    first = tmp_path / "a.h5"
    second = tmp_path / "b.h5"
    write_arrays(first, _images(4), [0, 1, 2, 0], classes=CLASSES, paths=list("abcd"))
    write_arrays(second, _images(4), [0, 1, 2, 0], classes=CLASSES, paths=list("efgh"))
    report = verify_packset([first, second])
    assert report.ok, report.problems
    write_arrays(second, _images(4), [0, 1, 1, 0], classes=("a", "b"), overwrite=True)
    (problem,) = verify_packset([first, second]).problems
    assert problem.shard == str(second)
    assert "classes ['a', 'b'], not ['cat', 'dog', 'fox']" in problem.message


# -- verify --source across shards ---------------------------------------------------------


def test_verify_source_across_shards(tmp_path):
    folder = tmp_path / "images"
    root, shards = make_set(tmp_path / "set", folder=folder)
    report = verify_packset(root, source=folder)
    assert report.ok, report.problems
    assert (report.num_source, report.num_compared, report.changed) == (21, 21, 0)
    owner = {p: s for s in shards for p in fmt.load_meta(s).source_index.tolist()}
    (folder / "cat/00.png").unlink()  # missing: in shard 0, not in the folder
    shutil.copyfile(folder / "dog/01.png", folder / "dog/99.png")  # extra: in no shard
    changed = folder / "fox/20.png"  # in shard 2
    Image.fromarray(255 - np.asarray(Image.open(changed))).save(changed)
    report = verify_packset(root, source=folder)
    assert (report.missing, report.extra, report.changed) == (1, 1, 1)
    found = {p.path: (p.shard, str(p)) for p in report.problems}
    assert found["cat/00.png"][0] == str(owner[0])
    assert "missing: in the pack set, not in the source folder" in found["cat/00.png"][1]
    assert found["dog/99.png"] == (
        "",
        "source (dog/99.png): extra: in the source folder, not in the pack set",
    )
    assert found["fox/20.png"][0] == str(owner[20])
    assert "changed: the pixels differ" in found["fox/20.png"][1]
    code, lines = _verify_cli(root, "--source", folder)
    assert code == 1
    assert "1 missing (in the set, not in the source)" in lines[-1]
    assert "1 extra (in the source, not in the set)" in lines[-1]


def test_verify_source_samples_over_the_whole_set(tmp_path):
    folder = tmp_path / "images"
    root, _ = make_set(tmp_path / "set", folder=folder)
    for i in range(0, 21, 3):  # one image in three changed, in every shard
        path = folder / f"cat/{i:02d}.png"
        Image.fromarray(255 - np.asarray(Image.open(path))).save(path)
    report = verify_packset(root, source=folder, sample=10, seed=2)
    assert report.num_compared == 10
    assert report.changed == sum(p.message.startswith("changed") for p in report.problems)
    assert verify_packset(root, source=folder, sample=10, seed=2).problems == report.problems
    assert verify_packset(root, source=folder).changed == 7


# -- the mixing line --------------------------------------------------------------------------


def _class_ordered(path: Path, *, shuffle: bool) -> Path:
    labels = np.repeat(np.arange(4), 24)  # 4 classes in order, 12 chunks of 8
    images = _images(labels.size)
    options = ConvertOptions(chunk_samples=8, shuffle_samples=shuffle)
    write_arrays(path, images, labels, classes=list("abcd"), options=options)
    return path


def test_info_says_whether_chunks_mix_labels(tmp_path):
    shuffled = _class_ordered(tmp_path / "shuffled.h5", shuffle=True)
    in_order = _class_ordered(tmp_path / "in_order.h5", shuffle=False)
    line = next(x for x in _run("info", shuffled).output.splitlines() if x.startswith("mixing"))
    assert line.startswith("mixing    yes: chunks mix labels (label mixing ")
    result = _run("info", in_order)
    line = next(x for x in result.output.splitlines() if x.startswith("mixing"))
    assert line.startswith("mixing    no: chunks do not mix labels (label mixing 0.00 per chunk")
    assert "make_loader warns, orders chunks stratified by label and widens" in line
    assert "re-convert without --no-shuffle" in line
    data = json.loads(_run("info", "--json", in_order).output)["mixing"]
    assert data["mixes_labels"] is False
    assert data["figure"] == pytest.approx(0.0, abs=0.01)
    assert 2 <= data["window_needed"] <= 12
    data = json.loads(_run("info", "--json", shuffled).output)["mixing"]
    assert (data["mixes_labels"], data["window_needed"]) == (True, None)


# -- a set written by convert --shards --------------------------------------------------------


def test_info_and_verify_on_convert_shards_output(tmp_path):
    from tests.test_check import make_folder

    folder = make_folder(tmp_path / "images", per_class=(6, 5, 4))
    (folder / "cat" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")  # skipped
    out = tmp_path / "set"
    result = _run("convert", folder, out, "--shards", "3", "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    data = json.loads(_run("info", "--json", out).output)
    assert (data["num_shards"], data["num_samples"], len(data["skipped"])) == (3, 15, 1)
    assert sum(s["num_samples"] for s in data["shards"]) == 15
    assert sum(s["skipped"] for s in data["shards"]) == 1
    code, lines = _verify_cli(out, "--source", folder)
    assert code == 0, lines
    assert lines[-1].startswith("ok: 15 of 15 samples verified in 3 shards; source: 16 images")
    assert "1 skipped at conversion" in lines[-1]
    (folder / "fox" / "00.png").unlink()
    code, lines = _verify_cli(out, "--source", folder)
    assert code == 1
    (problem,) = lines[:-1]
    assert problem.startswith(str(out / "shard-"))
    assert problem.endswith("(fox/00.png): missing: in the pack set, not in the source folder")


# -- bench and compare on a set ----------------------------------------------------------------


FAST = {"min_run_s": 0.0, "budget_s": 0.0}


def test_bench_on_a_set_and_a_list(tmp_path):
    from h5pack.bench import BenchOptions, bench_loader

    root, shards = make_set(tmp_path / "set", compression=Compression(codec="zstd"))
    options = BenchOptions(batch_size=4, workers=0, order="chunk", repeats=2, warmup=0, **FAST)
    result = bench_loader(root, options)
    assert result.timing.images == (21, 21)
    assert result.path == str(root)
    assert result.reads.samples == 21
    assert result.reads.chunk_loads == pytest.approx(8)  # each chunk once
    result = _run(
        "bench", *shards[:2], "--workers", "0", "--repeats", "1", "--warmup", "0", "--json", "-q"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["path"] == f"{shards[0]}, {shards[1]}"
    assert data["timing"]["images"][0] % 12 == 0  # whole epochs of the two packs' 12 images


def test_compare_measures_a_set_as_one_pack(tmp_path):
    root, shards = make_set(tmp_path / "set", compression=Compression(codec="zstd"))
    out = tmp_path / "report"
    result = _run(
        "compare", root, shards[0], "--out", out, "--repeats", "1", "--workers", "0",
        "--batch-size", "4", "--no-plots", "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    variants = {v["name"]: v for v in data["variants"]}
    assert set(variants) == {"set", shards[0].stem}
    assert variants["set"]["num_samples"] == 21
    assert variants["set"]["file_bytes"] == sum(s.stat().st_size for s in shards)
    assert variants[shards[0].stem]["num_samples"] == 7
