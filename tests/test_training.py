"""Training equivalence, tiny (scripts/bench_training.py): the chunk-aware order trains."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

from h5pack.core.format import load_meta
from h5pack.training.mixing import label_mixing
from h5pack.training.sampler import EpochSpec, sampler_for_labels

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_training.py"
SEEDS = 2


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_training", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_chunk_aware_order_trains_like_a_full_shuffle(tmp_path: Path) -> None:
    bench = load_script()
    photos = bench.SHARED_PHOTOS if bench.SHARED_PHOTOS.is_dir() else None
    packs, data = bench.build(
        tmp_path, photos=photos, num_train=640, num_test=400, size=16, chunk_samples=32
    )
    settings = bench.Settings(epochs=6, batch_size=16, lr=0.05, packs=packs, num_train=640)
    bench.check_loader(settings, data["mixed-labels"])
    arms = ["full", "default", "large", "unmixed", "mix-3to1-k2"]
    accuracy = bench.run(arms, settings, data, seeds=SEEDS, processes=1)

    def median_gap(arm: str) -> float:
        return statistics.median(accuracy[arm, s] - accuracy["full", s] for s in range(SEEDS))

    assert min(accuracy["full", s] for s in range(SEEDS)) > 40  # five classes: chance is 20
    # generous: two seeds of a tiny task differ by a few points from the order alone (the
    # default window is the whole of this pack: a full shuffle with other random draws)
    assert abs(median_gap("default")) <= 10
    assert abs(median_gap("large")) <= 10
    assert abs(median_gap("mix-3to1-k2")) <= 10  # a 3:1 mix of two packs (issue 18)
    # the class-ordered pack at a window of 2 chunks trains far worse (-22 here) ...
    assert median_gap("unmixed") < -10
    # ... and is caught, while the shuffled pack is not
    unmixed, mixed = load_meta(packs["unmixed"]), load_meta(packs["mixed"])
    assert label_mixing(unmixed, window_chunks=2).warns
    assert not label_mixing(mixed, window_chunks=2).warns
    assert not label_mixing(mixed, window_chunks=1).warns
    # with the window left to the defaults the sampler stratifies the chunk order and its
    # window (here the whole pack) mixes the labels
    sampler, report = sampler_for_labels(packs["unmixed"], EpochSpec(batch_size=16), unmixed)
    assert report is not None
    assert report.chunks_unmixed
    assert not report.window_unmixed
    assert report.warns  # the warning fires on the unmixed pack, saying what the loader did
    assert "stratified" in report.message
    assert sampler.spec.chunk_strata is not None
    assert sampler.window_chunks > 2
    # at a window of 2 chunks it warns, saying how wide a window would mix
    tight = EpochSpec(batch_size=16, window_chunks=2)
    _, warning = sampler_for_labels(packs["unmixed"], tight, unmixed)
    assert warning is not None
    assert warning.warns
    assert "--no-shuffle" in warning.message
