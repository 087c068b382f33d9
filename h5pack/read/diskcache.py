"""A user's disk cache of remote chunks, shared by their processes, under a byte budget.

NOTE [ One disk cache per machine ]

Every process of a user that reads the same remote pack opens the same private directory
(NOTE [ Private directories ]); a chunk is downloaded once and read from disk by all
(docs/decisions/0018-belady-disk-cache.md, 0110-a-cache-that-heals.md).

- ``ledger.sqlite`` (WAL, ``read/ledger.py``) holds one row per chunk, *claimed*
  (downloading, its bytes reserved) or *ready*; the rows' blocks plus the ledger and the
  rest of the directory never exceed the budget: a process reserves and evicts
  (``read/eviction.py``) in one transaction, or does not cache the chunk.
- A second process that wants a claimed chunk waits for it. A read-ahead whose reader
  checks each chunk (``verify_checksums``) claims none: it ``put``s a chunk once checked.
- Files are written to ``.<chunk>.<owner>.tmp`` and renamed before the row turns ready;
  a file shorter than its row is dropped, never served.
- Each process holds an ``flock`` on ``owners/<owner>.lock``; a claim whose lock can be
  taken is a dead process's, removed and claimed anew.
- A pack's chunks live under a key of its identity (pack id, size, ETag).
- A row records the digest of its file (checked bytes: NOTE [ Checked downloads ]); a hit
  whose file no longer matches is evicted with a warning naming it, and fetched again.
- Opening sweeps what exited processes left (claims, temporaries, locks, futures, files
  without a row). A cache that cannot be written (full, read-only) warns once and is read
  around; a directory removed under a running process is made again once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.core.private import UnsafeDirectoryError, private_directory, user_cache_dir
from h5pack.errors import OptionsError
from h5pack.read import ledger
from h5pack.read.eviction import (
    Candidate,
    EvictionPolicy,
    Future,
    choose_victims,
    next_uses,
    parse_policy,
)
from h5pack.read.ledger import CLAIMED, READY, transaction

__all__ = [
    "DEFAULT_CACHE_DISK_FRACTION",
    "Claim",
    "DiskCache",
    "DiskCacheOptions",
    "DiskCacheStats",
    "DiskCacheWarning",
    "default_cache_dir",
    "pack_key",
]

# The default budget: this share of the free space of the cache's file system, measured
# when the cache directory is first created and recorded there, so every process agrees.
DEFAULT_CACHE_DISK_FRACTION = 0.5
_POLL_S = 0.005
_INHERITED: list[sqlite3.Connection] = []  # see DiskCache._connect
_HINT = "give another with ReaderOptions(disk_cache_dir=...) or --disk-cache-dir"
_COST = f"((nbytes + {ledger.BLOCK - 1}) / {ledger.BLOCK}) * {ledger.BLOCK}"  # ledger.cost
_SAME_USE = 1e-9  # epochs: two futures' uses this close are one use
_OWNER_CHECK_S = 0.25


class DiskCacheWarning(UserWarning):
    """The disk cache was damaged, removed or cannot be written; the run goes on."""


def default_cache_dir() -> Path:
    """Return the default cache directory: ``h5pack`` in the user's cache directory."""
    return user_cache_dir()


def pack_key(pack_id: str | None, size: int, etag: str | None) -> str:
    """Return the cache key of a pack: a digest of its id, its size and its object's ETag."""
    text = f"{pack_id or ''}\0{size}\0{etag or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True)
class DiskCacheOptions:
    """Where remote chunks are kept on this machine and how much disk they may take.

    Attributes:
        directory: The directory (shared by every process of the machine that reads the
            same packs); None: ``default_cache_dir()``.
        budget_bytes: The budget of the whole directory in bytes; None:
            ``DEFAULT_CACHE_DISK_FRACTION`` of the free space of its file system when the
            directory was created (recorded there).
        eviction: ``belady`` (the chunk needed farthest in the future goes; the default)
            or ``lru`` (the least recently used; for comparison).

    Raises:
        OptionsError: a negative budget or an unknown policy.
    """

    directory: StrPath | None = None
    budget_bytes: int | None = None
    eviction: EvictionPolicy = "belady"

    def __post_init__(self) -> None:
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise OptionsError(
                f"disk_cache_bytes should be >= 0, but got disk_cache_bytes={self.budget_bytes}"
            )
        parse_policy(self.eviction)

    @property
    def path(self) -> Path:
        """Return the cache directory."""
        return Path(self.directory) if self.directory is not None else default_cache_dir()


