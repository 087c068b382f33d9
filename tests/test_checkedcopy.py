"""The one-pass copy of mapped samples (h5pack.read.checkedcopy, NOTE [ Checked as copied ])."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import xxhash

from h5pack.read import checkedcopy

native: Any = checkedcopy._native()  # the compiled half itself, for its argument checks
built = pytest.mark.skipif(native is None, reason="h5pack.read._checkedcopy was not built")

# around the extension's 16 KiB blocks and XXH3's own size classes (16, 128, 240 bytes)
SIZES = [0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 16383, 16384, 16385, 32768, 196608, 300001]


@built
@pytest.mark.parametrize("size", SIZES)
def test_its_digest_is_xxhash_xxh3_64(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    assert checkedcopy.digest(data) == xxhash.xxh3_64_intdigest(data.tobytes())


def _samples(size: int, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A read-only source of ``count`` samples at odd offsets, their starts and digests."""
    rng = np.random.default_rng(seed)
    source = rng.integers(0, 256, count * size + 7 * count, dtype=np.uint8)
    source.flags.writeable = False  # as the pack's mapping is
    starts = (np.arange(count, dtype=np.int64) * (size + 7) + 3).astype(np.int64)
    recorded = np.array(
        [xxhash.xxh3_64_intdigest(source[a : a + size].tobytes()) for a in starts], np.uint64
    )
    return source, starts, recorded


@built
@pytest.mark.parametrize("size", [1, 241, 16384, 16385, 50001])
def test_each_sample_lands_in_its_row_checked(size):
    source, starts, recorded = _samples(size, 9)
    rows = np.random.default_rng(1).permutation(9).astype(np.int64)
    out = np.zeros((9, size), dtype=np.uint8)
    assert checkedcopy.copy(source, out, starts, rows, size, recorded) == -1
    for k in range(9):
        np.testing.assert_array_equal(out[rows[k]], source[starts[k] : starts[k] + size])
    again = np.zeros_like(out)
    assert checkedcopy.copy(source, again, starts, rows, size, None) == -1  # unchecked
    np.testing.assert_array_equal(again, out)


@built
@pytest.mark.parametrize("where", [0, 16383, 16384, 40000])  # within and across blocks
def test_the_first_damaged_sample_is_named(where):
    size = 50001
    source, starts, recorded = _samples(size, 6)
    damaged = source.copy()
    damaged[starts[4] + where] ^= 1
    damaged[starts[5]] ^= 1  # a later damaged sample is not the one reported
    out = np.zeros((6, size), dtype=np.uint8)
    rows = np.arange(6, dtype=np.int64)
    assert checkedcopy.copy(damaged, out, starts, rows, size, recorded) == 4
    wrong = recorded.copy()
    wrong[2] ^= np.uint64(1)  # a recorded digest that is not the bytes'
    assert checkedcopy.copy(source, out, starts, rows, size, wrong) == 2


@built
def test_a_sample_or_row_outside_its_buffer_is_refused_before_anything_is_copied():
    size = 100
    source, starts, recorded = _samples(size, 3)
    out = np.zeros((3, size), dtype=np.uint8)
    past = starts.copy()
    past[2] = source.size - size + 1
    with pytest.raises(ValueError, match=r"sample 2 .* outside its buffer"):
        native.copy(source, out.reshape(-1), past, np.arange(3, dtype=np.int64), size, recorded)
    with pytest.raises(ValueError, match=r"sample 1 .* outside its buffer"):
        native.copy(source, out.reshape(-1), starts, np.array([0, 3, 1], np.int64), size)
    assert not out.any()
    with pytest.raises(ValueError, match="differ in length"):
        native.copy(source, out.reshape(-1), starts, np.arange(2, dtype=np.int64), size)
    with pytest.raises(TypeError, match="64-bit integers"):
        native.copy(source, out.reshape(-1), starts.astype(np.int32), starts, size)
    with pytest.raises(ValueError, match="positive"):
        native.copy(source, out.reshape(-1), starts, np.arange(3, dtype=np.int64), 0)


def test_ci_builds_the_checked_copy_extension():
    """CI tests the one-pass copy, not only the Python loop: its install builds it."""
    if not os.environ.get("CI"):
        pytest.skip("outside CI the extension is optional (pyproject.toml: optional = true)")
    assert checkedcopy.available()


def test_without_the_extension_copy_says_so(monkeypatch):
    monkeypatch.setattr(checkedcopy, "_native", lambda: None)
    assert not checkedcopy.available()
    out = np.zeros(4, dtype=np.uint8)
    with pytest.raises(RuntimeError, match="was not built"):
        checkedcopy.copy(out, out, np.zeros(1, np.int64), np.zeros(1, np.int64), 4, None)
    with pytest.raises(RuntimeError, match="was not built"):
        checkedcopy.digest(out)
