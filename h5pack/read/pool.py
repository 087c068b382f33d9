"""``ReadPool``: one pool of reading threads shared by several readers (the sources of a mix).

NOTE [ One pool for a mix's sources ]

With a pool per reader a mix's sources decompressed in rounds that left threads idle
(BENCHMARKS.md, "Mixing packs by weight"). Here the readers share threads (``use_pool``):
``start_loads`` submits every group the batch will miss (``pending_loads``) at once and
``Loading.finish`` hands each reader its groups (``hold``); each then reads as always, so
window, loads and pixels are unchanged. Only the batch's thread submits (a pool task that
waits on another deadlocks a fixed pool); after ``fork`` the pool makes new threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from h5pack.errors import OptionsError

if TYPE_CHECKING:
    from h5pack.read.groups import GroupLoad
    from h5pack.read.reader import PackReader

T = TypeVar("T")
R = TypeVar("R")


class ReadPool:
    """A fixed number of threads that several readers of one process share."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise OptionsError(f"threads should be >= 1, but got threads={threads}")
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._pid = -1

    def executor(self) -> ThreadPoolExecutor:
        """Return this process's threads, started on first use (again after ``fork``)."""
        if self._executor is None or self._pid != os.getpid():
            # a parent's executor has no threads in a forked child: dropped, not shut down
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="h5pack")
            self._pid = os.getpid()
        return self._executor

    def map(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Return ``[function(item) for item in items]``, on the pool's threads if > 1."""
        if self.threads <= 1 or len(items) < 2:
            return [function(item) for item in items]
        return list(self.executor().map(function, items))

    def close(self) -> None:
        """Stop this process's threads (they start again on the next use)."""
        if self._executor is not None and self._pid == os.getpid():
            self._executor.shutdown()
        self._executor = None

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads, "_executor": None, "_pid": -1}


class Loading:
    """Groups of several readers being decompressed on a ``ReadPool`` (``start_loads``)."""

    def __init__(self, pool: ReadPool, requests: Iterable[tuple[PackReader, np.ndarray]]) -> None:
        self.loads: list[GroupLoad] = []
        self._futures: list[Future[np.ndarray] | None] = []  # None: run in ``finish``
        submit = pool.executor().submit if pool.threads > 1 else None
        for reader, indices in requests:
            loads = reader.pending_loads(indices)
            self.loads += loads
            # at once, while the next reader's groups are found (even one: the caller works
            # on meanwhile)
            self._futures += [
                submit(load.run) if submit is not None and load.threaded else None for load in loads
            ]

    def finish(self) -> int:
        """Wait for every group and hand each to its reader (``PackReader.hold``)."""
        wait([future for future in self._futures if future is not None])
        for load, future in zip(self.loads, self._futures, strict=True):
            load.reader.hold(load, load.run() if future is None else future.result())
        count, self.loads, self._futures = len(self.loads), [], []
        return count


def start_loads(pool: ReadPool, requests: Iterable[tuple[PackReader, np.ndarray]]) -> Loading:
    """Start decompressing the chunks that reading each ``(reader, indices)`` will miss."""
    return Loading(pool, requests)


# One thread pool per size and process (a forked worker makes its own) for every ReadAhead:
# a pool each started 16 threads per loader and per shard, all contending.
_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(threads: int) -> ThreadPoolExecutor:
    """Return this process's read-ahead pool of ``threads`` threads."""
    key = (os.getpid(), threads)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="h5pack-readahead")
        return pool
