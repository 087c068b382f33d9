"""What this machine offers the pipelines: the cores this process may run on."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Return the CPU cores this process may run on (its affinity mask on Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
