"""h5pack.bench: timing, read replay (checked against real reads), loader bench, diagnose."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from h5pack.bench import (
    BOTTLENECKS,
    BenchOptions,
    MeasureOptions,
    bench_loader,
    diagnose,
    drop_page_cache,
    measure_pack,
    parse_variant,
    parse_variants,
    replay_h5py,
    replay_reader,
    resident_fraction,
    storage_layout,
    time_repeats,
)
from h5pack.bench.access import random_order, read_per_sample
from h5pack.bench.report import format_bench, format_diagnosis, to_json
from h5pack.bench.system import machine_info, warm_page_cache
from h5pack.bench.timing import Count, Timing
from h5pack.cli.main import cli
from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.errors import OptionsError
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.sampler import EpochSpec
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

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


class _CountingFile(io.RawIOBase):
    """A file object that records every read h5py makes."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115  (closed in close())
        self.reads: list[tuple[int, int]] = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        position = self._file.tell()
        count = self._file.readinto(buffer)
        self.reads.append((position, count or 0))
        return count or 0

    def close(self) -> None:
        self._file.close()
        super().close()


def _measured_h5py_reads(path: Path, order: np.ndarray, cache_bytes: int) -> tuple[int, int]:
    """Chunk loads and bytes h5py really reads for per-sample access in ``order``."""
    with h5py.File(path, "r") as handle:
        chunks: dict[int, int] = {}
        handle[fmt.IMAGES].id.chunk_iter(
            lambda info: chunks.__setitem__(info.byte_offset, info.size)
        )
    counting = _CountingFile(path)
    with h5py.File(counting, "r", rdcc_nbytes=cache_bytes, rdcc_nslots=521) as handle:
        images = handle[fmt.IMAGES]
        counting.reads.clear()
        for i in order.tolist():
            images[i]
        reads = list(counting.reads)
    counting.close()
    loads = sum(1 for offset, size in reads if chunks.get(offset) == size)
    return loads, sum(size for _, size in reads)


# -- timing ------------------------------------------------------------------------------


def test_time_repeats_median_and_spread() -> None:
    calls = iter([0.0, 0.0, 0.0])
    timing = time_repeats(lambda: Count(10, 100) if next(calls) == 0.0 else Count(0, 0), repeats=3)
    assert timing.images == (10, 10, 10)
    assert len(timing.elapsed_s) == 3
    fixed = Timing((1.0, 2.0, 4.0), (100, 100, 100), (10**6, 10**6, 10**6))
    assert fixed.images_per_s == 50.0
    assert fixed.low == 25.0
    assert fixed.high == 100.0
    assert fixed.spread == pytest.approx(1.5)
    assert fixed.mb_per_s == pytest.approx(0.5)
    assert "50 img/s" in fixed.describe()


def test_time_repeats_rejects_no_repeats() -> None:
    with pytest.raises(OptionsError, match="repeats should be >= 1"):
        time_repeats(lambda: Count(1, 1), repeats=0)


# -- replay against real reads -----------------------------------------------------------


@pytest.mark.parametrize("cache_kib", [64, 1024])
def test_replay_h5py_matches_the_reads_h5py_makes(gzip_pack: Path, cache_kib: int) -> None:
    layout = storage_layout(gzip_pack)
    order = random_order(70, seed=3)
    loads, nbytes = _measured_h5py_reads(gzip_pack, order, cache_kib * 1024)
    replayed = replay_h5py(layout, order, cache_bytes=cache_kib * 1024, cache_slots=521)
    assert replayed.chunk_loads == pytest.approx(loads, rel=0.1)
    assert replayed.bytes_read == pytest.approx(nbytes, rel=0.1)


def test_replay_h5py_uncompressed_chunk_larger_than_cache_reads_only_the_sample(
    tmp_path: Path,
) -> None:
    pack = _pack(tmp_path / "raw.h5", 40, chunk_samples=20)
    order = random_order(40, seed=1)
    loads, nbytes = _measured_h5py_reads(pack, order, 4096)
    replayed = replay_h5py(storage_layout(pack), order, cache_bytes=4096, cache_slots=521)
    assert loads == replayed.chunk_loads == 0
    assert replayed.bytes_read == 40 * H * W * 3
    assert nbytes == pytest.approx(replayed.bytes_read, rel=0.05)


def test_replay_reader_matches_pack_reader_loads(gzip_pack: Path) -> None:
    from h5pack.training.sampler import plan_epoch

    layout = storage_layout(gzip_pack)
    batches = plan_epoch(
        layout.groups, EpochSpec(batch_size=16, seed=0, window_chunks=3), epoch=0
    )
    with PackReader(gzip_pack, ReaderOptions(window_chunks=3)) as reader:
        for batch in batches:
            reader.read_stored(batch)
        measured = reader.loads
    replayed = replay_reader(layout, batches, window_chunks=3)
    assert replayed.chunk_loads == measured == layout.groups.num_chunks  # once per epoch
    assert replayed.samples == 70
    assert replayed.bytes_read == int(layout.stored_sizes.sum())


def test_chunk_aware_reads_fewer_chunks_than_random(gzip_pack: Path) -> None:
    layout = storage_layout(gzip_pack)
    from h5pack.training.sampler import plan_epoch

    chunk = replay_reader(
        layout,
        plan_epoch(layout.groups, EpochSpec(batch_size=16, window_chunks=4), epoch=0),
        window_chunks=4,
    )
    naive = replay_h5py(layout, random_order(70, seed=0), cache_bytes=8 * H * W * 3)
    assert chunk.chunks_per_sample < naive.chunks_per_sample / 3


