"""Byte counts written for people: every benchmark report, and the loader's stall report."""

from __future__ import annotations


def human_bytes(value: float) -> str:
    """Return e.g. ``"1.5 MB"`` (powers of 1000, like ``ls -h --si``).

    Example:
        >>> human_bytes(1_500_000), human_bytes(999)
        ('1.5 MB', '999 B')
    """
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover  (the loop returns)
