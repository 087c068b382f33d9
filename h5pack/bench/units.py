"""Byte counts written for people, in every benchmark report (``core.units`` has the code)."""

from __future__ import annotations

from h5pack.core.units import human_bytes

__all__ = ["human_bytes"]
