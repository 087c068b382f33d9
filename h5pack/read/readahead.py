"""Planned read-ahead: a worker fetches the chunks of its own plan before it needs them.

NOTE [ Planned read-ahead ]

A worker's chunk order is known before the epoch (``plan_epoch``): ``ReadAhead.plan`` keeps
requests in flight ahead of the reader, one per chunk or per run adjacent in plan and file
(``merge_bytes``), ``depth`` fixed or by Little's law from the measured request time and
bytes and the reader's rate (``ceil(1.5 D T / B) + 1``), at most ``ahead_bytes`` held. A
chunk off the plan is found further on (a jump) or read at once: never wrong bytes, only
later ones. Every chunk is claimed in the disk cache first; with ``defer_store`` a fetched
one enters it only once the reader checked it (NOTE [ Checked downloads ]).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack.read.diskcache import DiskCache
from h5pack.read.options import ReadAheadOptions as ReadAheadOptions
from h5pack.read.pool import shared_pool

# pending chunks this far (at least) behind the one just served were skipped: dropped
_SLACK_POSITIONS = 16


@dataclass
class ReadAheadStats:
    """What one process's read-ahead did, in counts and bytes."""

    requests: int = 0
    fetched_bytes: int = 0
    cache_hits: int = 0
    refetched: int = 0
    served: int = 0
    waited: int = 0
    off_plan: int = 0
    most_in_flight: int = 0


