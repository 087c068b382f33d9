"""The disk cache's ledger (SQLite) and directory: transactions, disk use, owners, leftovers.

``read.diskcache`` keeps its rows here (NOTE [ One disk cache per machine ]).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from h5pack.core import integrity

LEDGER = "ledger.sqlite"
READY, CLAIMED = 1, 0  # a row's state: its file is there, or a process downloads it
BLOCK = 4096  # a file takes whole blocks on disk (what ``du`` counts)
GROWTH = 8 * BLOCK  # kept free besides: the ledger's new pages, a new pack's folder
COST_SQL = f"((nbytes + {BLOCK - 1}) / {BLOCK}) * {BLOCK}"  # ``cost`` in SQL
_WAL_PAGES = 64  # checkpoint the WAL at this many pages, and truncate it to this size
_WAL_RESERVE = 2 * _WAL_PAGES * BLOCK  # a checkpoint may lag the limit
CONNECT_WAIT_S = 60.0  # how long opening retries SQLite's immediate "locked" answers

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    pack TEXT NOT NULL, chunk INTEGER NOT NULL, nbytes INTEGER NOT NULL,
    state INTEGER NOT NULL, owner TEXT NOT NULL, used INTEGER NOT NULL, digest TEXT,
    PRIMARY KEY (pack, chunk));
CREATE TABLE IF NOT EXISTS futures (
    owner TEXT NOT NULL, pack TEXT NOT NULL, now REAL NOT NULL, future BLOB NOT NULL,
    PRIMARY KEY (owner, pack));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def cost(nbytes: int) -> int:
    """Return the bytes a file of ``nbytes`` takes on disk (whole blocks)."""
    return -(-nbytes // BLOCK) * BLOCK


def connect(directory: Path) -> sqlite3.Connection:
    """Return a new connection to ``directory``'s ledger (created 0600), its schema made.

    SQLite answers "database is locked" at once, without its busy timeout, while another
    process opens or recovers a WAL database (two jobs, or sibling workers on a new
    directory): retried for up to ``CONNECT_WAIT_S``. A ledger without digests is emptied.
    """
    path = directory / LEDGER
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))  # SQLite: same mode
    deadline = time.monotonic() + CONNECT_WAIT_S
    wait = 0.01
    while True:
        db = sqlite3.connect(path, timeout=120, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
            db.execute(f"PRAGMA journal_size_limit={_WAL_RESERVE}")
            columns = {row[1] for row in db.execute("PRAGMA table_info(entries)")}
            if columns and "digest" not in columns:
                db.executescript("DROP TABLE entries; DROP TABLE futures;")
            db.executescript(SCHEMA)
        except sqlite3.OperationalError as err:
            db.close()  # this process's own new connection, not an inherited one
            text = str(err).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() > deadline:
                raise
            time.sleep(wait)
            wait = min(0.5, wait * 2)
            continue
        return db


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the block in one write transaction (``BEGIN IMMEDIATE``: the writers queue)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back itself
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def default_budget(db: sqlite3.Connection, directory: Path, fraction: float) -> int:
    """Return the budget recorded in the ledger, recording ``fraction`` of the free space."""
    row = db.execute("SELECT value FROM meta WHERE key = 'default_budget'").fetchone()
    if row is not None:
        return int(row[0])
    budget = int(shutil.disk_usage(directory).free * fraction)
    db.execute("INSERT INTO meta VALUES ('default_budget', ?)", (str(budget),))
    return budget


def tick(db: sqlite3.Connection) -> int:
    """Advance and return the ledger's clock (the order of uses, for LRU)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'clock'").fetchone()
    clock = int(row[0]) + 1 if row is not None else 1
    db.execute("INSERT OR REPLACE INTO meta VALUES ('clock', ?)", (str(clock),))
    return clock


def trim(db: sqlite3.Connection, directory: Path) -> None:
    """Checkpoint and truncate the WAL past its reserve (outside transactions).

    With several writers SQLite's own checkpoints rarely find the WAL unused.
    """
    if _blocks(directory / f"{LEDGER}-wal") > _WAL_RESERVE:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _blocks(path: Path) -> int:
    try:
        return os.lstat(path).st_blocks * 512
    except OSError:
        return 0