@dataclass
class DiskCacheStats:
    """What one process's cache did (counts, not times).

    Attributes:
        hits: Chunks served from the disk cache.
        misses: Chunks this process claimed or did not cache (it downloaded them).
        waits: Chunks another process was downloading, waited for.
        stored_bytes: Bytes this process wrote into the cache.
        evicted_bytes: Bytes this process evicted.
        bypassed: Chunks not cached (nothing that may go was needed later than them).
        recovered: Claims of dead processes removed.
        damaged: Cached files that no longer matched their digest (evicted, fetched again).
        swept: Leftover files of exited processes removed at open.
    """

    hits: int = 0
    misses: int = 0
    waits: int = 0
    stored_bytes: int = 0
    evicted_bytes: int = 0
    bypassed: int = 0
    recovered: int = 0
    damaged: int = 0
    swept: int = 0


@dataclass(frozen=True)
class Claim:
    """What the cache said about one chunk.

    Attributes:
        kind: ``hit`` (``data`` holds it), ``claimed`` (download it, then ``store`` or
            ``release``), ``busy`` (another process downloads it: ``wait``), ``bypass``
            (download it; it will not be cached).
        data: The chunk's bytes for a hit.
    """

    kind: Literal["hit", "claimed", "busy", "bypass"]
    data: np.ndarray | None = field(default=None, repr=False)