class ReadAhead:
    """Fetch a worker's planned chunks ahead of use (see the NOTE above)."""

    def __init__(
        self,
        source: Any,
        offsets: np.ndarray,
        sizes: np.ndarray,
        *,
        options: ReadAheadOptions | None = None,
        cache: DiskCache | None = None,
        pack: str | None = None,
        defer_store: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cache is not None and pack is None:
            raise ValueError("a read-ahead with a cache needs the pack's key")
        self.source = source
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.options = options or ReadAheadOptions()
        self.cache = cache
        self.pack = pack or ""
        self.defer_store = defer_store
        self._unverified: OrderedDict[int, np.ndarray] = OrderedDict()  # fetched, claimable
        self._unverified_bytes = 0
        self.clock = clock
        self.stats = ReadAheadStats()
        self._lock = threading.Lock()
        self._tasks: set[concurrent.futures.Future[Any]] = set()  # this one's, in the pool
        self._stream = np.zeros(0, dtype=np.int64)
        self._times: np.ndarray | None = None
        self._positions: dict[int, list[int]] = {}
        self._next = 0  # the next position of the plan to request
        self._served_at = -1  # the furthest position served
        self._served_time: float | None = None  # its time (epochs)
        self._pending: dict[int, concurrent.futures.Future[np.ndarray]] = {}
        self._pending_at: dict[int, int] = {}  # a pending chunk's position in the plan
        self._held_bytes = 0
        self._in_flight = 0
        self._request_s = 0.0  # measured: seconds and bytes of the requests so far
        self._request_bytes = 0
        self._measured = 0
        self._consumed_bytes = 0
        self._busy_s = 0.0  # the reader's time between gets, not waiting
        self._last_get: float | None = None

    def plan(self, stream: Sequence[int] | np.ndarray, times: np.ndarray | None = None) -> None:
        """Start reading ahead for the chunks ``stream``, in order of use (``times``: epochs)."""
        with self._lock:
            self._drop_pending()
            self._stream = np.asarray(stream, dtype=np.int64)
            self._times = None if times is None else np.asarray(times, dtype=np.float64)
            self._positions = {}
            for position, chunk in enumerate(self._stream.tolist()):
                self._positions.setdefault(chunk, []).append(position)
            self._next = 0
            self._served_at = -1
            self._served_time = None
            self._last_get = None
        self._fill()

    def _drop_pending(self, before: int | None = None) -> None:
        """Forget pending chunks (planned before position ``before``; None: all)."""
        for chunk in list(self._pending):
            if before is None or self._pending_at.get(chunk, -1) < before:
                self._pending.pop(chunk).cancel()
                self._pending_at.pop(chunk, None)
                self._held_bytes -= int(self.sizes[chunk])

    def depth(self) -> int:
        """Return the requests to keep in flight now (fixed, or from the measurements)."""
        if self.options.requests_in_flight is not None:
            return self.options.requests_in_flight
        top = self.options.max_requests_in_flight
        if not self._measured or self._busy_s <= 0 or not self._consumed_bytes:
            return min(4, top)
        demand = self._consumed_bytes / self._busy_s  # bytes per second; per request below
        wanted = math.ceil(1.5 * demand * self._request_s / max(self._request_bytes, 1)) + 1
        return max(2, min(top, wanted))

    def _fill(self, *, force: bool = False) -> None:
        """Request the next chunks of the plan while depth and memory allow."""
        with self._lock:
            depth = self.depth()
            while self._next < len(self._stream):
                chunk = int(self._stream[self._next])
                if chunk in self._pending:
                    self._next += 1
                    continue
                if not force and (
                    self._in_flight >= depth
                    or sum(p > self._served_at for p in self._pending_at.values()) >= 2 * depth
                    or (
                        self._held_bytes
                        and self._held_bytes + self.sizes[chunk] > self.options.ahead_bytes
                    )
                ):
                    break
                force = False
                self._submit(self._run_from(self._next))

    def _submit(self, run: list[int]) -> None:
        first = self._next
        self._next = first + len(run)
        futures: list[concurrent.futures.Future[np.ndarray]] = []
        for at, piece in enumerate(run, first):
            future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
            self._pending[piece] = future
            self._pending_at[piece] = at
            self._held_bytes += int(self.sizes[piece])
            futures.append(future)
        self._in_flight += 1
        self.stats.most_in_flight = max(self.stats.most_in_flight, self._in_flight)
        times: list[float | None] = [None] * len(run)
        if self._times is not None:
            times = self._times[first : self._next].tolist()
        self._start(self._fetch_task, run, futures, times)

    def _start(self, function: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Run ``function(*args)`` on the pool, remembered until it ends (``close``)."""
        task = self._executor().submit(function, *args)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _run_from(self, first: int) -> list[int]:
        """Return the chunks from plan position ``first`` that one request may merge."""
        run = [int(self._stream[first])]
        total = int(self.sizes[run[0]])
        position = first + 1
        while position < len(self._stream):
            chunk = int(self._stream[position])
            previous = run[-1]
            adjacent = self.offsets[chunk] == self.offsets[previous] + self.sizes[previous]
            total += int(self.sizes[chunk])
            if (
                not adjacent
                or chunk in self._pending
                or total > self.options.merge_bytes
                or self._held_bytes + total > self.options.ahead_bytes
            ):
                break
            run.append(chunk)
            position += 1
        return run

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        return shared_pool(self.options.threads)

    def _fetch_task(
        self,
        run: list[int],
        futures: list[concurrent.futures.Future[np.ndarray]],
        times: list[float | None],
    ) -> None:
        try:
            results = self._fetch(run, times)
        except BaseException as err:
            for future in futures:
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(err)  # a cancelled one was dropped: nobody waits
        else:
            for future, data in zip(futures, results, strict=True):
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_result(data)
        finally:
            with self._lock:
                self._in_flight -= 1
        self._fill()

    def _fetch(self, run: list[int], times: list[float | None]) -> list[np.ndarray]:
        """Return the bytes of the chunks ``run`` (adjacent in the file), cache first."""
        found: dict[int, np.ndarray] = {}
        claimed: set[int] = set()
        if self.cache is not None:
            # distances from what the reader has read (chunks from there on are still to come)
            now = self._served_time
            reserve = not self.defer_store  # deferred: ``put`` once the reader checked it
            for chunk, at in zip(run, times, strict=True):
                nbytes = int(self.sizes[chunk])
                claim = self.cache.claim(self.pack, chunk, nbytes, now=now, at=at, reserve=reserve)
                while claim.kind == "busy":
                    claim = self.cache.wait(
                        self.pack, chunk, nbytes, now=now, at=at, reserve=reserve
                    )
                if claim.kind == "hit":
                    assert claim.data is not None
                    found[chunk] = claim.data
                    with self._lock:
                        self.stats.cache_hits += 1
                elif claim.kind == "claimed":
                    claimed.add(chunk)
        try:
            # The chunks left form runs that stay adjacent in the file: one request each.
            wanted = [c for c in run if c not in found]
            start = 0
            for stop in range(1, len(wanted) + 1):
                if stop == len(wanted) or self.offsets[wanted[stop]] != (
                    self.offsets[wanted[stop - 1]] + self.sizes[wanted[stop - 1]]
                ):
                    found.update(self._request(wanted[start:stop]))
                    start = stop
        except BaseException:
            if self.cache is not None:
                for chunk in claimed:
                    self.cache.release(self.pack, chunk)
            raise
        if self.cache is not None:
            for chunk in claimed:
                self.cache.store(self.pack, chunk, found[chunk])
            if self.defer_store:
                with self._lock:
                    for chunk in wanted:
                        self._hold(chunk, found[chunk])
        return [found[c] for c in run]

    def _hold(self, chunk: int, data: np.ndarray | None) -> None:
        """Keep (or, with None, forget) a fetched chunk until the reader verified it."""
        old = self._unverified.pop(chunk, None)
        self._unverified_bytes -= 0 if old is None else old.size
        if data is not None:
            self._unverified[chunk] = data
            self._unverified_bytes += data.size
        while self._unverified_bytes > self.options.ahead_bytes:  # never read: not cached
            self._unverified_bytes -= self._unverified.popitem(last=False)[1].size

    def verified(self, chunks: Sequence[int]) -> None:
        """Cache ``chunks``, whose bytes the reader checked (``defer_store``)."""
        for chunk in chunks:
            with self._lock:
                data = self._unverified.get(chunk)
                self._hold(chunk, None)
            if data is not None and self.cache is not None:
                self.cache.put(self.pack, chunk, data, now=self._served_time)

    def refetch(self, chunks: Sequence[int]) -> dict[int, np.ndarray]:
        """Fetch ``chunks`` again, one request each, dropping the bytes the reader found wrong."""
        fresh = {}
        for chunk in chunks:
            if self.cache is not None:
                self.cache.evict(self.pack, chunk)
            fresh[chunk] = self._request([chunk])[chunk]
            with self._lock:
                self.stats.refetched += 1
                if self.cache is not None:
                    self._hold(chunk, fresh[chunk])
        return fresh

    def _request(self, chunks: list[int]) -> dict[int, np.ndarray]:
        begin = int(self.offsets[chunks[0]])
        size = int(self.offsets[chunks[-1]] + self.sizes[chunks[-1]]) - begin
        started = self.clock()
        (got,) = self.source.read_ranges([(begin, begin + size)])
        data = np.frombuffer(got, dtype=np.uint8)
        elapsed = self.clock() - started
        if data.size != size:
            raise OSError(f"a ranged read of {size} bytes at {begin} returned {data.size} bytes")
        with self._lock:
            self.stats.requests += 1
            self.stats.fetched_bytes += size
            self._request_s += elapsed
            self._request_bytes += size
            self._measured += 1
        parts = {}
        for chunk in chunks:
            low = int(self.offsets[chunk]) - begin
            parts[chunk] = data[low : low + int(self.sizes[chunk])]
        return parts

    def get(self, chunk: int) -> np.ndarray:
        """Return the stored bytes of ``chunk`` (read-only), waiting for them if needed."""
        now = self.clock()
        position: int | None = None
        with self._lock:
            if self._last_get is not None:
                self._busy_s += now - self._last_get
            future = self._pending.get(chunk)
            if future is None:
                ahead_at = self._position_ahead(chunk)
                if ahead_at is not None:  # further on in the plan: jump there
                    self._next = ahead_at
        if future is None:
            self._fill(force=True)
            with self._lock:
                future = self._pending.get(chunk)
        if future is None:
            with self._lock:
                self.stats.off_plan += 1
            data = self._fetch([chunk], [None])[0]
        else:
            if not future.done():
                with self._lock:
                    self.stats.waited += 1
            data = future.result()
            with self._lock:
                if self._pending.get(chunk) is future:
                    del self._pending[chunk]
                    position = self._pending_at.pop(chunk, None)
                    self._held_bytes -= int(self.sizes[chunk])
        with self._lock:
            if position is not None:
                if position > self._served_at and self._times is not None:
                    self._served_time = float(self._times[position])
                self._served_at = max(self._served_at, position)
                slack = max(_SLACK_POSITIONS, 2 * self.depth())
                self._drop_pending(before=position - slack)
            self.stats.served += 1
            self._consumed_bytes += int(self.sizes[chunk])
            self._last_get = self.clock()
        self._fill()
        return data

    def get_many(self, chunks: Sequence[int]) -> list[np.ndarray]:
        """Return the stored bytes of ``chunks``; those off the plan are fetched at once."""
        with self._lock:
            off_plan = [
                c
                for c in dict.fromkeys(int(c) for c in chunks)
                if c not in self._pending and self._position_ahead(c) is None
            ]
        started = {c: self._start(self._fetch, [c], [None]) for c in off_plan}
        found: list[np.ndarray] = []
        for chunk in chunks:
            future = started.get(int(chunk))
            if future is None:
                found.append(self.get(int(chunk)))
                continue
            found.append(future.result()[0])
            with self._lock:
                self.stats.off_plan += 1
                self.stats.served += 1
                self._consumed_bytes += int(self.sizes[chunk])
        return found

    def _position_ahead(self, chunk: int) -> int | None:
        return next((p for p in self._positions.get(chunk, ()) if p >= self._next), None)

    def close(self) -> None:
        """Stop reading ahead (requests under way finish in their threads)."""
        with self._lock:
            self._drop_pending()
            self._next = len(self._stream)
        # the pool is the process's: cancel this one's queued tasks, wait for those running
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        concurrent.futures.wait(tasks)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a ReadAhead belongs to one process: build one in each worker")
