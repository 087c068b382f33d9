"""h5pack compare: end to end on tiny folders, on given packs, recommendations, reports, errors."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from h5pack.bench import CompareOptions, MeasureOptions, TrainingRead, compare, recommend
from h5pack.bench.access import ReadCount
from h5pack.bench.measure import PatternResult
from h5pack.bench.ranking import VariantResult
from h5pack.bench.report import PLOT_HINT, format_compare, table_rows, write_report
from h5pack.bench.timing import Timing
from h5pack.bench.variants import QUICK_VARIANTS, QUICK_VARIANTS_MIXED
from h5pack.cli.main import cli
from h5pack.core.layout import Compression
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

# 48 images of 256 x 256: 9.4 MB of pixels, raw-16m-gzip in one chunk.
NUM_IMAGES = 48
PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
# Short measurements: what the tests check does not depend on a steady figure.
TINY = MeasureOptions(
    batch_size=8,
    workers=0,
    repeats=1,
    warmup=0,
    min_run_s=0.0,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    spec = SampleSpec(num_images=NUM_IMAGES, num_classes=3, size=(256, 256), seed=1)
    make_image_folder(root, spec, photos=False)
    return root


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Images of many sizes (as real photo folders have), cut from real photos if present."""
    root = tmp_path_factory.mktemp("mixed")
    spec = SampleSpec(num_images=24, num_classes=2, size=(40, 56), size_jitter=0.3, seed=2)
    make_image_folder(root, spec, photos=PHOTOS if PHOTOS.is_dir() else False)
    return root


