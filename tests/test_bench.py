"""h5pack.bench: timing, chunk work, patterns, bench."""

from __future__ import annotations

import json
import os
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from h5pack.bench import (
    BenchOptions,
    FullShuffleBatchSampler,
    MeasureOptions,
    PatternLoader,
    TrainingRead,
    bench_loader,
    measure_pack,
    pack_shape,
    parse_variant,
    parse_variants,
    quick_variants,
    time_interleaved,
)
from h5pack.bench.loaders import open_dataset
from h5pack.bench.measure import format_bench
from h5pack.bench.reading import SizeSurvey, parse_train_size
from h5pack.bench.report import to_json
from h5pack.bench.system import machine_info
from h5pack.bench.timing import Count, Timing
from h5pack.bench.variants import QUICK_VARIANTS, QUICK_VARIANTS_MIXED, variant_problem
from h5pack.cli.main import cli
from h5pack.core.layout import Compression
from h5pack.errors import OptionsError
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.advice import PackFacts, advise, share_labels
from h5pack.training.dataset import H5ImageDataset
from h5pack.training.sampler import EpochSpec
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import FakeClock

H, W = 32, 32


def _images(num: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # smooth images, so that codecs have something to compress
    base = rng.integers(0, 255, size=(num, 1, 1, 3)).astype(np.int16)
    ramp = np.arange(H * W, dtype=np.int16).reshape(1, H, W, 1) % 64
    noise = rng.integers(0, 8, size=(num, H, W, 3), dtype=np.int16)
    return list(np.clip(base + ramp + noise, 0, 255).astype(np.uint8))


def _pack(path: Path, num: int, **options: Any) -> Path:
    write_arrays(
        path,
        _images(num),
        np.arange(num) % 3,
        options=ConvertOptions(mode="raw", shuffle_samples=False, **options),
    )
    return path


@pytest.fixture
def gzip_pack(tmp_path: Path) -> Path:
    return _pack(tmp_path / "gzip.h5", 70, chunk_samples=8, compression=Compression(codec="gzip"))


# -- timing ------------------------------------------------------------------------------


def test_timing_median_spread_and_cpu_per_image() -> None:
    cpu = iter([0.0, 0.5, 1.0, 1.75, 2.0, 2.5])  # 0.5, 0.75 and 0.5 s of CPU per run
    timing = time_interleaved({"a": lambda: Count(10, 100)}, repeats=3, cpu=lambda: next(cpu))
    assert timing["a"].images == (10, 10, 10)
    assert len(timing["a"].elapsed_s) == 3
    assert timing["a"].cpu_s_per_image == pytest.approx(0.05)  # the median run's
    assert "50,000 us CPU/image" in timing["a"].describe()
    fixed = Timing((1.0, 2.0, 4.0), (100, 100, 100), (10**6, 10**6, 10**6))
    assert fixed.images_per_s == 50.0
    assert fixed.low == 25.0
    assert fixed.high == 100.0
    assert fixed.spread == pytest.approx(1.5)
    assert fixed.mb_per_s == pytest.approx(0.5)
    assert "50 img/s" in fixed.describe()


def test_timing_rejects_no_repeats() -> None:
    with pytest.raises(OptionsError, match="repeats should be >= 1"):
        time_interleaved({"a": lambda: Count(1, 1)}, repeats=0)


def test_time_interleaved_alternates_and_times_runs_of_enough_epochs() -> None:
    calls: list[str] = []
    clock = FakeClock()

    def run(name: str, seconds: float) -> Any:
        def epoch() -> Count:
            calls.append(name)
            clock.advance(seconds)
            return Count(10, 100)

        return epoch

    timings = time_interleaved(
        {"a": run("a", 0.002), "b": run("b", 0.002)},
        repeats=3,
        warmup=1,
        min_run_s=0.01,
        clock=clock,
    )
    assert calls[:2] == ["a", "b"]  # warm-up, then runs in turn
    for name in ("a", "b"):
        timing = timings[name]
        assert len(timing.rates) == 3
        assert timing.epochs_per_run >= 3  # 10 ms of 2 ms epochs
        assert timing.images == (10 * timing.epochs_per_run,) * 3
        assert timing.stable  # no target
    runs = [name for name in calls[2:]]
    first_b = runs.index("b")
    assert runs[:first_b] == ["a"] * timings["a"].epochs_per_run  # a's run, then b's


def test_time_interleaved_keeps_the_first_epoch_apart() -> None:
    clock = FakeClock()
    durations = iter([0.5] + [0.1] * 50)  # the first epoch fills a cache: 5x slower

    def epoch() -> Count:
        clock.advance(next(durations))
        return Count(10, 100)

    timing = time_interleaved({"a": epoch}, repeats=3, warmup=1, clock=clock)["a"]
    assert timing.first_epoch_s == pytest.approx(0.5)
    assert timing.first_epoch_per_s == pytest.approx(20.0)
    assert timing.images_per_s == pytest.approx(100.0)  # the later epochs
    assert time_interleaved({"a": epoch}, repeats=1, clock=clock)["a"].first_epoch_per_s is None


def test_time_interleaved_lengthens_noisy_runs_within_the_budget() -> None:
    durations = iter([0.001, 0.02] * 200)
    clock = FakeClock()

    def noisy() -> Count:
        clock.advance(next(durations))
        return Count(1, 1)

    timing = time_interleaved(
        {"x": noisy}, repeats=2, target_spread=0.2, budget_s=2.0, min_run_s=0.0, clock=clock
    )["x"]
    assert timing.epochs_per_run >= 2  # an even number of epochs per run evens them out
    assert timing.stable
    short = time_interleaved(
        {"x": noisy}, repeats=2, target_spread=0.2, budget_s=0.0, min_run_s=0.0, clock=clock
    )["x"]
    assert short.epochs_per_run == 1
    assert not short.stable  # said, not hidden


# -- chunk work per sample --------------------------------------------------------------


def test_chunk_work_matches_the_reader_and_favours_the_chunk_aware_order(
    gzip_pack: Path, tmp_path: Path
) -> None:
    from h5pack.read.packset import describe
    from h5pack.training.sampler import plan_epoch

    shape = pack_shape(gzip_pack)
    assert (shape.num_samples, shape.num_chunks) == (70, 9)
    spec = EpochSpec(batch_size=16, seed=0, window_chunks=3)
    with PackReader(gzip_pack, ReaderOptions(window_chunks=3)) as reader:
        for batch in plan_epoch(describe(gzip_pack).chunk_map, spec, epoch=0):
            reader.read_stored(batch)
        measured = reader.loads
    assert shape.reads("chunk", 70, window_chunks=3).chunk_loads == pytest.approx(measured)
    assert shape.reads("random", 70, window_chunks=3).chunks_per_sample == pytest.approx(6 / 9)
    raw = pack_shape(_pack(tmp_path / "raw.h5", 40, chunk_samples=20))
    assert raw.reads("random", 40, window_chunks=1).chunk_loads == 0  # read as runs
    assert raw.reads("random", 40).bytes_per_sample == raw.file_bytes / 40


# -- variants ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("raw-contig", "raw-contig"),
        ("RAW-c64-gzip", "raw-c64-gzip"),
        ("raw-4m-zstd:5-bit", "raw-4m-zstd:5-bit"),
        ("raw-1m-blosc-lz4", "raw-1m-blosc-lz4"),
        ("encoded-256k", "encoded-256k"),
    ],
)
def test_parse_variant_round_trips(text: str, name: str) -> None:
    assert parse_variant(text).name == name
    assert parse_variant(name).name == name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("jpeg-c4", "starts with raw or encoded"),
        ("raw-c4-brotli", "unknown token"),
        ("raw-contig-gzip", "HDF5 compresses only chunked"),
        ("encoded-c16", "chunk-bytes"),
    ],
)
def test_parse_variant_refuses_bad_names(text: str, message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        parse_variant(text)


def test_parse_variants_splits_and_dedupes() -> None:
    names = [s.name for s in parse_variants(["raw-contig,raw-c8-gzip", "raw-contig encoded-1m"])]
    assert names == ["raw-contig", "raw-c8-gzip", "encoded-1m"]


def test_quick_variants_follow_the_image_sizes() -> None:
    one = SizeSurvey.of([(375, 500)] * 5)
    mixed = SizeSurvey.of([(300, 400), (310, 420), (500, 375)])
    assert quick_variants(one).names == QUICK_VARIANTS
    assert quick_variants(mixed, (64, 64)).names == QUICK_VARIANTS
    choice = quick_variants(mixed)
    assert choice.names == QUICK_VARIANTS_MIXED
    assert "3 sizes" in choice.reason
    assert "--" not in choice.reason  # the user's terms, not flags they did not pass
    for name in choice.names:
        assert variant_problem(parse_variant(name), mixed) is None
    problem = variant_problem(parse_variant("raw-c1-gzip"), mixed)
    assert problem is not None
    assert "one image per chunk" in problem
    assert "--" not in problem
    assert variant_problem(parse_variant("raw-c1-gzip"), mixed, (64, 64)) is None


def test_training_read_and_its_flag() -> None:
    assert parse_train_size("224") == (224, 224)
    assert parse_train_size("224,320") == (224, 320)
    assert parse_train_size("none") is None
    with pytest.raises(OptionsError, match="--train-size"):
        parse_train_size("big")
    train = TrainingRead.of(224, crop="center", flip=True)
    assert train.describe() == "center crops of 224x224, flipped"
    assert TrainingRead().describe() == "images as stored"
    with pytest.raises(OptionsError, match="--train-size"):
        TrainingRead(flip=True)


def test_variant_command_uses_convert_flags() -> None:
    command = parse_variant("raw-c64-zstd:5-bit").command("imgs", "o.h5", size=(224, 224))
    assert command == (
        "h5pack convert imgs o.h5 --mode raw --size 224 224 --chunk-samples 64 "
        "--compression zstd --level 5 --shuffle-filter bit"
    )


# -- the loader's access patterns ----------------------------------------------------------


@pytest.mark.parametrize("pattern", ["random", "chunk", "sequential"])
def test_every_pattern_reads_through_the_same_dataset(
    gzip_pack: Path, pattern: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[tuple[type, list[int]]] = []
    original = H5ImageDataset.__getitems__

    def spy(self: H5ImageDataset, indices: Any) -> Any:
        reads.append((type(self), [int(i) for i in indices]))
        return original(self, indices)

    monkeypatch.setattr(H5ImageDataset, "__getitems__", spy)
    dataset = open_dataset(gzip_pack, TrainingRead())
    with PatternLoader(dataset, pattern, batch_size=16, workers=0) as loader:
        count = loader()
        planned = [b.tolist() for b in loader.plan(0)]
    assert count.images == 70
    assert {kind for kind, _ in reads} == {H5ImageDataset}
    assert [batch for _, batch in reads] == planned  # one __getitems__ per planned batch
    order = np.concatenate(planned)
    assert sorted(order.tolist()) == list(range(70))
    if pattern == "sequential":
        assert order.tolist() == list(range(70))
    if pattern == "random":
        assert planned == [b.tolist() for b in FullShuffleBatchSampler(70, 16).plan(0)]


def test_measure_pack_reports_every_pattern(gzip_pack: Path) -> None:
    options = MeasureOptions(
        batch_size=16,
        workers=0,
        repeats=2,
        min_run_s=0.0,
        target_spread=None,  # runs of one epoch each, never lengthened: counts below
    )
    steps: list[str] = []
    results = measure_pack(gzip_pack, options, on_step=steps.append)
    assert set(results) == {"random", "chunk", "sequential"}
    assert steps.count("chunk") == 3  # warm-up and two runs
    for result in results.values():
        assert result.images_per_s > 0
        assert len(result.timing.rates) == 2
        assert result.timing.low <= result.images_per_s <= result.timing.high
    assert results["chunk"].timing.images == (70, 70)
    assert results["random"].timing.images == (70, 70)  # a whole epoch, through the loader
    assert results["chunk"].reads.chunks_per_sample == pytest.approx(9 / 70)
    assert results["sequential"].shuffle_vs_random == pytest.approx(0.0)
    assert results["chunk"].shuffle_vs_random > 0.5
    assert results["random"].shuffle_vs_random > 0.9


# -- bench and diagnose ------------------------------------------------------------------


FAST = {"min_run_s": 0.0, "budget_s": 0.0}


@pytest.mark.parametrize("order", ["chunk", "random", "sequential"])
def test_bench_loader_gives_plausible_numbers(gzip_pack: Path, order: str) -> None:
    steps: list[int] = []
    result = bench_loader(
        gzip_pack,
        BenchOptions(batch_size=16, workers=0, order=order, repeats=3, warmup=1, **FAST),
        on_step=lambda: steps.append(1),
    )
    assert len(steps) == 4
    assert result.timing.images == (70, 70, 70)
    assert 10 < result.timing.images_per_s < 10**7
    assert result.timing.spread >= 0
    assert result.timing.mb_per_s == pytest.approx(
        result.timing.images_per_s * H * W * 3 / 1e6, rel=1e-6
    )
    assert result.reads.samples == 70
    assert result.train["description"] == "images as stored"
    assert "img/s" in format_bench(result)
    json.dumps(to_json(result))


def test_bench_reads_at_the_training_size(gzip_pack: Path) -> None:
    train = TrainingRead.of(24, crop="random-resized", flip=True)
    result = bench_loader(
        gzip_pack, BenchOptions(batch_size=16, workers=0, repeats=1, train=train, **FAST)
    )
    assert result.timing.nbytes == (70 * 24 * 24 * 3,)
    assert "random-resized crops of 24x24, flipped" in format_bench(result)


def test_bench_with_max_batches(gzip_pack: Path) -> None:
    result = bench_loader(
        gzip_pack, BenchOptions(batch_size=8, workers=0, repeats=1, max_batches=2, **FAST)
    )
    assert result.timing.images == (16,)
    assert result.timing.nbytes == (16 * H * W * 3,)  # uint8 pixels as stored


def test_bench_with_a_worker(gzip_pack: Path) -> None:
    result = bench_loader(gzip_pack, BenchOptions(batch_size=16, workers=1, repeats=1, **FAST))
    assert result.workers == 1
    assert result.timing.images == (70,)


def test_bench_options_refuse_bad_values() -> None:
    with pytest.raises(OptionsError, match="order should be one of"):
        BenchOptions(order="zigzag")
    with pytest.raises(OptionsError, match="batch_size"):
        BenchOptions(batch_size=0)


@pytest.fixture
def mixed_pack(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    images = [
        rng.integers(0, 255, size=(20 + i % 5, 30 - i % 7, 3), dtype=np.uint8) for i in range(30)
    ]
    path = tmp_path / "mixed.h5"
    write_arrays(path, images, np.arange(30) % 2, options=ConvertOptions(mode="raw"))
    return path


def test_bench_reads_a_pack_of_mixed_sizes_at_a_training_size(mixed_pack: Path) -> None:
    result = bench_loader(mixed_pack, BenchOptions(batch_size=8, workers=0, repeats=1, **FAST))
    assert result.train["size"] == [224, 224]
    assert result.train["auto"]
    assert "several sizes" in result.train["note"]
    assert result.timing.nbytes == (30 * 224 * 224 * 3,)
    stored = bench_loader(
        mixed_pack, BenchOptions(batch_size=8, workers=0, repeats=1, train=TrainingRead(), **FAST)
    )
    assert stored.timing.images == (30,)  # lists of images of their own sizes


def test_advice_applies_to_the_pack_measured(tmp_path: Path) -> None:
    encoded = PackFacts(
        mode="encoded",
        codec="none",
        layout="chunked",
        chunk_bytes=8 * 2**20,
        file_bytes=10**8,
        image_bytes=10**9,
        available_bytes=8 * 10**9,
        workers=2,
        transforms=False,
        size=(224, 224),
    )
    assert "larger chunks" not in advise("storage", encoded)
    assert "compression" not in advise("storage", encoded).split(";")[0].split(":")[1]
    assert "cache='decoded'" in advise("decode", encoded)
    assert share_labels(encoded)["decode"] == "decoding the files, crop and resize"
    small_chunks = dataclass_replace(encoded, chunk_bytes=64 * 1024)
    assert "larger ones" in advise("storage", small_chunks)
    raw = dataclass_replace(encoded, mode="raw", workers=2, size=None)
    assert "main process" in advise("loader", raw)
    lz4 = dataclass_replace(raw, codec="lz4", workers=0)
    assert "already a fast codec" in advise("decode", lz4)
    gzip = dataclass_replace(raw, codec="gzip level 4", workers=0)
    assert "--compression lz4" in advise("decode", gzip)
    # an install without the box decoder is told so, where a crop would use it
    assert "box decoder" not in advise("decode", encoded)
    whole = dataclass_replace(encoded, whole_jpegs="h5pack's box decoder was not built")
    assert "decoded whole because h5pack's box decoder was not built" in advise("decode", whole)
    assert "cache='decoded'" in advise("decode", whole)
    assert "box decoder" not in advise("decode", dataclass_replace(whole, size=None))
    raw_whole = dataclass_replace(gzip, whole_jpegs="h5pack's box decoder was not built")
    assert "box decoder" not in advise("decode", raw_whole)


def test_machine_info_describes_the_machine(tmp_path: Path) -> None:
    machine = machine_info(tmp_path)
    assert machine.cores >= 1
    assert str(machine.cores) in machine.describe()


# -- CLI -------------------------------------------------------------------------------


def test_cli_bench(gzip_pack: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            str(gzip_pack),
            "--workers",
            "0",
            "--batch-size",
            "16",
            "--repeats",
            "2",
            "--time-budget",
            "0",
            "--train-size",
            "16",
            "--crop",
            "center",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "img/s" in result.output
    assert "us CPU/image" in result.output.splitlines()[0]  # beside images/s
    assert "order chunk" in result.output
    assert "center crops of 16x16" in result.output


def test_cli_bench_json(gzip_pack: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            str(gzip_pack),
            "--workers",
            "0",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--time-budget",
            "0",
            "--json",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["timing"]["images_per_s"] > 0
    assert data["timing"]["cpu_s_per_image"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--crop", "center"], "--train-size"),
        (["--flip"], "--train-size"),
        (["--train-size", "big"], "--train-size"),
        (["--train-size", "none", "--flip"], "--train-size none"),
    ],
)
def test_cli_training_flags_are_checked(gzip_pack: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["bench", str(gzip_pack), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_bench_errors(tmp_path: Path) -> None:
    missing = CliRunner().invoke(cli, ["bench", str(tmp_path / "nope.h5")])
    assert missing.exit_code == 1
    assert "nope.h5" in missing.output
    assert "Traceback" not in missing.output
    bad = tmp_path / "plain.h5"
    with h5py.File(bad, "w") as handle:
        handle["x"] = 1
    not_pack = CliRunner().invoke(cli, ["bench", str(bad)])
    assert not_pack.exit_code == 1
    assert "not an h5pack pack" in not_pack.output
    workers = CliRunner().invoke(cli, ["bench", str(bad), "--workers", "many"])
    assert workers.exit_code == 2
    assert "auto" in workers.output


def test_bench_does_not_import_torch_on_import() -> None:
    code = "import sys, h5pack.bench, h5pack.cli.bench; print('torch' in sys.modules)"
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.stdout.strip() == "False"


# -- issue 20.4: README's recipe measurable; one name for one cache -------------------------


@pytest.fixture
def encoded_pack(tmp_path: Path) -> Path:
    from tests.helpers import jpeg

    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, size=(20 + i % 5, 30, 3), dtype=np.uint8) for i in range(24)]
    path = tmp_path / "encoded.h5"
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(images):
        (folder / f"{i:02d}.jpg").write_bytes(jpeg(image))
    from h5pack.write.convert import convert

    convert(folder, path, ConvertOptions(mode="encoded", workers=1))
    return path


def test_bench_reads_through_the_decoded_cache_after_the_first_epoch(encoded_pack: Path) -> None:
    train = TrainingRead.of(16)
    options = BenchOptions(batch_size=8, workers=0, train=train, cache="decoded", **FAST)
    dataset = open_dataset(encoded_pack, train, cache="decoded")
    with PatternLoader(dataset, "chunk", batch_size=8, workers=0, batchable=True) as loader:
        cache = dataset.cache
        assert cache is not None
        loader()  # the first epoch: the warm-up fills the cache
        first = cache.stats()
        loader()  # a later epoch: served from it
        later = cache.stats()
        assert first.entries == 24
        assert later.hits - first.hits == 24
    result = bench_loader(encoded_pack, options)
    text = format_bench(result)
    assert "decoded cache (the timed epochs come after the warm-up filled it)" in text
    assert "first epoch (filling the decoded cache):" in text
    plain = open_dataset(encoded_pack, train)  # without cache="decoded": none
    assert plain.cache is None
    plain.close()


def test_bench_cache_bytes_is_the_decoded_caches_budget(encoded_pack: Path) -> None:
    with pytest.raises(OptionsError, match=r"--chunk-cache-bytes"):
        BenchOptions(cache_bytes=2**20)  # the old meaning: refused, never reinterpreted
    BenchOptions(reader=ReaderOptions(chunk_cache_bytes=2**20))
    BenchOptions(cache="decoded", cache_bytes=2**20)
    result = CliRunner().invoke(cli, ["bench", str(encoded_pack), "--cache-bytes", "1MiB"])
    assert result.exit_code == 2
    assert "--chunk-cache-bytes" in result.output
    args = ["bench", str(encoded_pack), "--chunk-cache-bytes", "1MiB", "--workers", "0", "-q"]
    args += ["--time-budget", "0", "--repeats", "1"]
    assert CliRunner().invoke(cli, args).exit_code == 0


def test_tree_cpu_s_counts_a_child_unless_it_is_excluded() -> None:
    import subprocess
    import sys

    from h5pack.bench.system import tree_cpu_s

    spin = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print('spun', flush=True)\n"
        "sys.stdin.read()\n"
    )
    before = tree_cpu_s()
    child = subprocess.Popen(
        [sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "spun\n"
        with_child, without = tree_cpu_s(), tree_cpu_s(exclude={child.pid})
        # 0.25, not 0.3: CPU times come in clock ticks and their differences are float sums
        assert with_child - before >= 0.25  # the live child's own CPU seconds
        assert with_child - without >= 0.25  # all of it is the excluded child's
    finally:
        child.communicate("")
    assert tree_cpu_s() - before >= 0.25  # reaped: through this process's children times


def test_bench_json_holds_no_storage_options(gzip_pack: Path) -> None:
    secret = {"secret_access_key": "s3cr3t-never-printed"}
    reader = ReaderOptions(storage_options=secret)
    options = BenchOptions(batch_size=16, workers=0, repeats=1, warmup=0, reader=reader, **FAST)
    text = json.dumps(to_json(bench_loader(gzip_pack, options)))
    assert "s3cr3t" not in text
    assert "storage_options" not in json.loads(text)["options"]["reader"]
