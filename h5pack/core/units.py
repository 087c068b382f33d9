"""Counts written for people: bytes in powers of 1000 (rates) or 1024 (sizes), plurals."""

from __future__ import annotations


def human_bytes(value: float) -> str:
    """Return e.g. ``"1.5 MB"`` (powers of 1000, like ``ls -h --si``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def binary_bytes(count: float) -> str:
    """Return ``count`` bytes in binary units, e.g. ``"7.5 MiB"`` (file and chunk sizes)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def plural(count: int, noun: str) -> str:
    """Return ``"1 file"``, ``"2 files"``: a count and its noun, in the right number."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
