"""What a killed conversion leaves behind, how its owner is told apart, and its removal.

A SIGKILL (or a crash, or a power cut) runs no cleanup, so a conversion can leave its
hidden temporary files beside the target (``publish.temp_path``: ``.<name>.<pid>.tmp`` and
its ``.blob`` / ``.rebuilt`` companions) and, where shared memory has a name, segments in
``/dev/shm``. The next conversion into that directory removes them, and says so, when it
can tell that their owner is gone.

NOTE [ Telling a dead owner ]: a pid alone cannot tell: pids are reused, and a process in
another pid namespace (a container writing to the same volume) has a pid that means nothing
here. So every conversion holds a lock for as long as it has temporary files: ``flock`` on
``.<name>.<pid>.lock`` beside them (``OwnerLock``). The kernel drops the lock when the
process dies however it dies, so a group of files whose lock can be taken is orphaned; one
whose lock is held belongs to a live conversion, on this machine or (through the network
file system's locks) another. The lock is a file of its own, never the pack: HDF5 locks
the files it opens with ``flock`` too, and on NFS both become the same kind of lock.
Temporary files with no lock file (written by an h5pack without locks, or another writer
of the same naming) fall back to the pid: orphaned when no process has that pid, or when
the process that has it started after the files were last written (the pid was reused).
Named shared-memory segments carry their owner's pid and start time in their name
(``h5p_<pid>_<start>_<random>``) and are locked the same way while in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from h5pack.core.machine import process_exists
from h5pack.core.private import owned_by_me
from h5pack.errors import H5PackError

__all__ = [
    "SEGMENT_DIR",
    "OwnerLock",
    "describe_removed",
    "lock_path",
    "process_start_ticks",
    "remove_leftover_segments",
    "remove_leftovers",
    "segment_name",
]

logger = logging.getLogger("h5pack")

# Hidden temporary files of a conversion (publish.temp_path, with an optional tag, and the
# builder's ``.blob`` staging and ``.rebuilt`` copies) and their owner's lock file.
_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)(?:\.[^./]+)?\.tmp(?:\.[a-z]+)?")
_LOCK = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.lock")

# Where Linux keeps named POSIX shared memory; segments of h5pack start with the prefix.
SEGMENT_DIR = Path("/dev/shm")
_SEGMENT_PREFIX = "h5p_"
_SEGMENT = re.compile(r"h5p_(?P<pid>[0-9]+)_(?P<ticks>[0-9]+)_[0-9a-f]+")

# A process that started less than this after a file was last written may still be the one
# that wrote it: start times come from the boot time, known to the second.
_CLOCK_SLACK_S = 2.0

# How long a conversion waits for a lock file that a cleaner holds (it only removes files).
_LOCK_WAIT_S = 2.0


# -- who owns what ----------------------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """Return when process ``pid`` started (clock ticks after boot), None if there is none.

    Without ``/proc`` (not Linux) a running process reports 0: known alive, start unknown.
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        return 0 if process_exists(pid) else None
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last one.
    fields = text.rsplit(")", 1)[-1].split()
    if fields[0] in ("Z", "X"):  # a zombie has no files left: it is gone
        return None
    return int(fields[19])  # field 22 of proc(5), counted from the state, field 3


def _started_after(pid: int, when_s: float) -> bool:
    """Whether the running process ``pid`` started after ``when_s`` (wall clock), surely."""
    ticks = process_start_ticks(pid)
    if not ticks:
        return False
    try:
        boot_s = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return False
    started_s = boot_s + ticks / os.sysconf("SC_CLK_TCK")
    return started_s > when_s + _CLOCK_SLACK_S


def _try_lock(path: Path) -> int | None:
    """Return a descriptor of ``path`` holding its lock, or None if it is held (or unknown)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (EWOULDBLOCK), or no locks on this file system: keep the files
        os.close(fd)
        return None
    return fd


def lock_path(target: Path) -> Path:
    """Return the lock file of this process's conversion into ``target``."""
    return target.parent / f".{target.name}.{os.getpid()}.lock"


