"""What a killed conversion leaves behind, how its owner is told apart, and its removal.

A SIGKILL (or a crash) runs no cleanup, so a conversion can leave its hidden temporary
files beside the target (``publish.temp_path``: ``.<name>.<pid>.tmp`` and companions); the
next conversion into that directory removes them, and says so, when their owner is gone.

NOTE [ Telling a dead owner ]: a pid alone cannot tell (pids are reused; another pid
namespace's mean nothing here). So a conversion holds ``flock`` on ``.<name>.<pid>.lock``
beside its temporary files for as long as they exist (``OwnerLock``); the kernel drops it
when the process dies, so files whose lock can be taken are orphaned, and files whose lock
is held belong to a live conversion, here or (through NFS locks) elsewhere. The lock is a
file of its own, never the pack (HDF5 flocks what it opens). Files with no lock file (a
pack set manifest's, written in a moment) are orphaned when no process has their pid.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from pathlib import Path

from h5pack.core.machine import process_exists
from h5pack.errors import H5PackError

logger = logging.getLogger("h5pack")

# A conversion's hidden temporary files (publish.temp_path, with an optional tag and
# suffix) and their owner's lock file.
_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)(?:\.[^./]+)?\.tmp(?:\.[a-z]+)?")
_LOCK = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.lock")

_LOCK_WAIT_S = 2.0  # how long to wait for a lock file that a cleaner holds


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
    """The lock that marks a conversion's temporary files as its own (NOTE above).

    H5PackError when the lock file cannot be created, or another live conversion with the
    same pid writes the same target.
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
            self._lock(fd, deadline)
            try:
                same = os.path.samestat(os.stat(path), os.fstat(fd))
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
            else:
                os.close(fd)  # a cleaner removed a stale file of this name: make it again

    def _lock(self, fd: int, deadline: float) -> None:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise H5PackError(
                        f"{self.path} is locked: another conversion into the same target "
                        f"with pid {os.getpid()} (in another pid namespace) is running"
                    ) from None
                time.sleep(0.01)
            except OSError:  # no locks here: the files stay unless their pid is gone
                return

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


def remove_leftovers(directory: Path) -> list[Path]:
    """Remove the temporary files of dead conversions in ``directory`` and return them."""
    groups: dict[tuple[str, int], list[Path]] = {}
    try:
        names = [entry.name for entry in os.scandir(directory) if entry.name.startswith(".")]
    except OSError:
        return []
    for name in names:
        match = _TEMP.fullmatch(name) or _LOCK.fullmatch(name)
        if match is not None:
            groups.setdefault((match["name"], int(match["pid"])), []).append(directory / name)
    removed: list[Path] = []
    for (_, pid), paths in groups.items():
        locks = [path for path in paths if _LOCK.fullmatch(path.name)]
        temps = [path for path in paths if path not in locks]
        if not locks:
            removed.extend(_unlink_all(temps) if not process_exists(pid) else [])
            continue
        fd = _try_lock(locks[0])
        if fd is None:
            continue  # a live conversion's
        try:  # remove the lock file last, still holding it: no one takes it meanwhile
            removed.extend(_unlink_all([*temps, locks[0]]))
        finally:
            os.close(fd)
    return sorted(removed)


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


def describe_removed(paths: list[Path], *, shown: int = 5) -> str:
    """Return the note that tells a user what was removed."""
    names = [path.name for path in paths]
    listed = ", ".join(names[:shown])
    if len(names) > shown:
        listed += f" and {len(names) - shown} more"
    count = len(names)
    noun = "leftover" if count == 1 else "leftovers"
    return f"removed {count} {noun} of a conversion that was killed: {listed}"
