"""The boxes and flips of a whole batch at once: :func:`plan_crop`'s, without its per-sample calls.

:func:`plan_crops` returns exactly ``[plan_crop(spec, h, w, seed=, epoch=, index=i) ...]``
(same streams, same boxes, same flips: ``NOTE [ Planning a batch at once ]``) in one
vectorised pass, for the pipeline's per-batch loop (``training.fixed_size``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Final

import numpy as np

from h5pack.errors import OptionsError
from h5pack.read.boxes import (
    FLIP_PROBABILITY,
    Box,
    CropSpec,
    center_box,
    entropy_words,
    pcg64_states,
    plan_crop,
)

__all__ = ["plan_crops"]

# NOTE [ Planning a batch at once ]
#
# plan_crop draws from sample_rng(seed, epoch, index), a PCG64 stream per sample: up to 10
# attempts of two `uniform`s (one 64-bit output each: lower + range * (x >> 11) * 2**-53),
# then, for the first box that fits, two `integers` (numpy's bounded Lemire on 32 bits: the
# low then the high half of one 64-bit output, none when the range is a single value), then
# `random()` for the flip (a fresh 64-bit output). plan_crops takes each sample's first
# 2 * 4 + 2 raw outputs at once (its PCG64 state from boxes.pcg64_states, set on one
# generator per thread, `random_raw`: ~2 us a sample where plan_crop costs ~15) and replays
# those draws on the whole batch with numpy: the same IEEE operations in the same order
# (np.sqrt and np.rint are correctly rounded, like math.sqrt and round; the exponential is
# math.exp's, per value, because numpy's own may differ in the last bit). What the replay
# does not cover goes to plan_crop itself, so the result is always plan_crop's: a sample
# whose first 4 attempts fail (it may need 10, or the central fallback), a Lemire draw that
# would be rejected (probability ~ range / 2**32), an index past 2**32 (pcg64_states' slow
# path is still exact, only slower). tests/test_batchplan.py compares the two on many sizes
# and seeds.
#
# The raw outputs themselves come from the extension h5pack.read._batchplan where it was
# built: SeedSequence's hashing and PCG64's steps in C for the whole batch, 0.06 us a sample
# against ~6 for pcg64_states + random_raw (a Python int and a generator state per sample);
# 0.95x the raw 256 crop path's CPU per image (measured in-process, interleaved rounds).
# The tests check its outputs against numpy's generators; without it, the same numbers
# come from numpy as before.

# Attempts replayed: a sample whose first _REPLAYED boxes all fail to fit (0.03% of square
# 256 images, 0.5% of 500x375 ones) goes to plan_crop, which tries the rest.
_REPLAYED: Final[int] = 4
_RAWS: Final[int] = 2 * _REPLAYED + 2  # the attempts, one output for both integers, the flip
_TO_DOUBLE: Final[float] = 1.0 / 9007199254740992.0  # 2**-53, numpy's next_double
_M32: Final = np.uint64(0xFFFFFFFF)
_THREAD = threading.local()
_M32_INT: Final[int] = 0xFFFFFFFF


def _raw_outputs(states: Sequence[tuple[int, int]]) -> np.ndarray:
    """The first ``_RAWS`` 64-bit outputs of PCG64 from each ``(state, inc)``: (B, _RAWS)."""
    gen = getattr(_THREAD, "gen", None)
    if gen is None:
        gen = _THREAD.gen = np.random.PCG64(0)
    out = np.empty((len(states), _RAWS), dtype=np.uint64)
    for j, (state, inc) in enumerate(states):
        gen.state = {
            "bit_generator": "PCG64",
            "state": {"state": state, "inc": inc},
            "has_uint32": 0,
            "uinteger": 0,
        }
        out[j] = gen.random_raw(_RAWS)
    return out


def _first_outputs(seed: int, epoch: int, idx: np.ndarray) -> np.ndarray:
    """Each sample's first ``_RAWS`` PCG64 outputs: ``_raw_outputs(pcg64_states(...))``.

    Computed by the extension ``h5pack.read._batchplan`` where it was built (0.06 us a
    sample against ~6: no Python object per sample), else by those two.

    Raises:
        OptionsError: ``epoch`` or an index is negative.
    """
    native = _native()
    if native is None or epoch < 0 or int(idx.min()) < 0 or int(idx.max()) > _M32_INT:
        return _raw_outputs(pcg64_states(seed, epoch, idx.tolist()))  # and its errors
    before, after = (np.array(words, dtype=np.uint32) for words in entropy_words(seed, epoch))
    out = np.empty((idx.size, _RAWS), dtype=np.uint64)
    native.raw_outputs(before, np.ascontiguousarray(idx, dtype=np.int64), after, out)
    return out


def _native() -> ModuleType | None:
    try:
        from h5pack.read import _batchplan
    except ImportError:  # built without a C compiler
        return None
    return _batchplan


def _bounded(u32: np.ndarray, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replay numpy's Lemire draw in ``[0, span]`` from ``u32``; and where it would draw again."""
    m = u32 * (span + np.uint64(1))
    return m >> np.uint64(32), (m & _M32) < span + np.uint64(1)