@pytest.fixture(scope="module")
def quick_run(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    out = tmp_path_factory.mktemp("report")
    result = CliRunner().invoke(
        cli,
        [
            "compare",
            str(folder),
            "--out",
            str(out),
            "--quick",
            "--convert-workers",
            "1",
            "--workers",
            "0",
            "--batch-size",
            "16",
            "-q",
        ],
    )
    return result, out


def test_quick_compare_prints_a_ranked_table(quick_run: tuple[Any, Path]) -> None:
    result, _ = quick_run
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name in QUICK_VARIANTS:
        assert any(f" {name} " in f" {line} " for line in lines), name
    assert "Use " in result.output
    assert "h5pack convert" in result.output
    assert "Read as stored: the images have one size, 256x256" in result.output
    assert "naive h5py" not in result.output  # retired (ARCHITECTURE.md)
    header = next(line for line in lines if line.startswith("#"))
    assert header.split()[-1] == "CPU/image"  # beside the rates, every variant's


def test_quick_compare_writes_sane_json(quick_run: tuple[Any, Path]) -> None:
    _, out = quick_run
    data = json.loads((out / "report.json").read_text())
    names = [v["name"] for v in data["variants"]]
    assert sorted(names) == sorted(QUICK_VARIANTS)
    rates = [v["patterns"]["chunk"]["images_per_s"] for v in data["variants"]]
    assert rates == sorted(rates, reverse=True)  # ranked by chunk-aware throughput
    for variant in data["variants"]:
        assert variant["file_bytes"] > 0
        assert variant["image_bytes"] == NUM_IMAGES * 256 * 256 * 3
        assert variant["pixels_per_file_byte"] > 0
        assert variant["convert_s"] > 0
        assert variant["num_samples"] == NUM_IMAGES
        assert variant["path"] is None  # not kept
        assert set(variant["patterns"]) == {"random", "chunk", "sequential"}
        for pattern in ("random", "chunk", "sequential"):
            result = variant["patterns"][pattern]
            assert result["images_per_s"] > 0
            assert result["mb_per_s"] > 0
            assert result["timing"]["low"] <= result["images_per_s"] <= result["timing"]["high"]
            assert len(result["timing"]["elapsed_s"]) == 2
            assert result["bytes_per_sample"] > 0
            assert 0 <= result["shuffle_vs_random"] < 1.5
        assert variant["patterns"]["sequential"]["shuffle_vs_random"] < 0.2
        assert variant["patterns"]["chunk"]["shuffle_vs_random"] > 0.5
        assert variant["problem"] is None
    by_name = {v["name"]: v for v in data["variants"]}
    big = by_name["raw-16m-gzip"]["patterns"]
    # one 16 MiB chunk: the loader's window keeps it whatever the order
    assert big["random"]["chunks_per_sample"] == pytest.approx(1 / NUM_IMAGES)
    assert big["chunk"]["chunks_per_sample"] == pytest.approx(1 / NUM_IMAGES)
    assert by_name["raw-contig"]["patterns"]["random"]["chunks_per_sample"] == 0
    pixels = {name: v["pixels_per_file_byte"] for name, v in by_name.items()}
    assert pixels["encoded-1m"] > pixels["raw-contig"]
    assert data["recommendation"]["name"] in names
    assert data["machine"]["cores"] >= 1
    assert data["train"]["description"] == "images as stored"


def test_quick_compare_writes_markdown_and_plots(quick_run: tuple[Any, Path]) -> None:
    _, out = quick_run
    markdown = (out / "report.md").read_text()
    assert "| # | variant |" in markdown
    assert "**Use " in markdown
    for name in QUICK_VARIANTS:
        assert f"| {name} |" in markdown
    for plot in ("throughput.png", "size_vs_throughput.png"):
        data = (out / plot).read_bytes()
        assert data.startswith(b"\x89PNG")
        assert f"]({plot})" in markdown
    assert not any(p.name.startswith(".packs-") for p in out.iterdir())  # temp packs removed


@pytest.fixture
def packs(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    images = list(rng.integers(0, 255, size=(24, 16, 16, 3), dtype=np.uint8))
    made = []
    for name, options in [
        ("plain", ConvertOptions(layout="contiguous")),
        ("zipped", ConvertOptions(chunk_samples=8, compression=Compression(codec="gzip"))),
    ]:
        path = tmp_path / f"{name}.h5"
        write_arrays(path, images, np.arange(24) % 2, options=options)
        made.append(path)
    return made


def test_compare_given_packs_without_matplotlib(
    packs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "report"
    result = CliRunner().invoke(
        cli,
        [
            "compare",
            *map(str, packs),
            "--out",
            str(out),
            "--repeats",
            "1",
            "--workers",
            "0",
            "--batch-size",
            "8",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    assert PLOT_HINT in result.output
    assert PLOT_HINT in (out / "report.md").read_text()
    assert not list(out.glob("*.png"))
    data = json.loads((out / "report.json").read_text())
    assert sorted(v["name"] for v in data["variants"]) == ["plain", "zipped"]
    assert all(v["convert_s"] is None for v in data["variants"])
    assert all(v["path"] for v in data["variants"])


def test_quick_compare_on_mixed_sizes_builds_what_the_folder_allows(
    mixed_folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    argv = ["compare", str(mixed_folder), "--quick", "--out", str(out)]
    argv += ["--convert-workers", "1", "--workers", "0", "--batch-size", "8", "--repeats", "1"]
    result = CliRunner().invoke(cli, [*argv, "--train-size", "32", "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    assert sorted(v["name"] for v in data["variants"]) == sorted(QUICK_VARIANTS_MIXED)
    assert data["skipped"] == []  # all four promised, all four built
    assert "skipped" not in result.output
    plan = data["plan"]
    assert "sizes" in plan
    for flag in ("--chunk", "--size", "--layout", "--mode", "--compression"):
        assert flag not in plan  # in the user's terms, no flag they did not pass
    assert "random-resized crops of 32x32" in result.output
    assert all(v["problem"] is None for v in data["variants"])  # batchable at a size
    assert data["recommendation"]["name"] in QUICK_VARIANTS_MIXED


def test_compare_never_recommends_what_the_loader_cannot_batch(mixed_folder: Path) -> None:
    options = CompareOptions(
        variants=("raw-contig", "encoded-64k"),
        train=TrainingRead(),  # as stored: images of several sizes
        measure=TINY,
        convert_workers=1,
    )
    report = compare(mixed_folder, options)
    assert {v.name for v in report.variants} == {"raw-contig", "encoded-64k"}
    assert all(not v.batchable for v in report.variants)
    assert all("cannot stack them into batches" in (v.problem or "") for v in report.variants)
    recommendation = report.recommendation
    assert recommendation is not None
    assert recommendation.name is None
    assert "No layout to recommend" in recommendation.line
    assert "--train-size" in recommendation.line  # what to do, named by its flag
    text = format_compare(report)
    assert "raw-contig *" in text
    assert "Use " not in text

    auto = compare(mixed_folder, CompareOptions(variants=("raw-contig",), measure=TINY))
    assert auto.train["size"] == [224, 224]
    assert auto.train["auto"]
    assert all(v.batchable for v in auto.variants)
    assert auto.recommendation is not None
    assert auto.recommendation.name == "raw-contig"
    assert "several sizes" in auto.read_note


def _result(name: str, rate: float, file_bytes: int, problem: str | None = None) -> VariantResult:
    timing = Timing((1.0,), (int(rate),), (int(rate) * 3,))
    pattern = PatternResult(
        pattern="chunk",
        timing=timing,
        workers=0,
        window_chunks=1,
        reads=ReadCount(1, 0, 1),
        shuffle_bits=1.0,
        shuffle_vs_random=1.0,
    )
    return VariantResult(
        name=name,
        path=None,
        mode="raw",
        storage="array",
        layout="chunked",
        codec="none",
        chunk_bytes=1,
        samples_per_chunk=1.0,
        num_samples=1,
        file_bytes=file_bytes,
        image_bytes=file_bytes,
        convert_s=None,
        command=f"convert {name}",
        patterns={"chunk": pattern},
        problem=problem,
    )


def test_recommend_weighs_speed_size_and_batchability() -> None:
    fast, close, slow_small = (
        _result("fast", 1000, 10**9),
        _result("close", 950, 10**8),
        _result("tiny", 100, 10**6),
    )
    choice = recommend([fast, close, slow_small], available_bytes=10**12)
    assert choice is not None
    assert choice.name == "close"  # within 10% and 10x smaller
    assert "within 5% of the fastest (fast) and 10.0x smaller" in choice.line
    assert any("The smallest, tiny" in note for note in choice.notes)
    unbatchable = _result("fastest", 5000, 10**6, problem="its images have 3 sizes")
    choice = recommend([unbatchable, fast], available_bytes=10**12)
    assert choice is not None
    assert choice.name == "fast"
    assert any("Not candidates: fastest" in note for note in choice.notes)


def test_recommend_says_when_a_pack_is_larger_than_the_page_cache() -> None:
    choice = recommend(
        [_result("big", 1000, 10**9), _result("small", 990, 10**6)], available_bytes=10**8
    )
    assert choice is not None
    note = " ".join(choice.notes)
    assert "big is larger than 50% of the memory available" in note
    assert "loader.stats()" in note
    fits = recommend([_result("small", 990, 10**6)], available_bytes=10**8)
    assert fits is not None
    assert any("Every pack fits in the page cache" in note for note in fits.notes)


def test_compare_library_keeps_packs_and_skips_impossible_variants(
    folder: Path, tmp_path: Path
) -> None:
    events: list[Any] = []
    options = CompareOptions(
        variants=("raw-c8", "encoded-64k"),
        measure=MeasureOptions(
            batch_size=16, workers=0, repeats=1, warmup=0, min_run_s=0.0, patterns=("chunk",)
        ),
        convert_workers=1,
        size=(32, 32),
    )
    report = compare(
        folder, options, work_dir=tmp_path / "packs", keep=True, on_event=events.append
    )
    # raw pixels at 32x32 and the 256x256 files hold different pixels: ranked apart, the
    # full-size images first
    assert [v.name for v in report.variants] == ["encoded-64k", "raw-c8"]
    assert [row[0] for row in table_rows(report)] == ["A1", "B1"]
    for variant in report.variants:
        assert variant.path is not None
        assert Path(variant.path).exists()
        assert set(variant.patterns) == {"chunk"}
    assert report.work_dir == str(tmp_path / "packs")
    starts = [e for e in events if e.kind == "phase"]
    steps = [e for e in events if e.kind == "step"]
    assert len(starts) == 1
    assert len(steps) == starts[0].total
    rows = table_rows(report)
    assert rows[0][5] == "-"  # random not measured
    files = write_report(report, tmp_path / "out", plots=False)
    assert files.plots == ()
    assert files.json.exists()


def test_recommend_prefers_a_smaller_pack_that_is_nearly_as_fast(
    folder: Path, tmp_path: Path
) -> None:
    options = CompareOptions(
        variants=("raw-contig", "encoded-1m"),
        measure=MeasureOptions(
            batch_size=16, workers=0, repeats=1, warmup=0, min_run_s=0.0, patterns=("chunk",)
        ),
        convert_workers=1,
    )
    report = compare(folder, options)
    assert recommend([]) is None
    recommendation = recommend(report.variants)
    assert recommendation is not None  # which one: the injected tests below, not rates
    assert recommendation.name in {v.name for v in report.variants}
    assert recommendation.name in recommendation.line


def _runs(name: str, rates: tuple[float, ...], file_bytes: int) -> VariantResult:
    """A variant whose chunk-aware runs delivered 1,000 images at each of ``rates``."""
    timing = Timing(tuple(1000 / r for r in rates), (1000,) * len(rates), (3000,) * len(rates))
    result = _result(name, 1, file_bytes)
    chunk = dataclasses.replace(result.patterns["chunk"], timing=timing)
    return dataclasses.replace(result, patterns={"chunk": chunk})


# Two comparisons of one folder on a busy machine (issue 20.1): the same three variants,
# their runs scattered differently each time. By medians alone RUN_B picks raw-4m (raw-contig
# is 14% slower), RUN_A raw-contig; by the runs' intervals both pick raw-contig.
RUN_A = {"raw-contig": (1300, 900, 1100), "raw-4m": (1000, 1250, 1150), "zstd": (400, 450, 430)}
RUN_B = {"raw-contig": (950, 900, 700), "raw-4m": (1200, 900, 1050), "zstd": (420, 380, 500)}
SIZES = {"raw-contig": 10**8, "raw-4m": 12 * 10**7, "zstd": 3 * 10**7}


@pytest.mark.parametrize("run", [RUN_A, RUN_B])
def test_a_noisy_ranking_recommends_the_same_pack_and_says_too_close(run) -> None:
    variants = [_runs(name, rates, SIZES[name]) for name, rates in run.items()]
    choice = recommend(variants, available_bytes=10**12)
    assert choice is not None
    assert choice.name == "raw-contig"  # both runs: the smaller of the two front-runners
    if run is RUN_B:  # raw-4m's median is higher, and their runs overlap
        assert choice.too_close == ("raw-4m",)
        assert "too close to call against raw-4m: their timed runs overlap" in choice.line
    assert choice.rough  # ±20% and more: bench's warning
    assert any("the machine may be busy; take those figures as rough" in n for n in choice.notes)


def test_a_clear_ranking_is_not_too_close_and_not_rough() -> None:
    fast = _runs("fast", (1000, 1010, 1005), 10**9)
    small = _runs("small", (500, 505, 502), 10**6)
    choice = recommend([fast, small], available_bytes=10**12)
    assert choice is not None
    assert choice.name == "fast"
    assert choice.too_close == ()
    assert not choice.rough
    assert not any("machine may be busy" in note for note in choice.notes)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["compare", "MISSING"], 2, "does not exist"),
        (["compare", "FOLDER", "--variants", "raw-zigzag"], 2, "unknown token"),
        (["compare", "FOLDER", "PACK"], 1, "packs only"),
        (["compare", "NOTPACK"], 1, "not a readable HDF5 file"),
    ],
)
def test_compare_errors(
    args: list[str], code: int, message: str, folder: Path, packs: list[Path], tmp_path: Path
) -> None:
    not_pack = tmp_path / "notes.h5"
    not_pack.write_text("hello")
    names = {
        "MISSING": str(tmp_path / "missing"),
        "FOLDER": str(folder),
        "PACK": str(packs[0]),
        "NOTPACK": str(not_pack),
    }
    argv = [names.get(a, a) for a in args] + ["--out", str(tmp_path / "out"), "-q"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output


# -- issue 20: partial epochs, one "ratio" -------------------------------------------------


def test_a_figure_from_part_of_an_epoch_is_marked(tmp_path: Path) -> None:
    from h5pack.bench.compare import CompareReport
    from h5pack.bench.measure import epoch_fraction
    from h5pack.bench.system import machine_info

    assert epoch_fraction(Timing((1.0, 1.0), (32, 32), (0, 0)), 100) == pytest.approx(0.32)
    assert epoch_fraction(Timing((1.0,), (200,), (0,), epochs_per_run=2), 100) == 1.0
    whole = _runs("whole", (100, 100), 10**6)
    cut = _runs("cut", (100, 100), 10**6)
    chunk = dataclasses.replace(cut.patterns["chunk"], epoch_fraction=0.32)
    cut = dataclasses.replace(cut, patterns={"chunk": chunk})
    report = CompareReport(
        source="x",
        variants=(whole, cut),
        skipped=(),
        machine=machine_info(tmp_path),
        options=CompareOptions(),
        recommendation=None,
        work_dir=None,
    )
    rows = {row[1]: row for row in table_rows(report)}
    assert rows["cut"][6].endswith("†32%")  # chunk-aware img/s
    assert "†" in rows["cut"][9]  # chunks/sample rests on the same prefix
    assert "†" not in rows["whole"][6]
    text = format_compare(report)
    assert "†N%: timed on the first N% of an epoch, not whole epochs: cut (chunk)" in text


def test_one_word_one_meaning_for_ratio() -> None:
    from h5pack.bench.report import COLUMNS, NOTES

    assert "ratio" not in COLUMNS
    assert "pixels/file" in COLUMNS
    assert any("h5pack info's ratio is the stored bytes over the file's" in note for note in NOTES)


# -- issue 29.6: like with like ---------------------------------------------------------


def test_packs_of_different_pixels_are_not_ranked_on_speed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    small, full = tmp_path / "out.h5", tmp_path / "raw.h5"
    for path, side in ((small, 8), (full, 32)):
        images = list(rng.integers(0, 255, size=(16, side, side, 3), dtype=np.uint8))
        write_arrays(path, images, np.arange(16) % 2, options=ConvertOptions())
    argv = ["compare", str(small), str(full), "--repeats", "1", "--workers", "0"]
    argv += ["--batch-size", "8", "--no-plots", "-q", "--out", str(tmp_path / "report")]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    assert "Not ranked: these packs hold different pixels (raw: 16 images, one size, 32x32" in (
        result.output
    )
    assert "out: 16 images, one size, 8x8 (W x H)" in result.output
    assert "--across-pixels" in result.output
    assert "Use out" not in result.output
    assert "Ranked apart, since they hold different pixels: A = 16 images" in result.output
    # asked for, they are ranked together on speed, and the line still says they differ
    result = CliRunner().invoke(cli, [*argv, "--across-pixels"])
    assert result.exit_code == 0, result.output
    assert "Use " in result.output
    assert "These packs hold different pixels (" in result.output
    assert "ranked on speed all the same (--across-pixels)" in result.output


def test_like_packs_are_ranked_among_themselves() -> None:
    full = [
        dataclasses.replace(_result(n, r, b), pixels="full", image_bytes=100, num_samples=1)
        for n, r, b in (("a", 1000, 10**8), ("b", 500, 10**6))
    ]
    thumbs = dataclasses.replace(_result("thumbs", 9000, 10**5), pixels="thumbs", image_bytes=1)
    choice = recommend([*full, thumbs], available_bytes=10**12)
    assert choice is not None
    assert choice.name == "a"
    assert "ranked among the packs of full only; not against thumbs" in choice.notes[0]
