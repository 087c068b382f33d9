"""The disk cache's directory as one process holds it: owner lock, ledger, failures, fork.

NOTE [ The ledger and fork ]: SQLite forbids carrying a connection across fork: its unix
VFS keeps per-process state of each open database (locks it believes held, the mapped WAL
index) that a child inherits without the kernel's locks, and a DataLoader may fork while a
read-ahead thread is inside a transaction (a child then hung). So before any fork every
open cache takes its lock (transactions under way finish) and closes its connection; after
it both processes release the locks, the parent reopens at its next use (same owner and
flock) and the child opens its own from a clean SQLite state.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import sqlite3
import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from h5pack.core.private import UnsafeDirectoryError, private_directory
from h5pack.read import ledger
from h5pack.read.ledger import CLAIMED, COST_SQL, transaction

# The default budget: this share of the free space of the cache's file system, measured
# when the directory is first created and recorded there, so every process agrees.
DEFAULT_CACHE_DISK_FRACTION = 0.5
_INHERITED: list[sqlite3.Connection] = []  # connections inherited across fork: never closed
_HINT = "give another with ReaderOptions(disk_cache_dir=...) or --disk-cache-dir"


class DiskCacheWarning(UserWarning):
    """The disk cache was damaged, removed or cannot be written; the run goes on."""


@dataclass
class DiskCacheStats:
    """What one process's cache did (counts, not times)."""

    hits: int = 0
    misses: int = 0
    waits: int = 0
    stored_bytes: int = 0
    evicted_bytes: int = 0
    bypassed: int = 0
    recovered: int = 0
    damaged: int = 0
    swept: int = 0