def plan_crops(
    spec: CropSpec,
    heights: Sequence[int] | np.ndarray,
    widths: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    indices: Sequence[int] | np.ndarray,
) -> list[tuple[Box, bool]]:
    """Return ``plan_crop``'s box and flip for every sample of a batch, computed at once.

    Args:
        spec: What to do.
        heights: Each image's displayed height.
        widths: Each image's displayed width.
        seed: The run's seed.
        epoch: The epoch.
        indices: Each sample's index.

    Returns:
        ``[(box, flip), ...]``, exactly ``plan_crop``'s (``NOTE [ Planning a batch at once ]``).

    Raises:
        OptionsError: An image size, ``epoch`` or an index is invalid.
    """
    h = np.asarray(heights, dtype=np.int64).reshape(-1)
    w = np.asarray(widths, dtype=np.int64).reshape(-1)
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if not (h.size == w.size == idx.size):
        raise OptionsError(
            "heights, widths and indices should have one entry per sample, but got "
            f"{h.size}, {w.size} and {idx.size}"
        )
    if idx.size == 0:
        return []
    if int(h.min()) < 1 or int(w.min()) < 1:
        raise OptionsError(
            f"the images should be at least 1x1, but got heights {h.min()}.., widths {w.min()}.."
        )
    random_box = spec.crop == "random-resized"
    if not (random_box or spec.flip):  # nothing random: no generator at all
        pcg64_states(seed, epoch, [])  # the same checks of epoch as with one
        if int(idx.min()) < 0:
            raise OptionsError(f"epoch and index should be non-negative, but got index={idx.min()}")
        return [
            (_fixed_box(spec, hh, ww), False) for hh, ww in zip(h.tolist(), w.tolist(), strict=True)
        ]
    raws = _first_outputs(seed, epoch, idx)
    doubles = (raws >> np.uint64(11)).astype(np.float64) * _TO_DOUBLE
    rows = np.arange(idx.size)
    if not random_box:
        flips = (doubles[:, 0] < FLIP_PROBABILITY) if spec.flip else np.zeros(idx.size, bool)
        return [
            (_fixed_box(spec, hh, ww), f)
            for hh, ww, f in zip(h.tolist(), w.tolist(), flips.tolist(), strict=True)
        ]
    boxes, flips, exact = _random_boxes(spec, h, w, raws, doubles, rows)
    found: list[tuple[Box, bool]] = []
    for j, (box, flip, ok) in enumerate(zip(boxes, flips.tolist(), exact.tolist(), strict=True)):
        if ok:
            found.append((Box(*box), spec.flip and flip))
        else:  # outside the replay: plan_crop itself (see the note)
            found.append(
                plan_crop(spec, int(h[j]), int(w[j]), seed=seed, epoch=epoch, index=int(idx[j]))
            )
    return found


def _fixed_box(spec: CropSpec, height: int, width: int) -> Box:
    if spec.crop == "center":
        return center_box(height, width, *spec.size)
    return Box(0, 0, height, width)


def _random_boxes(
    spec: CropSpec,
    h: np.ndarray,
    w: np.ndarray,
    raws: np.ndarray,
    doubles: np.ndarray,
    rows: np.ndarray,
) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """Replay ``random_resized_box`` and the flip on the batch: boxes, flips, which are exact."""
    scale_low, scale_high = spec.scale
    log_low, log_high = math.log(spec.ratio[0]), math.log(spec.ratio[1])
    area = (h * w).astype(np.float64)[:, None]
    target = area * (scale_low + (scale_high - scale_low) * doubles[:, 0 : 2 * _REPLAYED : 2])
    logs = log_low + (log_high - log_low) * doubles[:, 1 : 2 * _REPLAYED : 2]
    aspect = np.array([math.exp(v) for v in logs.ravel().tolist()]).reshape(logs.shape)
    box_w = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    box_h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (box_w > 0) & (box_w <= w[:, None]) & (box_h > 0) & (box_h <= h[:, None])
    attempt = np.argmax(fits, axis=1)
    exact = fits[rows, attempt]  # none of these fits: left to plan_crop (more, or the centre)
    bw, bh = box_w[rows, attempt], box_h[rows, attempt]
    at = 2 * attempt + 2  # the output both integers draw their 32 bits from
    word = raws[rows, at]
    low, high = word & _M32, word >> np.uint64(32)
    span_top = (h - bh).astype(np.uint64)
    span_left = (w - bw).astype(np.uint64)
    draws_top = span_top > 0  # integers(0, 1) draws nothing
    top, again_top = _bounded(low, span_top)
    left, again_left = _bounded(np.where(draws_top, high, low), span_left)
    top = np.where(draws_top, top, 0)
    draws_left = span_left > 0
    left = np.where(draws_left, left, 0)
    exact &= ~(draws_top & again_top) & ~(draws_left & again_left)
    flip_at = at + (draws_top | draws_left)
    flips = doubles[rows, np.minimum(flip_at, _RAWS - 1)] < FLIP_PROBABILITY
    boxes = np.stack([top.astype(np.int64), left.astype(np.int64), bh, bw], axis=1)
    return boxes.tolist(), flips, exact