def test_read_per_sample_stops_at_the_budget(gzip_pack: Path) -> None:
    count = read_per_sample(gzip_pack, np.arange(70), budget_s=1e-9, min_samples=5)
    assert count.images == 5
    assert count.nbytes == 5 * H * W * 3
    assert read_per_sample(gzip_pack, np.arange(70)).images == 70


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


def test_variant_command_uses_convert_flags() -> None:
    command = parse_variant("raw-c64-zstd:5-bit").command("imgs", "o.h5", size=(224, 224))
    assert command == (
        "h5pack convert imgs o.h5 --mode raw --size 224 224 --chunk-samples 64 "
        "--compression zstd --level 5 --shuffle bit"
    )


# -- measure_pack ------------------------------------------------------------------------


def test_measure_pack_reports_every_pattern(gzip_pack: Path) -> None:
    options = MeasureOptions(batch_size=16, workers=0, repeats=2, random_budget_s=0.05)
    steps: list[str] = []
    results = measure_pack(gzip_pack, options, on_step=steps.append)
    assert set(results) == {"random", "chunk", "sequential"}
    assert steps.count("random") == 2
    assert steps.count("chunk") == 3
    for result in results.values():
        assert result.images_per_s > 0
        assert len(result.timing.rates) == 2
        assert result.timing.low <= result.images_per_s <= result.timing.high
    assert results["chunk"].timing.images == (70, 70)
    assert results["chunk"].reads.chunks_per_sample == pytest.approx(9 / 70)
    assert results["sequential"].shuffle_vs_random == pytest.approx(0.0)
    assert results["chunk"].shuffle_vs_random > 0.5


# -- bench and diagnose ------------------------------------------------------------------


@pytest.mark.parametrize("order", ["chunk", "random", "sequential"])
def test_bench_loader_gives_plausible_numbers(gzip_pack: Path, order: str) -> None:
    steps: list[int] = []
    result = bench_loader(
        gzip_pack,
        BenchOptions(batch_size=16, workers=0, order=order, repeats=3, warmup=1),
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
    assert "img/s" in format_bench(result)
    json.dumps(to_json(result))


def test_bench_with_transforms_and_max_batches(gzip_pack: Path) -> None:
    result = bench_loader(
        gzip_pack,
        BenchOptions(batch_size=8, workers=0, transforms=True, repeats=1, max_batches=2),
    )
    assert result.timing.images == (16,)
    # float32 crops of 7/8 of each side
    assert result.timing.nbytes == (16 * 3 * 28 * 28 * 4,)


def test_bench_with_a_worker(gzip_pack: Path) -> None:
    result = bench_loader(gzip_pack, BenchOptions(batch_size=16, workers=1, repeats=1))
    assert result.workers == 1
    assert result.timing.images == (70,)


def test_bench_options_refuse_bad_values() -> None:
    with pytest.raises(OptionsError, match="order should be one of"):
        BenchOptions(order="zigzag")
    with pytest.raises(OptionsError, match="batch_size"):
        BenchOptions(batch_size=0)


def test_diagnose_names_a_bottleneck(gzip_pack: Path) -> None:
    diagnosis = diagnose(gzip_pack, BenchOptions(batch_size=16, workers=0, repeats=2, warmup=0))
    assert diagnosis.bottleneck in BOTTLENECKS
    assert [s.name for s in diagnosis.stages] == ["ceiling", "warm", "cold"]
    assert diagnosis.stages[0].images_per_s > 0
    assert diagnosis.stages[1].images_per_s > 0
    assert set(diagnosis.shares) == set(BOTTLENECKS)
    assert all(v >= 0 for v in diagnosis.shares.values())
    if diagnosis.cache_drop.dropped:
        assert diagnosis.stages[2].images_per_s > 0
    else:
        assert diagnosis.stages[2].note
    text = format_diagnosis(diagnosis)
    assert f"bottleneck: {diagnosis.bottleneck}" in text
    json.dumps(to_json(diagnosis))


def test_drop_page_cache_empties_the_cache(gzip_pack: Path) -> None:
    warm_page_cache(gzip_pack)
    before = resident_fraction(gzip_pack)
    drop = drop_page_cache(gzip_pack)
    if before is None:
        pytest.skip("mincore is not available here")
    assert before > 0.5
    if drop.dropped:
        assert resident_fraction(gzip_pack) == pytest.approx(0.0, abs=0.05)
    else:
        assert "kept" in drop.message


def test_machine_info_describes_the_machine(tmp_path: Path) -> None:
    machine = machine_info(tmp_path)
    assert machine.cores >= 1
    assert str(machine.cores) in machine.describe()


# -- CLI -------------------------------------------------------------------------------


def test_cli_bench(gzip_pack: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["bench", str(gzip_pack), "--workers", "0", "--batch-size", "16", "--repeats", "2", "-q"],
    )
    assert result.exit_code == 0, result.output
    assert "img/s" in result.output
    assert "order chunk" in result.output


def test_cli_bench_diagnose_json(gzip_pack: Path) -> None:
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
            "--diagnose",
            "--json",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["bottleneck"] in BOTTLENECKS


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