class CacheDirectory:
    """A cache directory opened lazily once per process; a failing disk turns it off.

    Args:
        directory: The directory.
        budget_bytes: Its budget; None: the one recorded in its ledger.
    """

    def __init__(self, directory: Path, budget_bytes: int | None) -> None:
        self.directory = directory
        self.stats = DiskCacheStats()
        self.disabled = ""  # why this process reads on without the cache ("": it does not)
        self._given_budget = budget_bytes
        self._pid = -1
        self._db: sqlite3.Connection | None = None
        self._owner = ""
        self._owner_fd = -1
        self._budget = 0
        self._lock = threading.RLock()  # one connection per process, shared by its threads
        self._inode = -1  # of the directory opened
        self._removed = -1  # of the one directory whose removal this process met, made again

    def _open(self) -> sqlite3.Connection:
        with self._lock:
            if self.disabled:  # a thread that was under way when the disk failed
                raise OSError(f"the disk cache is off in this process ({self.disabled})")
            if self._pid == os.getpid():
                if self._db is None and self._owner_fd >= 0:  # closed for a fork: reopen
                    self._db = self._connect_ledger()
                if self._db is not None:
                    return self._db
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        self._drop()  # a parent's connection and lock, inherited across fork, stay its own
        self.stats = DiskCacheStats()
        private_directory(self.directory, what="the disk cache", hint=_HINT)
        self._inode = os.stat(self.directory).st_ino
        for sub in ("owners", "chunks"):
            (self.directory / sub).mkdir(mode=0o700, exist_ok=True)
        self._owner = f"{os.getpid()}-{secrets.token_hex(4)}"
        lock = self.directory / "owners" / f"{self._owner}.lock"
        self._owner_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        db = self._connect_ledger()
        self._db, self._pid = db, os.getpid()
        _OPEN.add(self)
        self.recover()
        return db

    def _connect_ledger(self) -> sqlite3.Connection:
        db = ledger.connect(self.directory)
        try:
            with self._lock, transaction(db):
                budget = self._given_budget
                if budget is None:
                    budget = ledger.default_budget(db, self.directory, DEFAULT_CACHE_DISK_FRACTION)
                self._budget = budget
        except BaseException:
            db.close()
            raise
        return db

    @property
    def budget_bytes(self) -> int:
        """Return the budget this process enforces, in bytes."""
        self._open()
        return self._budget

    def close(self) -> None:
        """Remove this process's future, claims and lock (its ready chunks stay)."""
        if self._db is not None and self._pid == os.getpid():
            with self._lock, contextlib.suppress(sqlite3.Error, OSError), transaction(self._db):
                ledger.drop_owner(self._db, self.directory, self._owner, lock=True)
        self._drop()

    def _drop(self) -> None:
        """Close this process's connection and owner lock (its claims then look dead)."""
        if self._db is not None and self._pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        elif self._db is not None:  # inherited: closing could checkpoint or unlock the parent's
            _INHERITED.append(self._db)
        if self._owner_fd >= 0:  # a parent's copy too: its lock stays the parent's
            with contextlib.suppress(OSError):
                os.close(self._owner_fd)
        self._db, self._owner_fd, self._pid = None, -1, -1

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn a failure of the cache's disk into one warning (NOTE [ One disk cache ... ])."""
        try:
            yield
        except UnsafeDirectoryError:
            raise
        except (OSError, sqlite3.Error) as err:
            with self._lock:
                self._drop()
                if self.disabled:  # another thread's use met it first: warned once
                    return
                if self._inode >= 0 and self._inode == self._removed:
                    return  # another thread met the same removal: made again at the next use
                if self._inode >= 0 and not self._same_directory() and self._removed < 0:
                    self._removed = self._inode
                    warn(
                        f"the disk cache {self.directory} was removed or replaced while in "
                        f"use ({err}): it is made again and its chunks are fetched again"
                    )
                    return
                self.disabled = str(err)
                warn(
                    f"the disk cache {self.directory} cannot be used ({err}): reading on "
                    "without it, every chunk from the store"
                )

    def _same_directory(self) -> bool:
        try:
            return os.stat(self.directory).st_ino == self._inode
        except OSError:
            return False

    def _owner_alive(self, owner: str) -> bool:
        return owner == self._owner or ledger.owner_alive(self.directory, owner)

    def recover(self) -> None:
        """Remove what processes that are gone left: claims, futures, locks, files.

        With no other live process in the directory, also files without a row and rows
        without a file (listed once, not by every worker).
        """
        with self._lock, transaction(self._open()) as db:
            claimed = db.execute("SELECT DISTINCT owner FROM entries WHERE state = ?", (CLAIMED,))
            owners = {o for (o,) in claimed}
            owners |= {o for (o,) in db.execute("SELECT DISTINCT owner FROM futures")}
            owners |= {n.removesuffix(".lock") for n in os.listdir(self.directory / "owners")}
            alone = True
            for owner in owners - {self._owner}:
                if self._owner_alive(owner):
                    alone = False
                else:
                    self.stats.recovered += ledger.drop_owner(db, self.directory, owner, lock=True)
            if alone:
                self.stats.swept += ledger.sweep(db, self.directory, self._owner_alive)

    def usage_bytes(self, *, on_disk: bool = False) -> int:
        """Return the bytes of the ledger's chunks (claimed too); ``on_disk``: as ``du``."""
        with self._lock:
            summed = COST_SQL if on_disk else "nbytes"
            query = f"SELECT COALESCE(SUM({summed}), 0) FROM entries"
            (total,) = self._open().execute(query).fetchone()
        return int(total) + (ledger.overhead_bytes(self.directory) if on_disk else 0)


_OPEN: weakref.WeakSet[CacheDirectory] = weakref.WeakSet()
_HELD: list[CacheDirectory] = []


def _before_fork() -> None:
    for cache in list(_OPEN):
        cache._lock.acquire()
        _HELD.append(cache)
        if cache._db is not None and cache._pid == os.getpid():
            cache._db.close()
            cache._db = None


def _after_fork() -> None:
    while _HELD:
        _HELD.pop()._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def warn(message: str) -> None:
    """Warn with a ``DiskCacheWarning``, pointing at the caller's caller."""
    warnings.warn(message, DiskCacheWarning, stacklevel=3)
