"""The command line through CliRunner: exit codes, messages, no tracebacks."""

import json
import re

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack.cli.flags import format_bytes, parse_bytes
from h5pack.cli.main import cli
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
        (["--chunk-samples", "0"], "--chunk-samples (chunk_samples=) should be a positive"),
        (["--size", "0", "5"], "--size (size=) should be two positive"),
        (["--compression", "snappy"], "snappy"),
        (["--compression", "gzip", "--level", "12"], "--level (level=) for gzip should be in 0..9"),
        (["--compression", "zstd", "--level", "30"], "--level (level=) for zstd should be in"),
        (["--shuffle", "byte"], "--compression"),
        (["--mode", "encoded", "--size", "8", "8"], "--size (size=) applies to raw pixels"),
        (["--chunk-samples", "4", "--chunk-bytes", "1MiB"], "give one of --chunk-samples"),
        (["--quality", "80"], "--max-side"),
        (["--quality", "0", "--max-side", "9", "--mode", "encoded"], "--quality (quality=)"),
        (["--seed", "-1"], "--seed (seed=) should be a non-negative"),
        (["--max-side", "0", "--mode", "encoded"], "--max-side (max_side=) should be"),
        (["--chunk-shape", "1,2,x"], "chunk shape"),
        (["--layout", "contiguous", "--chunk-samples", "2"], "--chunk-samples (chunk_samples=)"),
    ],
)
def test_impossible_flags_are_usage_errors(tmp_path, images, flags, message):
    target = tmp_path / "out.h5"
    result = run("convert", images, target, "--workers", "1", *flags)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Error: " in result.stderr  # one capitalisation, as click's own usage errors
    assert not target.exists()


@pytest.mark.parametrize("flags", [["--chunk-samples", "0"], ["--level", "12"]])
def test_usage_errors_name_the_flag_not_only_the_parameter(tmp_path, images, flags):
    flags = ["--compression", "gzip", *flags] if "--level" in flags else flags
    result = run("convert", images, tmp_path / "out.h5", *flags)
    assert result.exit_code == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"Error: {flags[-2]} (")


def test_a_stray_image_beside_the_class_folders_is_skipped_with_one_warning(tmp_path, images):
    """Issue 10: one preview.png at the top of an ImageFolder tree stopped the conversion."""
    Image.new("RGB", (12, 9), "white").save(images / "preview.png")
    Image.new("RGB", (12, 9), "black").save(images / "cover.jpg")
    target = tmp_path / "out.h5"
    result = run("convert", images, target, "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1  # one line names both
    assert "cover.jpg, preview.png" in warnings[0]
    assert "belongs to no class" in warnings[0]
    assert "packed 6 of 6 images" in result.stdout
    assert "skipped 2 files (recorded in the pack)" in result.stderr
    meta = fmt.load_meta(target)
    assert meta.classes == ("ant", "bee")
    assert sorted(s.path for s in meta.skipped) == ["cover.jpg", "preview.png"]
    assert "WARNING" not in result.stderr  # the library's log is not printed again

    strict = tmp_path / "strict.h5"
    result = run("convert", images, strict, "--workers", "1", "--strict")
    assert result.exit_code == 1
    assert "Error: cover.jpg: image directly in the source folder" in result.stderr
    assert "--strict" in result.stderr
    assert not strict.exists()


def test_long_skipped_lists_are_cut_short(tmp_path, images):
    for i in range(25):
        (images / f"stray{i:02d}.jpg").write_bytes(b"not an image")
    (images / "ant" / "z_broken.jpg").write_bytes(b"\xff\xd8 broken")
    for i in range(30):
        Image.new("RGB", (12, 9)).save(images / "bee" / f"more{i:02d}.jpg")
    result = run("convert", images, tmp_path / "out.h5", "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    assert "skipped 26 files" in result.stderr
    assert "and 6 more: `h5pack info --json" in result.stderr
    assert len([x for x in result.stderr.splitlines() if x.startswith("Warning:")]) == 2


def test_sizes_are_shown_width_by_height(tmp_path):
    root = tmp_path / "wide"
    (root / "a").mkdir(parents=True)
    for i in range(2):
        Image.new("RGB", (40, 10)).save(root / "a" / f"{i}.png")  # 40 wide, 10 high
    target = tmp_path / "out.h5"
    result = run("convert", root, target, "--workers", "1")
    assert result.exit_code == 0, result.output
    assert "all 2 images are 40x10" in result.stderr
    assert "samples 40x10 (WxH)" in run("info", target).stdout


def test_info_counts_padding_and_uncompressed_blobs_have_none(tmp_path):
    vary = make_folder(tmp_path / "vary", vary=True)
    packed = tmp_path / "auto.h5"
    assert run("convert", vary, packed, "--workers", "1", "-q").exit_code == 0
    lines = run("info", packed).stdout
    assert "layout    contiguous" in lines
    assert "ratio     1.00" in lines
    assert "is padding" not in lines
    chunked = tmp_path / "chunked.h5"
    flags = ["--layout", "chunked", "--chunk-bytes", "4KiB", "--workers", "1", "-q"]
    assert run("convert", vary, chunked, *flags).exit_code == 0
    assert "is padding" in run("info", chunked).stdout


def test_existing_target_needs_overwrite(tmp_path, images):
    target = tmp_path / "out.h5"
    target.write_bytes(b"old")
    result = run("convert", images, target, "--workers", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert "--overwrite" in result.stderr
    assert target.read_bytes() == b"old"
    assert run("convert", images, target, "--workers", "1", "--overwrite").exit_code == 0


def test_missing_source_and_pack_are_one_line_errors(tmp_path):
    result = run("convert", tmp_path / "nowhere", tmp_path / "out.h5")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    result = run("info", tmp_path / "missing.h5")
    assert result.exit_code == 1
    assert "no such pack" in result.stderr
    (tmp_path / "text.h5").write_text("hello")
    result = run("verify", tmp_path / "text.h5")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")


def test_bad_files_warn_and_strict_stops(tmp_path, images):
    (images / "bee" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    target = tmp_path / "out.h5"
    result = run("convert", images, target, "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1
    assert "bee/broken.jpg" in warnings[0]
    assert "skipped 1 file (recorded in the pack)" in result.stderr
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


def test_demo_says_each_message_once(tmp_path):
    result = run("demo", "--out", tmp_path / "demo", "--workers", "1")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert sum("auto mode chose" in line for line in lines) == 1, result.output
    messages = [re.sub(r"^\d\. ", "", line) for line in lines if "%|" not in line]
    assert len(messages) == len(set(messages)), result.output


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
    result = run("hello")
    assert result.exit_code == 0
    assert "hello from a lazy command" in result.stdout
    listing = run("--help").stdout
    assert "hello" in listing


@pytest.mark.parametrize("command", ["info", "bench"])
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epoch-samples", "8"], "--epoch-samples applies to a mix: add --weights"),
        (["--weights", "1,2,3"], "should give one weight per source (2), but got 3"),
    ],
)
def test_a_mix_needs_one_weight_per_source(command, flags, message):
    result = CliRunner().invoke(cli, [command, "a.h5", "b.h5", *flags])
    assert result.exit_code == 2, result.output
    assert message in result.output
