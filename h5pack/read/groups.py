"""A reader's FIFO window of decompressed chunk groups, and their recycled buffers.

Groups enter in the order a request first names them (a chunk-aware epoch then
decompresses each once); buffers are taken in the calling thread (NOTE [ Direct chunk path ]).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import numpy as np

from h5pack.read.pool import ReadPool
from h5pack.read.stored import Plan, StoredImages

if TYPE_CHECKING:
    from h5pack.read.reader import PackReader

T = TypeVar("T")
R = TypeVar("R")

# Loads group ``g`` whole into a buffer: ``load(g, plan, buffer)`` (checked, errors named).
Load = Callable[[int, Plan, np.ndarray], np.ndarray]


def first_appearance(values: np.ndarray) -> np.ndarray:
    """Return the distinct ``values`` in order of first appearance."""
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)]


class GroupLoad(NamedTuple):
    """A group a reader is about to decompress (``PackReader.pending_loads``)."""

    reader: PackReader
    group: int
    plan: Plan
    buffer: np.ndarray
    threaded: bool  # whether ``run`` may run on another thread (the direct path)

    def run(self) -> np.ndarray:
        """Read and decompress the group (and check it, with ``verify_checksums``)."""
        return self.reader._load_group(self.group, self.plan, self.buffer)


class GroupWindow:
    """The decompressed groups one reader keeps, and the buffers of those that left."""

    def __init__(self, stored: StoredImages, window_chunks: int, threads: int) -> None:
        self.stored = stored
        self.window_chunks = window_chunks
        self.threads = threads
        self.own: ReadPool | None = None  # started on first use
        self.shared: ReadPool | None = None  # threads shared with other readers (use_pool)
        # group -> (its data, the buffer it lives in)
        self.window: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._free: list[np.ndarray] = []
        # groups decompressed ahead for the next read, not yet in the window (``hold``)
        self.held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.loads = 0  # groups decompressed so far (a chunk-aware epoch: once each)

    def pool(self) -> ReadPool:
        """The threads this window's work runs on: the shared pool, else its own."""
        if self.shared is not None:
            return self.shared
        if self.own is None:
            self.own = ReadPool(max(1, self.threads))
        return self.own

    def map(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Return ``[function(item) for item in items]``, on the threads if more than one."""
        return self.pool().map(function, items)

    def use_pool(self, pool: ReadPool | None) -> None:
        """Run on ``pool``'s threads (None: this window's own); see ``PackReader.use_pool``."""
        self.close_threads()
        self.shared = pool
        if pool is not None:
            self.threads = pool.threads

    def close_threads(self) -> None:
        """Stop this window's own threads (a shared pool stays up for its other readers)."""
        if self.own is not None:
            self.own.close()
            self.own = None

    def groups(self, wanted: np.ndarray, load: Load) -> dict[int, np.ndarray]:
        """Return the decompressed data of groups ``wanted``, loading those not in the window."""
        found: dict[int, np.ndarray] = {}
        fresh: list[int] = []  # groups entering the window, in the order wanted
        missing: list[int] = []  # those not held already (``hold``): loaded here
        for g in wanted.tolist():
            if g in self.window:
                found[g] = self.window[g][0]
            else:
                fresh.append(g)
                if g not in self.held:
                    missing.append(g)
        if missing:
            jobs = self._jobs(missing)
            if len(missing) > 1 and self.threads > 1 and self.stored.table is not None:
                # one wait for all, not one per result (Executor.map's): each wake-up of this
                # thread took a core from a decompressing one (docs/decisions/0025)
                futures = [self.pool().executor().submit(load, *job) for job in jobs]
                wait(futures)
                loaded = [future.result() for future in futures]
            else:
                loaded = [load(*job) for job in jobs]
            self.loads += len(missing)
            for (g, _, buffer), block in zip(jobs, loaded, strict=True):
                self.held[g] = (block, buffer)
        for g in fresh:
            found[g] = self.held[g][0]
            self.window[g] = self.held.pop(g)
        while len(self.window) > self.window_chunks:
            _, (_, buffer) = self.window.popitem(last=False)
            self.recycle(buffer)
        return found

    def pending(self, order: np.ndarray) -> list[tuple[int, Plan, np.ndarray]]:
        """Return ``(group, plan, buffer)`` of groups ``order`` not in the window, fetched."""
        for _, buffer in self.held.values():
            self.recycle(buffer)
        self.held.clear()
        return self._jobs([g for g in order.tolist() if g not in self.window])

    def _jobs(self, missing: list[int]) -> list[tuple[int, Plan, np.ndarray]]:
        """Return ``(group, plan, buffer)`` of groups ``missing``, their chunks fetched."""
        plans = [self.stored.plan(g) for g in missing]
        self.stored.fetch(missing, plans)
        return [(g, p, self.take_buffer(p[1])) for g, p in zip(missing, plans, strict=True)]

    def hold(self, group: int, block: np.ndarray, buffer: np.ndarray) -> None:
        """Keep a group loaded ahead (``pending``) for the next read."""
        self.held[group] = (block, buffer)
        self.loads += 1

    def evict(self, group: int) -> None:
        """Drop group ``group`` from the window, if it is there."""
        entry = self.window.pop(group, None)
        if entry is not None:
            self.recycle(entry[1])

    def recycle(self, buffer: np.ndarray) -> None:
        """Keep ``buffer`` for a later load (a few are worth keeping)."""
        if len(self._free) < max(2, self.threads):
            self._free.append(buffer)

    def take_buffer(self, nbytes: int) -> np.ndarray:
        """Return a free buffer of ``nbytes``, or a new one."""
        for i, buffer in enumerate(self._free):
            if buffer.size == nbytes:
                return self._free.pop(i)
        return np.empty(nbytes, dtype=np.uint8)

    def close(self) -> None:
        """Drop every group and stop this window's own threads."""
        self.close_threads()
        self.window.clear()
        self.held.clear()
