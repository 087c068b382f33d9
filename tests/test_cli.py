"""The command line through CliRunner: exit codes, messages, no tracebacks."""

import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack.cli.main import cli, format_bytes, parse_bytes
from h5pack.core import format as fmt


def make_folder(root, *, per_class=3, vary=False):
    rng = np.random.default_rng(3)
    for c, name in enumerate(("ant", "bee")):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = (9 + i, 12) if vary else (9, 12)
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) // (c + 1)
            Image.fromarray(pixels).save(root / name / f"{i}.jpg")
    return root


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture
def images(tmp_path):
    return make_folder(tmp_path / "images")


def test_convert_info_verify(tmp_path, images):
    target = tmp_path / "out.h5"
    result = run("convert", images, target, "--workers", "1", "--chunk-samples", "2")
    assert result.exit_code == 0, result.output
    assert "packed 6 of 6 images" in result.stdout
    assert "auto mode chose raw pixels" in result.stderr
    assert fmt.load_meta(target).chunks == (2, 9, 12, 3)

    result = run("info", target)
    assert result.exit_code == 0, result.output
    assert "6 in 2 classes" in result.stdout
    assert "ant 3, bee 3" in result.stdout
    assert "chunked, chunk (2, 9, 12, 3)" in result.stdout

    result = run("verify", target, "--source", images, "--quiet")
    assert result.exit_code == 0, result.output
    assert "ok: 6 of 6 samples verified" in result.stdout


def test_info_json_fields(tmp_path, images):
    target = tmp_path / "out.h5"
    options = ["--workers", "1", "--compression", "zstd", "--level", "5", "--chunk-bytes", "1KiB"]
    assert run("convert", images, target, *options, "-q").exit_code == 0
    result = run("info", target, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in (
        "num_samples",
        "classes",
        "mode",
        "storage",
        "dtype",
        "images_shape",
        "layout",
        "chunk_shape",
        "chunk_bytes",
        "codec",
        "compression_ratio",
        "file_bytes",
        "plugins",
        "skipped",
    ):
        assert key in data
    assert data["num_samples"] == 6
    assert data["codec"] == "zstd level 5"
    assert data["plugins"] == ["Zstd (hdf5plugin)"]
    assert data["chunk_shape"] == [3, 9, 12, 3]  # 1 KiB holds 3 samples of 324 bytes
    assert data["dtype"] == "uint8"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--layout", "contiguous", "--compression", "gzip"], "chunked"),
        (["--chunk-bytes", "5GiB"], "4 GiB"),
        (["--chunk-bytes", "lots"], "not a size"),
        (["--chunk-samples", "0"], "positive"),
        (["--size", "0", "5"], "positive"),
        (["--compression", "snappy"], "snappy"),
        (["--compression", "gzip", "--level", "12"], "0..9"),
        (["--shuffle", "byte"], "--compression"),
        (["--mode", "encoded", "--size", "8", "8"], "--size"),
        (["--chunk-samples", "4", "--chunk-bytes", "1MiB"], "one of"),
        (["--quality", "80"], "--max-side"),
        (["--chunk-shape", "1,2,x"], "chunk shape"),
    ],
)
def test_impossible_flags_are_usage_errors(tmp_path, images, flags, message):
    target = tmp_path / "out.h5"
    result = run("convert", images, target, "--workers", "1", *flags)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not target.exists()


def test_existing_target_needs_overwrite(tmp_path, images):
    target = tmp_path / "out.h5"
    target.write_bytes(b"old")
    result = run("convert", images, target, "--workers", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "--overwrite" in result.stderr
    assert target.read_bytes() == b"old"
    assert run("convert", images, target, "--workers", "1", "--overwrite").exit_code == 0


def test_missing_source_and_pack_are_one_line_errors(tmp_path):
    result = run("convert", tmp_path / "nowhere", tmp_path / "out.h5")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    result = run("info", tmp_path / "missing.h5")
    assert result.exit_code == 1
    assert "no such pack" in result.stderr
    (tmp_path / "text.h5").write_text("hello")
    result = run("verify", tmp_path / "text.h5")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")


def test_bad_files_warn_and_strict_stops(tmp_path, images):
    (images / "bee" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    target = tmp_path / "out.h5"
    result = run("convert", images, target, "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "bee/broken.jpg" in warnings[0]
    assert "skipped 1 files" in result.stderr
    assert "packed 6 of 7 images" in result.stdout

    strict = tmp_path / "strict.h5"
    result = run("convert", images, strict, "--workers", "1", "--strict")
    assert result.exit_code == 1
    assert "bee/broken.jpg" in result.stderr
    assert not strict.exists()


def test_verify_exits_non_zero_naming_the_damage(tmp_path, images):
    target = tmp_path / "out.h5"
    assert run("convert", images, target, "--workers", "1", "--chunk-samples", "2").exit_code == 0
    with h5py.File(target, "r") as handle:
        info = handle[fmt.IMAGES].id.get_chunk_info(1)
    with open(target, "r+b") as raw:
        raw.seek(info.byte_offset + 5)
        raw.write(b"\x00\x01\x02")
    result = run("verify", target, "-q")
    assert result.exit_code == 1
    assert "checksum mismatch" in result.stdout
    assert "FAILED" in result.stderr


def test_demo_generates_packs_and_reads_a_batch(tmp_path):
    result = run("demo", "--out", tmp_path / "demo", "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    assert "generated 64 JPEGs" in result.stdout
    assert "packed 64 images" in result.stdout
    assert "read one batch back" in result.stdout
    assert (tmp_path / "demo" / "demo.h5").exists()


@pytest.mark.parametrize(
    ("text", "count"),
    [("8MiB", 8 * 2**20), ("4MB", 4 * 10**6), ("512k", 512 * 1024), ("100", 100), ("1.5KiB", 1536)],
)
def test_parse_bytes(text, count):
    assert parse_bytes(text) == count


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.0 MiB"


def test_lazy_commands_come_from_their_module(monkeypatch):
    import sys
    import types

    import click

    from h5pack.cli import main as cli_module

    module = types.ModuleType("h5pack_fake_commands")

    @click.command()
    def hello():
        click.echo("hello from a lazy command")

    module.hello = hello
    monkeypatch.setitem(sys.modules, "h5pack_fake_commands", module)
    monkeypatch.setitem(cli_module.LAZY_COMMANDS, "hello", "h5pack_fake_commands:hello")
    monkeypatch.setitem(cli_module.LAZY_COMMANDS, "ghost", "h5pack_no_such_module:ghost")
    result = run("hello")
    assert result.exit_code == 0
    assert "hello from a lazy command" in result.stdout
    listing = run("--help").stdout
    assert "hello" in listing
    assert "ghost" not in listing