def overhead_bytes(directory: Path) -> int:
    """Return what ``directory`` holds besides chunk files, as ``du`` counts it.

    The ledger and its files (the WAL counted at its limit at least), locks, directories.
    """
    total = _blocks(directory) + _blocks(directory / LEDGER) + _blocks(directory / f"{LEDGER}-shm")
    total += max(_blocks(directory / f"{LEDGER}-wal"), _WAL_RESERVE)
    for folder in (directory / "owners", directory / "chunks"):  # lock files, packs' folders
        total += _blocks(folder)
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


def file_digest(data: memoryview | np.ndarray) -> str:
    """Return the digest a row records of its file's bytes (XXH3-64, else CRC32)."""
    if integrity.has_sample_digest():
        return f"xxh3:{integrity.sample_digest(data):016x}"
    return f"crc32:{integrity.crc32(data):08x}"


def digest_matches(digest: str, data: np.ndarray) -> bool:
    """Return whether ``data`` has the recorded ``digest`` (True when it cannot be told)."""
    kind, _, value = digest.partition(":")
    if kind == "crc32":
        return f"{integrity.crc32(data):08x}" == value
    if kind == "xxh3" and integrity.has_sample_digest():
        return f"{integrity.sample_digest(data):016x}" == value
    return True


def chunk_path(directory: Path, pack: str, chunk: int, owner: str | None = None) -> Path:
    """Return a chunk's file, or its temporary file while ``owner`` writes it."""
    name = f"{chunk}" if owner is None else f".{chunk}.{owner}.tmp"
    return directory / "chunks" / pack / name


def owner_alive(directory: Path, owner: str) -> bool:
    """Return whether the process ``owner`` holds its lock in ``directory`` (lives)."""
    try:
        fd = os.open(directory / "owners" / f"{owner}.lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def drop_owner(db: sqlite3.Connection, directory: Path, owner: str, *, lock: bool) -> int:
    """Remove ``owner``'s claims (rows and files), future and, with ``lock``, its lock file.

    Returns the claims removed.
    """
    rows = db.execute(
        "SELECT pack, chunk FROM entries WHERE owner = ? AND state = ?", (owner, CLAIMED)
    ).fetchall()
    for pack, chunk in rows:
        for path in (chunk_path(directory, pack, chunk, owner), chunk_path(directory, pack, chunk)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        db.execute("DELETE FROM entries WHERE pack = ? AND chunk = ?", (pack, chunk))
    db.execute("DELETE FROM futures WHERE owner = ?", (owner,))
    if lock:
        with contextlib.suppress(FileNotFoundError):
            (directory / "owners" / f"{owner}.lock").unlink()
    return len(rows)


def sweep(db: sqlite3.Connection, directory: Path, alive: Callable[[str], bool]) -> int:
    """Remove files without a row, dead owners' temporaries, rows without a file.

    In the caller's transaction; returns the files removed.
    """
    rows = {(p, int(c)): int(s) for p, c, s in db.execute("SELECT pack, chunk, state FROM entries")}
    present: set[tuple[str, int]] = set()
    chunks, removed = directory / "chunks", 0
    for pack in os.listdir(chunks):
        for name in os.listdir(chunks / pack):
            parts = name.split(".")  # "<chunk>", or ".<chunk>.<owner>.tmp"
            if name.isdigit() and (pack, int(name)) in rows:
                present.add((pack, int(name)))
                continue
            if len(parts) == 4 and alive(parts[2]):
                continue
            with contextlib.suppress(FileNotFoundError):
                (chunks / pack / name).unlink()
            removed += 1
        with contextlib.suppress(OSError):
            (chunks / pack).rmdir()  # only when empty
    for (pack, chunk), state in rows.items():
        if state == READY and (pack, chunk) not in present:
            db.execute("DELETE FROM entries WHERE pack = ? AND chunk = ?", (pack, chunk))
    return removed
