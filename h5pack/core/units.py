"""Counts written for people, in one place (issue 16.3: three byte formatters, two pluralisers).

Two unit systems, each for its own use: ``human_bytes`` in powers of 1000 (rates and the
benchmark reports, as ``ls -h --si``), ``binary_bytes`` in powers of 1024 (file and chunk
sizes: what ``--chunk-bytes 4MiB`` and the file system say).
"""

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


def binary_bytes(count: float) -> str:
    """Return ``count`` bytes in binary units, e.g. ``"7.5 MiB"`` (file and chunk sizes).

    Example:
        >>> binary_bytes(7.5 * 2**20), binary_bytes(512)
        ('7.5 MiB', '512 B')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover - the loop returns at GiB


def plural(count: int, noun: str) -> str:
    """Return ``"1 file"``, ``"2 files"``: a count and its noun, in the right number.

    Example:
        >>> plural(1, "shard"), plural(3, "shard")
        ('1 shard', '3 shards')
    """
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