class DiskCache:
    """The disk cache of remote chunks in one directory (see the NOTE above).

    Opened lazily once per process (a DataLoader worker opens its own after the fork);
    pickles as its options. A failure of its disk never ends a run (see the NOTE): each
    public method then answers as a cache that keeps nothing.

    Args:
        options: Directory, budget and eviction policy.
    """

    def __init__(self, options: DiskCacheOptions) -> None:
        self.options = options
        self.directory = options.path
        self.stats = DiskCacheStats()
        self._pid = -1
        self._db: sqlite3.Connection | None = None
        self._owner = ""
        self._owner_fd = -1
        self._budget = 0
        self._futures: dict[str, tuple[Future, float]] = {}
        self._lock = threading.RLock()  # one connection per process, shared by its threads
        self.disabled = ""  # why this process reads on without the cache ("": it does not)
        self._recreated = False
        self._inode = -1  # of the directory opened

    # -- process state ------------------------------------------------------------

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

    def _close_for_fork(self) -> None:
        """Close this process's connection, the lock held (NOTE [ The ledger and fork ])."""
        if self._db is not None and self._pid == os.getpid():
            self._db.close()
            self._db = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None:
            # A connection inherited across fork is never used nor closed here: closing it
            # could checkpoint or unlock the parent's database (SQLite: no connection may
            # cross fork). It is kept referenced so that it is never collected.
            _INHERITED.append(self._db)
        if self._owner_fd >= 0:
            # The parent's owner lock: closing this copy leaves the parent's lock held by the
            # parent alone, so its claims die with it, not with this child.
            with contextlib.suppress(OSError):
                os.close(self._owner_fd)
            self._owner_fd = -1
        self._db = None
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
        """Return a new connection to the ledger (``ledger.connect``), the budget read."""
        db = ledger.connect(self.directory)
        try:
            with self._lock, transaction(db):
                self._budget = self._read_budget(db)
        except BaseException:
            db.close()
            raise
        return db

    def _read_budget(self, db: sqlite3.Connection) -> int:
        if self.options.budget_bytes is not None:
            return self.options.budget_bytes
        row = db.execute("SELECT value FROM meta WHERE key = 'default_budget'").fetchone()
        if row is not None:
            return int(row[0])
        budget = int(shutil.disk_usage(self.directory).free * DEFAULT_CACHE_DISK_FRACTION)
        db.execute("INSERT INTO meta VALUES ('default_budget', ?)", (str(budget),))
        return budget

    @property
    def budget_bytes(self) -> int:
        """Return the budget this process enforces, in bytes."""
        self._open()
        return self._budget

    def close(self) -> None:
        """Remove this process's future and lock (its ready chunks stay)."""
        if self._db is None or self._pid != os.getpid():
            self._db = None
            return
        with self._lock, contextlib.suppress(sqlite3.Error, OSError), transaction(self._db):
            self._db.execute("DELETE FROM futures WHERE owner = ?", (self._owner,))
            self._drop_claims(self._db, self._owner)
        with contextlib.suppress(OSError):
            (self.directory / "owners" / f"{self._owner}.lock").unlink()
        self._drop()

    def _drop(self) -> None:
        """Close this process's connection and owner lock (its claims then look dead)."""
        if self._db is not None and self._pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        elif self._db is not None:  # inherited across fork: never closed (see _connect)
            _INHERITED.append(self._db)
        if self._owner_fd >= 0:  # a parent's copy too: its lock stays the parent's
            with contextlib.suppress(OSError):
                os.close(self._owner_fd)
        self._db, self._owner_fd, self._pid = None, -1, -1

    # -- a disk that fails ------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn a failure of the cache's disk into one warning (see the NOTE)."""
        try:
            yield
        except UnsafeDirectoryError:
            raise
        except (OSError, sqlite3.Error) as err:
            with self._lock:
                self._failed(err)

    def _failed(self, err: OSError | sqlite3.Error) -> None:
        self._drop()
        if self.disabled:  # another thread's use met it first: warned once
            return
        if self._inode >= 0 and not self._same_directory() and not self._recreated:
            self._recreated = True
            _warn(
                f"the disk cache {self.directory} was removed or replaced while in use "
                f"({err}): it is made again and its chunks are fetched again"
            )
            return
        self.disabled = str(err)
        _warn(
            f"the disk cache {self.directory} cannot be used ({err}): reading on without "
            "it, every chunk from the store"
        )

    def _same_directory(self) -> bool:
        try:
            return os.stat(self.directory).st_ino == self._inode
        except OSError:
            return False

    def __getstate__(self) -> dict[str, object]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, object]) -> None:
        options = state["options"]
        assert isinstance(options, DiskCacheOptions)
        type(self).__init__(self, options)  # a fresh process state, lazily opened

    # -- paths --------------------------------------------------------------------

    def _final(self, pack: str, chunk: int) -> Path:
        return self.directory / "chunks" / pack / f"{chunk}"

    def _temp(self, pack: str, chunk: int, owner: str) -> Path:
        return self.directory / "chunks" / pack / f".{chunk}.{owner}.tmp"

    # -- the future -----------------------------------------------------------------

    def set_future(self, pack: str, future: Future, *, now: float) -> None:
        """Record when this process will use the chunks of ``pack`` (``Future``, epochs)."""
        self._futures[pack] = (future, now)
        if self.disabled:
            return
        with self._guard(), self._lock, transaction(self._open()) as db:
            db.execute(
                "INSERT OR REPLACE INTO futures VALUES (?, ?, ?, ?)",
                (self._owner, pack, now, future.to_bytes()),
            )

    def _futures_of(self, db: sqlite3.Connection, pack: str) -> list[tuple[Future, float]]:
        rows = db.execute("SELECT owner, now, future FROM futures WHERE pack = ?", (pack,))
        futures = []
        for owner, now, blob in rows.fetchall():
            mine = self._futures.get(pack) if owner == self._owner else None
            futures.append(mine if mine is not None else (Future.from_bytes(blob), now))
        return futures

    def _distances(self, db: sqlite3.Connection, packs: set[str]) -> dict[str, dict[int, float]]:
        return {pack: next_uses(self._futures_of(db, pack)) for pack in packs}

    def _new_distance(
        self, db: sqlite3.Connection, pack: str, chunk: int, at: float | None
    ) -> float | None:
        """Return the distance to the new chunk's next use after the one at ``at``.

        The use at ``at`` itself is skipped in every future: the workers of one rank (and
        two jobs with one plan) record the same uses at the same times.
        """
        found: float | None = None
        for future, now in self._futures_of(db, pack):
            times = future.times[future.chunks == chunk]
            later = times[times > now]
            if at is not None:
                later = later[np.abs(later - at) > _SAME_USE]
            if len(later):
                distance = float(later[0]) - now
                found = distance if found is None else min(found, distance)
        return found

    # -- claims ---------------------------------------------------------------------

    def claim(
        self,
        pack: str,
        chunk: int,
        nbytes: int,
        *,
        now: float | None = None,
        at: float | None = None,
        reserve: bool = True,
    ) -> Claim:
        """Return the chunk if cached, else whether this process should download it.

        Args:
            pack: The pack's key (``pack_key``).
            chunk: The chunk's index.
            nbytes: Its stored bytes (reserved against the budget when claimed).
            now: This process's time (epochs) in its future: what it has read so far.
            at: The time of this use (``now`` or later: a read-ahead runs ahead); the
                new chunk's next use is its first use after this one. None: ``now``.
            reserve: False: a chunk neither cached nor downloaded by another is not claimed
                (``bypass``), but ``put`` once its download was checked.
        """
        if not reserve:
            row = self._row(pack, chunk)
            if row is None or row[0] != READY:  # busy: another downloads it
                return Claim("busy" if row and self._owner_alive(row[1]) else "bypass")
        if not self.disabled:
            with self._guard():
                return self._claim_read(pack, chunk, nbytes, now, now if at is None else at)
        return Claim("bypass")

    def _claim_read(
        self, pack: str, chunk: int, nbytes: int, now: float | None, at: float | None
    ) -> Claim:
        for _ in range(3):
            kind, stored, digest = self._claim(pack, chunk, nbytes, now, at)
            with self._lock:
                ledger.trim(self._open(), self.directory)  # every claim writes the ledger
            if kind != "hit":
                return Claim(kind)
            # Read outside the transaction: a file evicted meanwhile stays readable once
            # open; one gone before it was opened (or short) is claimed again.
            data = self._read(pack, chunk, stored)
            if data is not None and ledger.digest_matches(digest, data):
                self.stats.hits += 1
                return Claim("hit", data)
            if data is not None:
                self.stats.damaged += 1
                _warn(
                    f"the disk cache's file {self._final(pack, chunk)} does not match the "
                    "digest recorded when it was written (damaged on disk): evicted, its "
                    "chunk is fetched again"
                )
            self._evict(pack, chunk)  # short or damaged: never served
        return Claim("bypass")

    def evict(self, pack: str, chunk: int) -> None:
        """Drop a ready chunk whose bytes the reader found wrong (it is fetched again)."""
        if not self.disabled:
            with self._guard():
                self._evict(pack, chunk)

    def _evict(self, pack: str, chunk: int) -> None:
        with self._lock, transaction(self._open()) as db:
            if db.execute(
                "DELETE FROM entries WHERE pack = ? AND chunk = ? AND state = ?",
                (pack, chunk, READY),
            ).rowcount:
                with contextlib.suppress(FileNotFoundError):
                    self._final(pack, chunk).unlink()

    def _claim(
        self, pack: str, chunk: int, nbytes: int, now: float | None, at: float | None
    ) -> tuple[Literal["hit", "claimed", "busy", "bypass"], int, str]:
        with self._lock, transaction(self._open()) as db:
            row = db.execute(
                "SELECT state, owner, nbytes, digest FROM entries WHERE pack = ? AND chunk = ?",
                (pack, chunk),
            ).fetchone()
            clock = self._tick(db)
            if row is not None and row[0] == READY:
                db.execute(
                    "UPDATE entries SET used = ? WHERE pack = ? AND chunk = ?",
                    (clock, pack, chunk),
                )
                return "hit", int(row[2]), str(row[3] or "")
            if row is not None:
                # Another thread of this process, or a live process, downloads it.
                if row[1] == self._owner or self._owner_alive(row[1]):
                    return "busy", 0, ""
                self._recover_owner(db, row[1])
            if now is not None and pack in self._futures and now > self._futures[pack][1]:
                self._futures[pack] = (self._futures[pack][0], now)
                db.execute(
                    "UPDATE futures SET now = ? WHERE owner = ? AND pack = ?",
                    (now, self._owner, pack),
                )
            self.stats.misses += 1
            if not self._make_room(db, pack, chunk, nbytes, clock, at):
                self.stats.bypassed += 1
                return "bypass", 0, ""
            db.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, NULL)",
                (pack, chunk, nbytes, CLAIMED, self._owner, clock),
            )
            return "claimed", 0, ""

    def _tick(self, db: sqlite3.Connection) -> int:
        row = db.execute("SELECT value FROM meta WHERE key = 'clock'").fetchone()
        clock = int(row[0]) + 1 if row is not None else 1
        db.execute("INSERT OR REPLACE INTO meta VALUES ('clock', ?)", (str(clock),))
        return clock

    def _make_room(
        self,
        db: sqlite3.Connection,
        pack: str,
        chunk: int,
        nbytes: int,
        clock: int,
        at: float | None,
    ) -> bool:
        cost = ledger.cost(nbytes) + ledger.overhead_bytes(self.directory) + ledger.GROWTH
        if cost > self._budget:
            return False
        (total,) = db.execute(f"SELECT COALESCE(SUM({_COST}), 0) FROM entries").fetchone()
        need = int(total) + cost - self._budget
        if need <= 0:
            return True
        rows = db.execute("SELECT pack, chunk, nbytes, used FROM entries WHERE state = ?", (READY,))
        candidates = [
            Candidate(p, int(c), ledger.cost(int(n)), int(u)) for p, c, n, u in rows.fetchall()
        ]
        policy = self.options.eviction
        distances: dict[str, dict[int, float]] = {}
        new_distance = None
        if policy == "belady":
            distances = self._distances(db, {c.pack for c in candidates})
            new_distance = self._new_distance(db, pack, chunk, at)
        victims = choose_victims(
            candidates,
            need_bytes=need,
            new_distance=new_distance,
            new_used=clock,
            distances=distances,
            policy=policy,
        )
        if victims is None:
            return False
        for victim in victims:
            self._forget(db, victim.pack, victim.chunk)
            self.stats.evicted_bytes += victim.nbytes
        return True

    def _forget(self, db: sqlite3.Connection, pack: str, chunk: int) -> None:
        # The file goes before the row is committed: a crash in between leaves a ready row
        # without a file, which is read as a miss (never a file outside the budget).
        with contextlib.suppress(FileNotFoundError):
            self._final(pack, chunk).unlink()
        db.execute("DELETE FROM entries WHERE pack = ? AND chunk = ?", (pack, chunk))

    def store(self, pack: str, chunk: int, data: np.ndarray | bytes | memoryview) -> None:
        """Write a claimed chunk (temporary file, rename) and mark it ready."""
        if not self.disabled:
            with self._guard():
                self._store(pack, chunk, data)

    def _store(self, pack: str, chunk: int, data: np.ndarray | bytes | memoryview) -> None:
        self._open()  # this process's owner names the temporary file
        if not self._same_directory():  # removed (a cleaner) or replaced under us
            raise FileNotFoundError(f"{self.directory} is not the directory opened")
        final = self._final(pack, chunk)
        temp = self._temp(pack, chunk, self._owner)
        view = (
            memoryview(np.ascontiguousarray(data).data)
            if isinstance(data, np.ndarray)
            else memoryview(data)
        ).cast("B")
        try:
            final.parent.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as out:
                out.write(view)
            os.replace(temp, final)
        except OSError:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        with self._lock, transaction(self._open()) as db:
            updated = db.execute(
                "UPDATE entries SET state = ?, nbytes = ?, digest = ? WHERE pack = ? "
                "AND chunk = ? AND owner = ? AND state = ?",
                (READY, len(view), ledger.file_digest(view), pack, chunk, self._owner, CLAIMED),
            ).rowcount
            if not updated:  # taken from us meanwhile (we were thought dead): not ours
                with contextlib.suppress(FileNotFoundError):
                    final.unlink()
                return
        self.stats.stored_bytes += len(view)

    def release(self, pack: str, chunk: int) -> None:
        """Give up a claim (the download failed): the chunk may be claimed again."""
        if self.disabled:
            return
        with self._guard(), self._lock, transaction(self._open()) as db:
            row = db.execute(
                "SELECT owner, state FROM entries WHERE pack = ? AND chunk = ?", (pack, chunk)
            ).fetchone()
            if row is not None and row[0] == self._owner and row[1] == CLAIMED:
                db.execute("DELETE FROM entries WHERE pack = ? AND chunk = ?", (pack, chunk))
        with contextlib.suppress(OSError):
            self._temp(pack, chunk, self._owner).unlink()

    def wait(
        self,
        pack: str,
        chunk: int,
        nbytes: int,
        *,
        now: float | None = None,
        at: float | None = None,
        reserve: bool = True,
    ) -> Claim:
        """Wait while another process downloads the chunk; return the next claim on it."""
        self.stats.waits += 1
        checked = time.monotonic()
        while True:
            row = self._row(pack, chunk)
            if row is None or row[0] == READY:
                return self.claim(pack, chunk, nbytes, now=now, at=at, reserve=reserve)
            if time.monotonic() - checked > _OWNER_CHECK_S:
                checked = time.monotonic()
                if not self._owner_alive(row[1]):
                    return self.claim(pack, chunk, nbytes, now=now, at=at, reserve=reserve)
            time.sleep(_POLL_S)

    def _row(self, pack: str, chunk: int) -> tuple[int, str] | None:
        """Return the chunk's ``(state, owner)`` in the ledger, or None."""
        row = None
        if not self.disabled:
            with self._guard(), self._lock:
                row = (
                    self._open()
                    .execute(
                        "SELECT state, owner FROM entries WHERE pack = ? AND chunk = ?",
                        (pack, chunk),
                    )
                    .fetchone()
                )
        return row

    def put(self, pack: str, chunk: int, data: np.ndarray, *, now: float | None = None) -> None:
        """Cache a chunk downloaded unclaimed (``reserve=False``), if it is worth its room."""
        if self.claim(pack, chunk, data.size, now=now).kind == "claimed":
            self.store(pack, chunk, data)

    def _read(self, pack: str, chunk: int, nbytes: int) -> np.ndarray | None:
        try:
            with open(self._final(pack, chunk), "rb") as source:
                data = np.empty(nbytes, dtype=np.uint8)
                got = source.readinto(data.data)
                if got != nbytes or source.read(1):
                    return None
        except FileNotFoundError:
            return None
        return data

    # -- dead owners ------------------------------------------------------------------

    def _owner_alive(self, owner: str) -> bool:
        return owner == self._owner or ledger.owner_alive(self.directory, owner)

    def _drop_claims(self, db: sqlite3.Connection, owner: str) -> int:
        rows = db.execute(
            "SELECT pack, chunk FROM entries WHERE owner = ? AND state = ?", (owner, CLAIMED)
        ).fetchall()
        for pack, chunk in rows:
            for path in (self._temp(pack, chunk, owner), self._final(pack, chunk)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            db.execute("DELETE FROM entries WHERE pack = ? AND chunk = ?", (pack, chunk))
        return len(rows)

    def _recover_owner(self, db: sqlite3.Connection, owner: str) -> None:
        self.stats.recovered += self._drop_claims(db, owner)
        db.execute("DELETE FROM futures WHERE owner = ?", (owner,))
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "owners" / f"{owner}.lock").unlink()

    def recover(self) -> None:
        """Remove what processes that are gone left: claims, futures, locks, files.

        Also, when no other live process uses the directory (the files of a large cache
        are listed once, not by every worker), files without a row (a crash between a
        rename and its commit) and rows without a file: the directory holds what the
        ledger counts.
        """
        with self._lock, transaction(self._open()) as db:
            owners = {
                o
                for (o,) in db.execute(
                    "SELECT DISTINCT owner FROM entries WHERE state = ?", (CLAIMED,)
                )
            }
            owners |= {o for (o,) in db.execute("SELECT DISTINCT owner FROM futures")}
            owners |= {n.removesuffix(".lock") for n in os.listdir(self.directory / "owners")}
            alone = True
            for owner in owners - {self._owner}:
                if self._owner_alive(owner):
                    alone = False
                else:
                    self._recover_owner(db, owner)
            if alone:
                self.stats.swept += ledger.sweep(db, self.directory, self._owner_alive)

    # -- inspection -------------------------------------------------------------------

    def usage_bytes(self, *, on_disk: bool = False) -> int:
        """Return the bytes of the chunks (claimed too) the ledger holds.

        Args:
            on_disk: Count whole blocks, and what the directory holds besides (``du``).
        """
        with self._lock:
            db = self._open()
            summed = _COST if on_disk else "nbytes"
            (total,) = db.execute(f"SELECT COALESCE(SUM({summed}), 0) FROM entries").fetchone()
        return int(total) + (ledger.overhead_bytes(self.directory) if on_disk else 0)


# NOTE [ The ledger and fork ]: SQLite forbids carrying a connection across fork, and more:
# its unix VFS keeps, per process, the state of every open database file (the POSIX locks it
# believes it holds, the WAL index it mapped), which a forked child inherits while the kernel
# gives the child none of the parent's locks. A DataLoader forks its workers while the
# parent's cache is open, perhaps while a read-ahead thread of the parent is inside a
# transaction (holding the cache's lock and SQLite's mutexes: measured, a child then hung
# on its first claim). So before any fork every open cache of the process takes its lock
# (the transactions under way finish first) and closes its connection; after the fork the
# locks are released in both processes, the parent reopens its connection at its next use
# (same owner, same flock) and the child opens its own, from a clean SQLite state.
_OPEN: weakref.WeakSet[DiskCache] = weakref.WeakSet()
_HELD: list[DiskCache] = []


def _before_fork() -> None:
    for cache in list(_OPEN):
        cache._lock.acquire()
        _HELD.append(cache)
        cache._close_for_fork()


def _after_fork() -> None:
    while _HELD:
        _HELD.pop()._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def _warn(message: str) -> None:
    warnings.warn(message, DiskCacheWarning, stacklevel=3)
