"""A user's disk cache of remote chunks, shared by their processes, under a byte budget.

NOTE [ One disk cache per machine ]

Every process of a user reading a remote pack opens one private directory (NOTE [ Private
directories ]): a chunk is downloaded once, read from disk by all (docs/decisions/0018,
0110). ``ledger.sqlite`` (``read/ledger.py``) holds a row per chunk, *claimed* (being
downloaded, its bytes reserved) or *ready*; a process reserves and evicts
(``read/eviction.py``) in one transaction, so the directory never exceeds the budget. A
claimed chunk is waited for; a read-ahead that checks its chunks ``put``s each once checked.
Files are written to a temporary and renamed before their row turns ready; a short file, or
one that no longer matches its row's digest, is evicted (with a warning) and fetched again.
Each process holds an ``flock`` on ``owners/<owner>.lock``: a claim whose lock can be taken
is a dead process's. Opening sweeps what exited processes left. A cache that cannot be
written warns once and is read around; a directory removed while in use is made again once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.core.private import user_cache_dir
from h5pack.errors import OptionsError
from h5pack.read import ledger
from h5pack.read.cachedir import DEFAULT_CACHE_DISK_FRACTION as DEFAULT_CACHE_DISK_FRACTION
from h5pack.read.cachedir import CacheDirectory, warn
from h5pack.read.cachedir import DiskCacheWarning as DiskCacheWarning
from h5pack.read.eviction import (
    Candidate,
    EvictionPolicy,
    Future,
    choose_victims,
    new_distance,
    next_uses,
    parse_policy,
)
from h5pack.read.ledger import CLAIMED, COST_SQL, READY, transaction

_POLL_S = 0.005
_OWNER_CHECK_S = 0.25
ClaimKind = Literal["hit", "claimed", "busy", "bypass"]


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
        directory: The directory; None: ``default_cache_dir()``.
        budget_bytes: The whole directory's budget; None: ``DEFAULT_CACHE_DISK_FRACTION``
            of its file system's free space when the directory was created.
        eviction: ``belady`` (the chunk needed farthest ahead goes) or ``lru``.
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


@dataclass(frozen=True)
class Claim:
    """What the cache said about one chunk.

    ``hit`` (``data`` holds it), ``claimed`` (download it, then ``store`` or ``release``),
    ``busy`` (another process downloads it: ``wait``), ``bypass`` (download, not cached).
    """

    kind: ClaimKind
    data: np.ndarray | None = field(default=None, repr=False)


class DiskCache(CacheDirectory):
    """The disk cache in one directory, opened lazily once per process; pickles as options.

    A failure of its disk never ends a run: each method then answers as a cache that keeps
    nothing (``CacheDirectory``).
    """

    def __init__(self, options: DiskCacheOptions) -> None:
        super().__init__(options.path, options.budget_bytes)
        self.options = options
        self._futures: dict[str, tuple[Future, float]] = {}

    def __reduce__(self) -> tuple[type[DiskCache], tuple[DiskCacheOptions]]:
        return type(self), (self.options,)  # a fresh process state, lazily opened

    def set_future(self, pack: str, future: Future, *, now: float) -> None:
        """Record when this process will use the chunks of ``pack`` (``Future``, epochs)."""
        self._futures[pack] = (future, now)
        if not self.disabled:
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
            at: The time of this use (a read-ahead runs ahead of ``now``); None: ``now``.
            reserve: False: a chunk neither cached nor being downloaded is not claimed
                (``bypass``), but ``put`` once its download was checked.
        """
        if not reserve:
            row = self._row(pack, chunk)
            if row is None or row[0] != READY:  # busy: another downloads it
                return Claim("busy" if row and self._owner_alive(row[1]) else "bypass")
        if self.disabled:
            return Claim("bypass")
        with self._guard():
            for _ in range(3):
                kind, stored, digest = self._claim(
                    pack, chunk, nbytes, now, now if at is None else at
                )
                with self._lock:
                    ledger.trim(self._open(), self.directory)  # every claim writes the ledger
                if kind != "hit":
                    return Claim(kind)
                # Read outside the transaction: a file evicted meanwhile stays readable
                # once open; one gone before (or short) is claimed again.
                data = self._read(pack, chunk, stored)
                if data is not None and ledger.digest_matches(digest, data):
                    self.stats.hits += 1
                    return Claim("hit", data)
                if data is not None:
                    self.stats.damaged += 1
                    warn(
                        f"the disk cache's file {ledger.chunk_path(self.directory, pack, chunk)} "
                        "does not match the digest recorded when it was written (damaged on "
                        "disk): evicted, its chunk is fetched again"
                    )
                self._evict(pack, chunk)  # short or damaged: never served
        return Claim("bypass")

    def _claim(
        self, pack: str, chunk: int, nbytes: int, now: float | None, at: float | None
    ) -> tuple[ClaimKind, int, str]:
        with self._lock, transaction(self._open()) as db:
            row = db.execute(
                "SELECT state, owner, nbytes, digest FROM entries WHERE pack = ? AND chunk = ?",
                (pack, chunk),
            ).fetchone()
            clock = ledger.tick(db)
            if row is not None and row[0] == READY:
                db.execute(
                    "UPDATE entries SET used = ? WHERE pack = ? AND chunk = ?",
                    (clock, pack, chunk),
                )
                return "hit", int(row[2]), str(row[3] or "")
            if row is not None:  # another thread of this process, or a live process
                if self._owner_alive(row[1]):
                    return "busy", 0, ""
                self.stats.recovered += ledger.drop_owner(db, self.directory, row[1], lock=True)
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
        (total,) = db.execute(f"SELECT COALESCE(SUM({COST_SQL}), 0) FROM entries").fetchone()
        need = int(total) + cost - self._budget
        if need <= 0:
            return True
        rows = db.execute("SELECT pack, chunk, nbytes, used FROM entries WHERE state = ?", (READY,))
        candidates = [
            Candidate(p, int(c), ledger.cost(int(n)), int(u)) for p, c, n, u in rows.fetchall()
        ]
        policy = self.options.eviction
        belady = policy == "belady"
        packs = {c.pack for c in candidates} if belady else set()
        victims = choose_victims(
            candidates,
            need_bytes=need,
            new_distance=new_distance(self._futures_of(db, pack), chunk, at) if belady else None,
            new_used=clock,
            distances={p: next_uses(self._futures_of(db, p)) for p in packs},
            policy=policy,
        )
        if victims is None:
            return False
        for victim in victims:
            # the file goes before the row is committed: a crash in between leaves a ready
            # row without a file, read as a miss (never a file outside the budget)
            with contextlib.suppress(FileNotFoundError):
                ledger.chunk_path(self.directory, victim.pack, victim.chunk).unlink()
            db.execute(
                "DELETE FROM entries WHERE pack = ? AND chunk = ?", (victim.pack, victim.chunk)
            )
            self.stats.evicted_bytes += victim.nbytes
        return True

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
                    ledger.chunk_path(self.directory, pack, chunk).unlink()

    def store(self, pack: str, chunk: int, data: np.ndarray | bytes | memoryview) -> None:
        """Write a claimed chunk (temporary file, rename) and mark it ready."""
        if not self.disabled:
            with self._guard():
                self._store(pack, chunk, data)

    def _store(self, pack: str, chunk: int, data: np.ndarray | bytes | memoryview) -> None:
        self._open()  # this process's owner names the temporary file
        if not self._same_directory():  # removed (a cleaner) or replaced under us
            raise FileNotFoundError(f"{self.directory} is not the directory opened")
        final = ledger.chunk_path(self.directory, pack, chunk)
        temp = ledger.chunk_path(self.directory, pack, chunk, self._owner)
        array = np.ascontiguousarray(data).data if isinstance(data, np.ndarray) else data
        view = memoryview(array).cast("B")
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
            db.execute(
                "DELETE FROM entries WHERE pack = ? AND chunk = ? AND owner = ? AND state = ?",
                (pack, chunk, self._owner, CLAIMED),
            )
        with contextlib.suppress(OSError):
            ledger.chunk_path(self.directory, pack, chunk, self._owner).unlink()

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
            if row is not None and row[0] != READY and time.monotonic() - checked > _OWNER_CHECK_S:
                checked = time.monotonic()
                if not self._owner_alive(row[1]):
                    row = None
            if row is None or row[0] == READY:
                return self.claim(pack, chunk, nbytes, now=now, at=at, reserve=reserve)
            time.sleep(_POLL_S)

    def _row(self, pack: str, chunk: int) -> tuple[int, str] | None:
        """Return the chunk's ``(state, owner)`` in the ledger, or None."""
        if not self.disabled:
            with self._guard(), self._lock:
                query = "SELECT state, owner FROM entries WHERE pack = ? AND chunk = ?"
                row: tuple[int, str] | None = self._open().execute(query, (pack, chunk)).fetchone()
                return row
        return None

    def put(self, pack: str, chunk: int, data: np.ndarray, *, now: float | None = None) -> None:
        """Cache a chunk downloaded unclaimed (``reserve=False``), if it is worth its room."""
        if self.claim(pack, chunk, data.size, now=now).kind == "claimed":
            self.store(pack, chunk, data)

    def _read(self, pack: str, chunk: int, nbytes: int) -> np.ndarray | None:
        try:
            with open(ledger.chunk_path(self.directory, pack, chunk), "rb") as source:
                data = np.empty(nbytes, dtype=np.uint8)
                if source.readinto(data.data) != nbytes or source.read(1):
                    return None
        except FileNotFoundError:
            return None
        return data
