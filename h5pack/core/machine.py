"""What this machine offers the pipelines: the cores this process may run on."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Return the CPU cores this process may run on (its affinity mask on Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def process_exists(pid: int) -> bool:
    """Return whether a process ``pid`` exists (another user's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
