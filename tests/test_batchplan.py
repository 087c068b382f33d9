"""Tests for h5pack.read.batchplan: a batch planned at once is plan_crop's, sample by sample."""

from __future__ import annotations

import numpy as np
import pytest

from h5pack.errors import OptionsError
from h5pack.read import batchplan
from h5pack.read.batchplan import plan_crops
from h5pack.read.boxes import CROPS, CropSpec, plan_crop


def one_by_one(spec, heights, widths, seed, epoch, indices):
    return [
        plan_crop(spec, int(h), int(w), seed=seed, epoch=epoch, index=int(i))
        for h, w, i in zip(heights, widths, indices, strict=True)
    ]


@pytest.mark.parametrize("crop", CROPS)
@pytest.mark.parametrize("flip", [True, False])
def test_a_batch_is_plan_crops_samples(crop, flip):
    rng = np.random.default_rng(7)
    spec = CropSpec.of((224, 160), crop=crop, flip=flip)
    for trial in range(12):
        heights = rng.integers(1, 700, 64)
        widths = rng.integers(1, 700, 64)
        if trial % 3 == 0:  # one size, as a raw pack
            heights[:], widths[:] = 256, 256
        if trial % 3 == 1:  # elongated: attempts fail, the central fallback
            heights, widths = rng.integers(1, 20, 64), rng.integers(200, 4000, 64)
        indices = rng.integers(0, 10**7, 64)
        seed, epoch = int(rng.integers(0, 2**63)), int(rng.integers(0, 1000))
        got = plan_crops(spec, heights, widths, seed=seed, epoch=epoch, indices=indices)
        assert got == one_by_one(spec, heights, widths, seed, epoch, indices)
        assert all(type(flip) is bool for _, flip in got)


def test_other_scales_and_ratios_and_big_seeds_and_indices():
    spec = CropSpec.of(32, crop="random-resized", scale=(0.5, 0.9), ratio=(0.2, 5.0), flip=True)
    heights, widths = [40, 300, 1, 5000], [40, 1, 300, 7]
    for seed in (0, -1, 2**64 + 3):
        indices = [0, 1, 2**32 + 5, 2**40]  # past 2**32: pcg64_states' general path
        got = plan_crops(spec, heights, widths, seed=seed, epoch=3, indices=indices)
        assert got == one_by_one(spec, heights, widths, seed, 3, indices)


def test_a_draw_numpy_would_repeat_goes_to_plan_crop(monkeypatch):
    """Lemire's rejection (~1 in 2**32 draws here) leaves the sample to plan_crop."""

    def always_again(u32, span):
        m = u32 * (span + np.uint64(1))
        return m >> np.uint64(32), np.ones(u32.shape, dtype=bool)

    asked = []
    real = batchplan.plan_crop

    def counting(*args, **kwargs):
        asked.append(kwargs["index"])
        return real(*args, **kwargs)

    monkeypatch.setattr(batchplan, "_bounded", always_again)
    monkeypatch.setattr(batchplan, "plan_crop", counting)
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    got = plan_crops(spec, [256] * 8, [256] * 8, seed=1, epoch=0, indices=range(8))
    assert got == one_by_one(spec, [256] * 8, [256] * 8, 1, 0, range(8))
    assert asked  # at least one sample drew a position, and was handed over


def test_empty_and_refused():
    spec = CropSpec.of(8, crop="random-resized", flip=True)
    assert plan_crops(spec, [], [], seed=0, epoch=0, indices=[]) == []
    with pytest.raises(OptionsError, match="at least 1x1"):
        plan_crops(spec, [0], [4], seed=0, epoch=0, indices=[0])
    with pytest.raises(OptionsError, match="non-negative"):
        plan_crops(spec, [4], [4], seed=0, epoch=-1, indices=[0])
    with pytest.raises(OptionsError, match="non-negative"):
        plan_crops(spec, [4], [4], seed=0, epoch=0, indices=[-2])
    with pytest.raises(OptionsError, match="one entry per sample"):
        plan_crops(spec, [4, 4], [4], seed=0, epoch=0, indices=[0])
    fixed = CropSpec.of(8, crop="center")
    with pytest.raises(OptionsError, match="non-negative"):
        plan_crops(fixed, [4], [4], seed=0, epoch=0, indices=[-1])


def test_the_compiled_outputs_are_numpys_generators(monkeypatch):
    """h5pack.read._batchplan computes each sample's first PCG64 outputs: those of numpy's
    generator sample_rng(seed, epoch, index) exactly, at every kind of seed and index; and
    plan_crops gives the same boxes with or without it."""
    native = pytest.importorskip("h5pack.read._batchplan")
    from h5pack.read.boxes import entropy_words, pcg64_states, sample_rng

    rng = np.random.default_rng(3)
    for trial in range(40):
        seed = [0, 1, -1, 2**64 + 3, int(rng.integers(0, 2**63))][trial % 5]
        epoch = int(rng.integers(0, 10**6)) if trial % 2 else trial
        indices = rng.integers(0, 2**32, 32).astype(np.int64)
        indices[:2] = 0, 2**32 - 1
        before, after = (np.array(w, dtype=np.uint32) for w in entropy_words(seed, epoch))
        got = np.empty((32, 10), dtype=np.uint64)
        native.raw_outputs(before, indices, after, got)
        want = batchplan._raw_outputs(pcg64_states(seed, epoch, indices.tolist()))
        np.testing.assert_array_equal(got, want)
        generator = sample_rng(seed, epoch, int(indices[5]))
        np.testing.assert_array_equal(got[5], generator.bit_generator.random_raw(10))
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    heights, widths = rng.integers(1, 700, 64), rng.integers(1, 700, 64)
    indices = rng.integers(0, 10**7, 64)
    with_it = plan_crops(spec, heights, widths, seed=9, epoch=2, indices=indices)
    monkeypatch.setattr(batchplan, "_native", lambda: None)
    assert plan_crops(spec, heights, widths, seed=9, epoch=2, indices=indices) == with_it
    with pytest.raises(ValueError, match="indices"):
        native.raw_outputs(
            before, np.array([-1], dtype=np.int64), after, np.empty((1, 10), np.uint64)
        )


def test_ci_builds_the_batch_streams_extension():
    """CI tests the compiled streams, not only numpy's: its install builds the extension."""
    import os

    if not os.environ.get("CI"):
        pytest.skip("outside CI the extension is optional (pyproject.toml: optional = true)")
    assert batchplan._native() is not None
