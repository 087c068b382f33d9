"""loader.stats(): the share of each step spent waiting, the stages, the stall report's words.

Every duration comes from an injected clock (tests.helpers.FakeClock) or is only counted: no
test compares measured times.
"""

import dataclasses
import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5pack import make_loader
from h5pack.synthetic import synthesize_photo
from h5pack.training.advice import BOTTLENECKS, advise, dataset_facts, share_labels
from h5pack.training.prefetch import DevicePrefetcher
from h5pack.training.stats import (
    COMPUTE_BOUND_WAIT,
    STAGE_BOTTLENECK,
    STAGES,
    StageNs,
    StageTimes,
    StallMonitor,
)
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import FakeClock

NUM = 24


@pytest.fixture(scope="module")
def encoded(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    files = []
    for _ in range(NUM):
        buffer = io.BytesIO()
        Image.fromarray(synthesize_photo(rng, (60, 80))).save(buffer, "JPEG", quality=90)
        files.append(buffer.getvalue())
    path = tmp_path_factory.mktemp("stats") / "encoded.h5"
    write_arrays(path, files, [0] * NUM, options=ConvertOptions(mode="encoded"))
    return path


def slow_fetches(loader, clock: FakeClock, seconds: float) -> None:
    """Make every batch fetch of an in-process loader take ``seconds`` of ``clock``."""
    dataset = loader.dataset
    fetch = dataset.__getitems__

    def fetching(indices):
        clock.advance(seconds)
        return fetch(indices)

    dataset.__getitems__ = fetching  # the DataLoader's fetcher calls it on the instance


def timed_loader(encoded: Path, fetch_s: float):
    """An in-process loader whose stall monitor reads a fake clock; each fetch takes fetch_s."""
    loader = make_loader(encoded, 4, size=32, num_workers=0)
    clock = FakeClock()
    loader.stall.clock = clock
    slow_fetches(loader, clock, fetch_s)
    return loader, clock


def test_a_compute_bound_step_waits_about_nothing(encoded):
    loader, clock = timed_loader(encoded, 0.01)
    for _ in loader:
        clock.advance(1.0)  # the training step
    stats = loader.stats()
    assert stats.steps == NUM // 4
    assert stats.images == NUM
    assert stats.wait_share == pytest.approx(0.01 / 1.01)
    assert stats.wait_share < COMPUTE_BOUND_WAIT
    assert stats.bottleneck == "compute"
    assert "compute-bound" in stats.line()
    assert stats.images_per_s == pytest.approx(NUM / (NUM / 4 * 1.01))


def test_a_loader_bound_step_waits_most_of_it(encoded):
    loader, clock = timed_loader(encoded, 1.0)
    for _ in loader:
        clock.advance(0.1)
    stats = loader.stats()
    assert stats.wait_share == pytest.approx(1 / 1.1)
    assert stats.bottleneck in BOTTLENECKS
    assert stats.dominant in STAGES
    assert stats.bottleneck == STAGE_BOTTLENECK[stats.dominant] or (
        STAGE_BOTTLENECK[stats.dominant] == "storage" and stats.bottleneck == "decode"
    )
    assert f"bottleneck: {stats.bottleneck}" in stats.line()
    assert stats.advice  # said in words, with the remedy


def test_the_report_is_one_short_line_and_the_full_one_on_request(encoded):
    loader, clock = timed_loader(encoded, 1.0)
    for _ in loader:
        clock.advance(0.1)
    stats = loader.stats()
    short = str(stats)
    assert short == stats.line()
    assert len(short) <= 120, short
    assert "\n" not in short
    assert short.startswith(f"waited {stats.wait_share:.0%} for batches")
    assert f"bottleneck: {stats.bottleneck}; fix: {stats.fix}" in short
    full = stats.line(full=True)
    assert len(full) > len(short)
    assert stats.advice in full
    assert f"{stats.steps} steps" in full
    short_lines: list[str] = []
    loader.report_every(1, short_lines.append)
    for _ in loader:
        clock.advance(0.1)
    full_lines: list[str] = []
    loader.report_every(1, full_lines.append, full=True)
    for _ in loader:
        clock.advance(0.1)
    assert all(len(line) <= 120 and "; fix: " in line for line in short_lines)
    # the advice names the stage that dominated each report's own span, which may differ
    assert full_lines
    assert short_lines
    assert all(" steps, waited " in line and " — bottleneck: " in line for line in full_lines)


@pytest.mark.parametrize("workers", [0, 2])
def test_stage_times_travel_with_the_batches(encoded, workers):
    loader = make_loader(encoded, 5, size=32, num_workers=workers)
    batches = [images for images, _ in loader]
    assert [len(b) for b in batches] == [5, 5, 5, 5, 4]  # the batches as before: no extra item
    stats = loader.stats()
    assert (stats.steps, stats.images) == (5, NUM)
    assert stats.stage_s["decode"] > 0  # counted in the workers, received in this process
    assert stats.stage_s["crop"] > 0
    assert stats.stage_s["transfer"] == 0
    loader.reset_stats()
    assert loader.stats().steps == 0


def test_the_report_is_logged_every_n_steps(encoded):
    loader = make_loader(encoded, 2, size=32, num_workers=0)
    lines: list[str] = []
    loader.report_every(4, lines.append)
    for _ in loader:
        pass
    assert len(lines) == NUM // 2 // 4
    assert all(line.startswith("waited") and len(line) <= 120 for line in lines)
    with pytest.raises(ValueError, match="steps should be"):
        loader.report_every(-1)


def test_the_prefetcher_times_the_device_wait_and_the_transfer(encoded):
    loader = make_loader(encoded, 4, size=32, num_workers=0)
    prefetcher = DevicePrefetcher(loader, "cpu", echo=2)
    clock = FakeClock()
    prefetcher.stall.clock = clock
    slow_fetches(loader, clock, 0.5)
    for _ in prefetcher:
        clock.advance(1.0)  # each echo of the batch is a step
    stats = prefetcher.stats()
    assert stats.steps == NUM // 4
    assert stats.wait_share == pytest.approx(0.5 / 2.5)
    assert stats.stage_s["decode"] > 0  # the loader's stages come along
    assert stats.stage_s["transfer"] >= 0
    plain = DevicePrefetcher([(np.zeros(2), np.ones(2))], "cpu")
    assert len(list(plain)) == 1
    assert plain.stats().steps == 1  # any iterable: waits counted, no stages
    assert plain.stats().dominant == ""
    assert "not timed" in plain.stats().line()


def test_stats_names_the_dominant_stage_and_its_bottleneck():
    for stage in STAGES:
        ns = np.zeros(len(STAGES), dtype=np.int64)
        ns[STAGES.index(stage)] = 3_000_000_000
        ns[(STAGES.index(stage) + 1) % len(STAGES)] = 1_000_000_000
        stats = StallMonitor(
            steps=10, images=640, wait_s=8.0, step_s=2.0, stage_ns=ns, parallel=2, facts=None
        ).stats()
        assert stats.dominant == stage
        assert stats.bottleneck == STAGE_BOTTLENECK[stage]
        assert stats.wait_share == pytest.approx(0.8)
        assert stats.loader_images_per_s == pytest.approx(640 * 2 / 4.0)


def test_stage_times_add_and_take_with_an_injected_clock():
    ticks = iter(range(0, 1000, 10))
    times = StageTimes(clock=lambda: next(ticks))
    start = times.clock()
    times.add("decode", times.clock() - start)
    times.add("storage", -5)  # never negative
    taken = times.take()
    assert taken[STAGES.index("decode")] == 10
    assert taken.sum() == 10
    assert times.take().sum() == 0
    again = pickle.loads(pickle.dumps(StageNs(taken)))
    np.testing.assert_array_equal(again.ns, taken)


def test_the_words_and_remedies_are_the_advices_for_the_pack(encoded):
    # one vocabulary (training.advice): the report names a bottleneck in its words
    loader = make_loader(encoded, 4, size=32, num_workers=0)
    live = dataset_facts(loader.dataset, workers=0)
    for bottleneck in BOTTLENECKS:
        stage = next(s for s in STAGES if STAGE_BOTTLENECK[s] == bottleneck)
        ns = np.zeros(len(STAGES), dtype=np.int64)
        ns[STAGES.index(stage)] = 10**9
        facts = dataclasses.replace(live, available_bytes=1)  # larger than memory: storage
        stats = StallMonitor(
            steps=1, images=4, wait_s=1.0, step_s=0.0, stage_ns=ns, parallel=1, facts=facts
        ).stats()
        assert stats.bottleneck == bottleneck
        assert stats.advice == f"{share_labels(facts)[bottleneck]}: {advise(bottleneck, facts)}"
    cached = StallMonitor(
        steps=1,
        images=4,
        wait_s=1.0,
        step_s=0.0,
        stage_ns=np.array([10**9, 0, 0, 0, 0, 0]),
        parallel=1,
        facts=dataclasses.replace(live, available_bytes=10**12),
    ).stats()
    assert cached.bottleneck == "decode"  # a pack the page cache holds is not "storage"


def test_a_monitor_counts_plain_batches_and_pairs():
    clock = FakeClock()
    monitor = StallMonitor(clock=clock)
    ns = np.arange(len(STAGES), dtype=np.int64)
    batches = [((np.zeros(3), np.zeros(3)), StageNs(ns)), (np.zeros(2), np.zeros(2))]
    seen = list(monitor.timed(batches))
    assert len(seen) == 2
    assert len(seen[0][0]) == 3
    assert monitor.steps == 2
    assert monitor.images == 5
    np.testing.assert_array_equal(monitor.stage_ns, ns)


def test_the_report_does_not_ask_for_the_decoded_cache_it_already_reads_through(encoded):
    # with cache="decoded" on, a decode-bound
    # loader is told what else helps, never to turn on the cache it has
    loader = make_loader(encoded, 4, size=32, num_workers=0, cache="decoded")
    live = dataset_facts(loader.dataset, workers=0)
    assert live.cached
    assert not dataset_facts(
        make_loader(encoded, 4, size=32, num_workers=0).dataset, workers=0
    ).cached
    assert "cache='decoded'" not in advise("decode", live)
    assert "decoded cache on" in advise("decode", live)
    assert "cache='decoded'" in advise("decode", dataclasses.replace(live, cached=False))
