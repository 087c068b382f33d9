"""pack_info and verify_pack: what a pack holds, and catching damage without a traceback."""

import json

import h5py
import numpy as np
import pytest
from PIL import Image

from h5pack.check import pack_info, verify_pack
from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.errors import FormatError
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions


def make_folder(root, *, classes=("cat", "dog", "fox"), per_class=(5, 3, 2), vary=False):
    rng = np.random.default_rng(7)
    for c, (name, count) in enumerate(zip(classes, per_class, strict=True)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            h, w = (10 + i, 14 + c) if vary else (10, 14)
            y, x = np.mgrid[0:h, 0:w]
            base = np.stack([x * 12, y * 15 + 30 * c, (x + y) * 6], axis=-1)
            pixels = np.clip(base + rng.integers(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i:02d}.png")
    return root


def _pack(tmp_path, *, vary=False, name="p.h5", **options):
    root = make_folder(tmp_path / "images", vary=vary)
    options.setdefault("workers", 1)
    return root, convert(root, tmp_path / name, ConvertOptions(**options)).path


def test_info_of_a_compressed_raw_pack(tmp_path):
    _, path = _pack(tmp_path, chunk_samples=4, compression=Compression(codec="zstd", shuffle="bit"))
    info = pack_info(path)
    assert info.num_samples == 10
    assert info.classes == (("cat", 5), ("dog", 3), ("fox", 2))
    assert (info.mode, info.storage, info.layout) == ("raw", "array", "chunked")
    assert info.images_shape == (10, 10, 14, 3)
    assert info.sample_shape == (10, 14, 3)
    assert info.chunk_shape == (4, 10, 14, 3)
    assert info.chunk_bytes == 4 * 10 * 14 * 3
    assert info.num_chunks == 3
    assert info.codec == "zstd level 3, bit shuffle"
    assert info.plugins == ("Bitshuffle (hdf5plugin)",)
    assert info.stored_bytes == 10 * 10 * 14 * 3
    assert info.compression_ratio == pytest.approx(info.stored_bytes / info.disk_bytes)
    assert info.compression_ratio > 1  # smooth images compress
    assert info.shuffled is True
    assert info.file_bytes > info.disk_bytes


def test_info_of_contiguous_and_encoded_packs(tmp_path):
    _, path = _pack(tmp_path, layout="contiguous")
    info = pack_info(path)
    assert (info.layout, info.chunk_shape, info.num_chunks, info.codec) == (
        "contiguous",
        None,
        0,
        "none",
    )
    assert info.plugins == ()
    assert info.compression_ratio == pytest.approx(1.0)
    _, path = _pack(tmp_path, vary=True, name="e.h5", compression=Compression(codec="gzip"))
    info = pack_info(path)
    assert (info.mode, info.storage, info.sample_shape) == ("encoded", "blob", None)
    assert info.codec == "gzip level 4"
    assert info.plugins == ()


def test_info_to_dict_is_json(tmp_path):
    _, path = _pack(tmp_path)
    data = json.loads(json.dumps(pack_info(path).to_dict()))
    assert data["num_samples"] == 10
    assert data["classes"][0] == {"name": "cat", "samples": 5}
    assert data["images_shape"] == [10, 10, 14, 3]
    assert data["options"]["workers"] == 1


def test_verify_a_good_pack_with_its_source(tmp_path):
    root, path = _pack(tmp_path, vary=True, chunk_bytes=600)
    seen = []
    report = verify_pack(path, source=root, progress=seen.append)
    assert report.ok, report.problems
    assert report.num_verified == report.num_samples == 10
    assert sum(seen) == 10
    assert (report.num_source, report.missing, report.extra, report.mismatched) == (10, 0, 0, 0)


def test_verify_reports_source_differences_by_path(tmp_path):
    root, path = _pack(tmp_path)
    (root / "cat" / "00.png").unlink()  # in the pack, not in the source
    extra = root / "dog" / "new.png"
    extra.write_bytes((root / "dog" / "00.png").read_bytes())  # in the source only
    report = verify_pack(path, source=root)
    assert (report.missing, report.extra, report.mismatched) == (1, 1, 0)
    messages = {p.path: p.message for p in report.problems}
    assert "not in the pack" in messages["dog/new.png"]
    assert "not in the source" in messages["cat/00.png"]


def test_verify_compares_labels_through_a_csv(tmp_path):
    root = make_folder(tmp_path / "images")
    csv = tmp_path / "labels.csv"
    rows = [
        f"{p.relative_to(root).as_posix()},{p.parent.name}" for p in sorted(root.rglob("*.png"))
    ]
    csv.write_text("\n".join(rows) + "\n")
    path = convert(root, tmp_path / "p.h5", ConvertOptions(workers=1, labels_csv=csv)).path
    assert verify_pack(path, source=root).ok
    csv.write_text("\n".join(rows).replace("cat/01.png,cat", "cat/01.png,dog") + "\n")
    report = verify_pack(path, source=root, labels_csv=csv)
    assert report.mismatched == 1
    assert [p.path for p in report.problems] == ["cat/01.png"]


def test_skipped_files_are_not_missing(tmp_path):
    root = make_folder(tmp_path / "images")
    (root / "cat" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    path = convert(root, tmp_path / "p.h5", ConvertOptions(workers=1)).path
    report = verify_pack(path, source=root)
    assert report.ok, report.problems


def _flip_byte_in_images(path, which=0):
    """Flip one byte inside the images dataset's storage, chunk ``which`` when chunked."""
    with h5py.File(path, "r") as handle:
        dataset = handle[fmt.IMAGES]
        if dataset.chunks is None:
            offset = dataset.id.get_offset() + dataset.id.get_storage_size() // 2
        else:
            info = dataset.id.get_chunk_info(which)
            offset = info.byte_offset + info.size // 2
    with open(path, "r+b") as raw:
        raw.seek(offset)
        byte = raw.read(1)
        raw.seek(offset)
        raw.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize(
    ("options", "chunk"),
    [
        ({"chunk_samples": 4}, 1),
        ({"layout": "contiguous"}, 0),
        ({"chunk_samples": 4, "compression": Compression(codec="gzip")}, 1),
        ({"chunk_samples": 4, "compression": Compression(codec="zstd")}, 2),
        ({"chunk_samples": 4, "compression": Compression(codec="lz4")}, 0),
        ({"mode": "encoded", "chunk_bytes": 500}, 1),
        ({"mode": "encoded", "chunk_bytes": 4000, "compression": Compression(codec="gzip")}, 0),
    ],
)
def test_verify_catches_a_flipped_byte(tmp_path, options, chunk):
    _, path = _pack(tmp_path, **options)
    assert verify_pack(path).ok
    _flip_byte_in_images(path, chunk)
    report = verify_pack(path)  # never raises for damaged data
    assert not report.ok
    assert report.num_verified < report.num_samples
    for problem in report.problems:
        assert problem.index is not None
        assert problem.path
        assert any(word in problem.message for word in ("checksum", "cannot be read", "decode")), (
            problem.message
        )


def test_verify_names_the_damaged_sample(tmp_path):
    _, path = _pack(tmp_path, chunk_samples=4, shuffle_samples=False)
    _flip_byte_in_images(path, 1)  # uncompressed: exactly one sample of chunk 1 changes
    report = verify_pack(path)
    assert len(report.problems) == 1
    problem = report.problems[0]
    assert 4 <= problem.index < 8
    assert "checksum mismatch" in problem.message
    assert str(problem).startswith(f"sample {problem.index} (")


def test_verify_refuses_what_is_not_a_pack(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as handle:
        handle["x"] = np.zeros(3)
    with pytest.raises(FormatError, match="not an h5pack pack"):
        verify_pack(path)
    with pytest.raises(FileNotFoundError):
        verify_pack(tmp_path / "missing.h5")


# -- verify --source: content, and every file accounted for ----------------------------------


def _rotate(path):
    with Image.open(path) as image:
        rotated = image.transpose(Image.Transpose.ROTATE_180)
    rotated.save(path)


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "encoded"},
        {"mode": "raw", "size": (8, 9)},
        {"mode": "raw"},
        {"mode": "encoded", "max_side": 9},
    ],
    ids=["encoded", "raw-resized", "raw-original-sizes", "encoded-reencoded"],
)
def test_verify_source_finds_a_changed_image_by_path(tmp_path, options):
    root, path = _pack(tmp_path, vary=True, **options)
    report = verify_pack(path, source=root)
    assert report.ok, report.problems  # the same resize, the same re-encoding: no difference
    assert (report.num_compared, report.changed) == (10, 0)
    _rotate(root / "dog" / "01.png")
    report = verify_pack(path, source=root)
    assert (report.changed, report.missing, report.extra, report.num_compared) == (1, 0, 0, 10)
    (problem,) = report.problems
    assert problem.path == "dog/01.png"
    assert problem.message.startswith("changed: ")


def test_verify_source_accounts_for_skipped_missing_and_extra_files(tmp_path):
    root = make_folder(tmp_path / "images")
    (root / "cat" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    path = convert(root, tmp_path / "p.h5", ConvertOptions(workers=1)).path
    report = verify_pack(path, source=root)
    assert report.ok, report.problems
    assert (report.num_source, report.skipped, report.missing, report.extra) == (11, 1, 0, 0)
    (root / "fox" / "00.png").unlink()
    (root / "fox" / "new.png").write_bytes((root / "fox" / "01.png").read_bytes())
    report = verify_pack(path, source=root)
    assert (report.skipped, report.missing, report.extra) == (1, 1, 1)
    messages = {p.path: p.message for p in report.problems}
    assert messages == {
        "fox/00.png": "missing: in the pack, not in the source folder",
        "fox/new.png": "extra: in the source folder, not in the pack",
    }


def test_verify_source_compares_a_random_sample(tmp_path):
    root, path = _pack(tmp_path, mode="encoded")
    for name in ("cat/00.png", "cat/01.png", "cat/02.png", "cat/03.png", "cat/04.png"):
        _rotate(root / name)
    report = verify_pack(path, source=root, sample=4, seed=1)
    assert report.num_compared == 4
    assert report.changed == sum(p.message.startswith("changed") for p in report.problems)
    again = verify_pack(path, source=root, sample=4, seed=1)
    assert again.problems == report.problems  # the same seed, the same sample
    assert verify_pack(path, source=root).changed == 5


def test_cli_verify_source_says_which_side_is_which(tmp_path):
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    root, path = _pack(tmp_path)
    (root / "cat" / "00.png").unlink()
    _rotate(root / "dog" / "00.png")
    result = CliRunner().invoke(
        cli, ["verify", str(path), "--source", str(root), "--sample", "9", "-q"]
    )
    assert result.exit_code == 1
    assert "sample " in result.output
    assert "(cat/00.png): missing: in the pack, not in the source folder" in result.output
    assert "1 missing (in the pack, not in the source)" in result.output
    assert "0 extra (in the source, not in the pack)" in result.output
    assert "of 9 compared" in result.output
