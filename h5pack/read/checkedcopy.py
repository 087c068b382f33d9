"""A mapped raw pack's batch copied and checked in one pass (``NOTE [ Checked as copied ]``).

The work is done by the compiled half, ``h5pack.read._checkedcopy`` (``_checkedcopy.c``),
where the install built it; without it :func:`available` is False and
``PackReader._copy_mapped`` copies and checks each sample from Python.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np


def _native() -> ModuleType | None:
    try:
        from h5pack.read import _checkedcopy
    except ImportError:  # built without a C compiler
        return None
    return _checkedcopy


def available() -> bool:
    """Whether the extension was built (the install had a C compiler)."""
    return _native() is not None


def copy(
    source: np.ndarray,
    out: np.ndarray,
    starts: np.ndarray,
    rows: np.ndarray,
    sample_bytes: int,
    recorded: np.ndarray | None,
) -> int:
    """Copy each sample ``source[starts[k]:][:sample_bytes]`` into row ``rows[k]`` of ``out``.

    ``out`` is C-contiguous, rows of ``sample_bytes`` bytes. With ``recorded`` (uint64, one
    per sample) each sample's XXH3-64 is checked as it is copied: returns the ``k`` of the
    first that differs (its row and later ones are then not all written), else -1. The GIL
    is released while it copies.

    Raises:
        RuntimeError: the extension was not built (see :func:`available`).
        ValueError: a sample or row lies outside its buffer.
    """
    native = _native()
    if native is None:
        raise RuntimeError("h5pack.read._checkedcopy was not built (no C compiler at install)")
    checked = None if recorded is None else np.ascontiguousarray(recorded, dtype=np.uint64)
    result: int = native.copy(
        source, out.reshape(-1), np.ascontiguousarray(starts, dtype=np.int64),
        np.ascontiguousarray(rows, dtype=np.int64), sample_bytes, checked,
    )  # fmt: skip
    return result


def digest(data: np.ndarray | bytes | memoryview) -> int:
    """Return the XXH3-64 of ``data``'s bytes as the extension computes it (seed 0).

    Raises:
        RuntimeError: the extension was not built (see :func:`available`).
    """
    native = _native()
    if native is None:
        raise RuntimeError("h5pack.read._checkedcopy was not built (no C compiler at install)")
    value: int = native.digest(data)
    return value