class OwnerLock:
    """The lock that marks a conversion's temporary files as its own (see the NOTE above).

    Raises:
        H5PackError: the lock file cannot be created (a read-only or full directory), or
            another live conversion with the same pid writes the same target.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        deadline = time.monotonic() + _LOCK_WAIT_S
        while self._fd < 0:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise H5PackError(f"cannot write in {path.parent}: {err.strerror or err}") from err
            if self._locked(fd, deadline) and _same_file(fd, path):
                self._fd = fd
            else:
                os.close(fd)  # a cleaner removed a stale file of this name: make it again

    def _locked(self, fd: int, deadline: float) -> bool:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise H5PackError(
                        f"{self.path} is locked: another conversion into the same target "
                        f"with pid {os.getpid()} (in another pid namespace) is running"
                    ) from None
                time.sleep(0.01)
            except OSError:  # no locks here: the files stay unless their pid is gone
                return True
            else:
                return True

    def release(self) -> None:
        """Remove the lock file, then drop the lock (never raises; a failure is logged)."""
        if self._fd < 0:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            logger.warning("could not remove %s: %s", self.path, err.strerror or err)
        os.close(self._fd)
        self._fd = -1


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def segment_name() -> str:
    """Return a fresh name of a shared-memory segment that names this process."""
    ticks = process_start_ticks(os.getpid()) or 0
    return f"{_SEGMENT_PREFIX}{os.getpid()}_{ticks}_{secrets.token_hex(4)}"


def lock_segment(name: str) -> int | None:
    """Lock the named segment ``name`` for this process; return the descriptor, or None."""
    path = SEGMENT_DIR / name
    if not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


# -- removal ----------------------------------------------------------------------------


@dataclass
class _Group:
    """The files one conversion left in a directory."""

    pid: int
    temps: list[Path]
    lock: Path | None = None


def remove_leftovers(directory: Path) -> list[Path]:
    """Remove the temporary files of dead conversions in ``directory``; return them.

    Never raises: a file that cannot be removed is logged and left.
    """
    groups: dict[tuple[str, int], _Group] = {}
    try:
        names = [entry.name for entry in os.scandir(directory) if entry.name.startswith(".")]
    except OSError:
        return []
    for name in names:
        for pattern in (_TEMP, _LOCK):
            match = pattern.fullmatch(name)
            if match is None:
                continue
            pid = int(match["pid"])
            group = groups.setdefault((match["name"], pid), _Group(pid, []))
            if pattern is _LOCK:
                group.lock = directory / name
            else:
                group.temps.append(directory / name)
            break
    removed: list[Path] = []
    for group in groups.values():
        removed.extend(_remove_group(group))
    return sorted(removed)


def _remove_group(group: _Group) -> list[Path]:
    if group.lock is not None:
        fd = _try_lock(group.lock)
        if fd is None:
            return []  # a live conversion's
        try:  # remove the lock file last, still holding it: no one takes it meanwhile
            return _unlink_all([*group.temps, group.lock])
        finally:
            os.close(fd)
    if not group.temps or not _pid_orphaned(group.pid, group.temps):
        return []
    return _unlink_all(group.temps)


def _pid_orphaned(pid: int, paths: list[Path]) -> bool:
    """Files with no lock file: orphaned when their pid is gone or now names a newer process."""
    if process_start_ticks(pid) is None:
        return True
    try:
        written_s = max(path.stat().st_mtime for path in paths)
    except OSError:
        return False
    return _started_after(pid, written_s)


def _unlink_all(paths: list[Path]) -> list[Path]:
    removed = []
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as err:
            logger.warning("could not remove %s: %s", path, err.strerror or err)
            continue
        removed.append(path)
    return removed


def remove_leftover_segments() -> list[Path]:
    """Remove h5pack's shared-memory segments whose process is gone; return them.

    Never raises. Only named segments can be left (``arena``: the fallback where an
    anonymous memfd cannot be shared).
    """
    try:
        names = [name for name in os.listdir(SEGMENT_DIR) if name.startswith(_SEGMENT_PREFIX)]
    except OSError:
        return []
    removed: list[Path] = []
    for name in names:
        match = _SEGMENT.fullmatch(name)
        if match is None:
            continue
        pid, ticks = int(match["pid"]), int(match["ticks"])
        if process_start_ticks(pid) == ticks and ticks:
            continue  # its owner runs
        path = SEGMENT_DIR / name
        if not owned_by_me(path):  # another user's: never touched
            continue
        fd = _try_lock(path)
        if fd is None:
            continue  # locked: in use (by a process of another pid namespace)
        try:
            removed.extend(_unlink_all([path]))
        finally:
            os.close(fd)
    return removed


def describe_removed(paths: list[Path], *, shown: int = 5) -> str:
    """Return the note that tells a user what was removed."""
    names = [path.name if path.parent != SEGMENT_DIR else os.fspath(path) for path in paths]
    listed = ", ".join(names[:shown])
    if len(names) > shown:
        listed += f" and {len(names) - shown} more"
    count = len(names)
    noun = "leftover" if count == 1 else "leftovers"
    return f"removed {count} {noun} of a conversion that was killed: {listed}"
