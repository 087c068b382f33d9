"""What this machine offers the pipelines: cores, memory, and the container's limits."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


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


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text())
    return None


def _cgroup_memory() -> tuple[int | None, int | None]:
    """Return this process's cgroup memory ``(limit, current use)``, each None if unknown."""
    groups = [CGROUP_ROOT]
    with contextlib.suppress(OSError, IndexError):
        own = Path("/proc/self/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
        groups.insert(0, CGROUP_ROOT / own.lstrip("/"))
    for group in groups:  # cgroup v2: the process's own group, else the root
        try:
            limit = (group / "memory.max").read_text().strip()
        except OSError:
            continue
        return (int(limit) if limit.isdigit() else None), _read_int(group / "memory.current")
    v1 = CGROUP_ROOT / "memory"
    v1_limit = _read_int(v1 / "memory.limit_in_bytes")
    if v1_limit is None:
        return None, None
    # v1 says "no limit" with a number near 2**63
    return (v1_limit if v1_limit < 2**60 else None), _read_int(v1 / "memory.usage_in_bytes")


def memory_bytes() -> int | None:
    """Return the memory of this machine, or of its container when less; None if unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    limit, _ = _cgroup_memory()
    if limit is not None:
        total = min(total, limit)
    return int(total) if total > 0 else None


def available_memory_bytes() -> int | None:
    """Return the memory available now, capped by the container's room; None if unknown."""
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except ImportError:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limit, current = _cgroup_memory()
    if limit is not None and current is not None:
        available = min(available, limit - current)
    return max(0, available)
