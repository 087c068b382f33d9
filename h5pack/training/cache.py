"""Decoded images in one block of shared memory, for the main process and DataLoader workers.

From the second epoch on a sample is a lookup instead of a decode: ``cache.get(index)`` (None
on a miss), then ``cache.put(index, decoded)``. First come, first kept; no torch imported.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import operator
import os
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt

from h5pack.core.arguments import check_int, check_optional_int
from h5pack.core.machine import available_memory_bytes, process_exists
from h5pack.errors import CacheClosedError, H5PackError, OptionsError

DEFAULT_CACHE_FRACTION = 0.25  # default_cache_bytes's share of the available memory

# NOTE [ cache layout ]: int64 words. A 4 KiB header (sizes, the allocation cursor, counters
# and 128 per-process statistics slots (pid, hits, misses), each written by its process only,
# without the lock); one index word per sample (0 empty, -1 claimed, else the record's offset);
# 64-byte aligned records: height, width, channels (0: 2-D), the caller's tag, pixels. ``put``
# claims the word and the space under the lock, writes the pixels without it (``pwrite``:
# docs/decisions/0025) and publishes the offset under the lock: a racing reader loads 0 or -1,
# a miss. Records never move, so ``get`` returns a view. The lock is ``fcntl.lockf`` (per
# process) plus ``_PROCESS_LOCK`` for threads, made anew in a forked child.

_HEADER_BYTES = 4096
_ALIGN = 64
_RECORD_WORDS = 4
_MAX_SLOTS = 128
_W_SIZE, _W_NEXT, _W_ENTRIES, _W_REJECTED = range(3, 7)
_W_HITS, _W_MISSES = 7, 8  # folded from the slots of processes that exited
_W_SLOTS = 16
_W_INDEX = _HEADER_BYTES // 8
_USE_MEMFD = sys.platform.startswith("linux") and hasattr(os, "memfd_create")

# Reentrant: a finalizer that the garbage collector runs inside a locked section takes it too.
_PROCESS_LOCK = threading.RLock()


def _new_process_lock() -> None:
    global _PROCESS_LOCK
    _PROCESS_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_process_lock)


@dataclass(frozen=True)
class CacheStats:
    """A cache's counters, summed over its processes (``rejected``: puts that did not fit)."""

    hits: int
    misses: int
    entries: int
    used_bytes: int
    budget_bytes: int
    rejected: int


@dataclass(frozen=True)
class _Backing:
    """How a process finds the block (a memfd's /proc path, or a file): what pickles."""

    owner_pid: int
    size: int
    location: str
    identity: tuple[int, int]  # (st_dev, st_ino): not another file at the same path


class _Attachment:
    """One process's mapping of the block, and its descriptor (locked and written)."""

    def __init__(self, fd: int, size: int) -> None:
        self.block = mmap.mmap(fd, size)
        self.words = memoryview(self.block).cast("B").cast("q")
        self.readonly = np.frombuffer(memoryview(self.block).toreadonly(), dtype=np.uint8)
        self.lock_fd = fd

    def close(self) -> None:
        """Drop the mapping; a view handed out by ``get`` keeps it until the view is freed."""
        self.words.release()
        self.readonly = np.empty(0, dtype=np.uint8)
        with contextlib.suppress(BufferError):  # else unmapped when the last view goes
            self.block.close()
        os.close(self.lock_fd)

    def write(self, start: int, array: npt.NDArray[np.uint8]) -> None:
        data = np.ascontiguousarray(array).reshape(-1).data
        done = 0
        while done < len(data):
            done += os.pwrite(self.lock_fd, data[done:], start + done)


def _create(size: int) -> tuple[_Backing, _Attachment]:
    if _USE_MEMFD:
        fd = os.memfd_create("h5pack-cache", os.MFD_CLOEXEC)
        location = f"/proc/{os.getpid()}/fd/{fd}"
    else:
        fd, location = tempfile.mkstemp(prefix="h5pack-cache-")
    os.ftruncate(fd, size)  # pages are allocated when first written
    st = os.fstat(fd)
    return _Backing(os.getpid(), size, location, (st.st_dev, st.st_ino)), _Attachment(fd, size)


def _attach(backing: _Backing) -> _Attachment:
    try:
        fd = os.open(backing.location, os.O_RDWR | os.O_CLOEXEC)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == backing.identity:
            return _Attachment(fd, backing.size)
        os.close(fd)  # the owner closed the cache and its descriptor number was reused
    except (FileNotFoundError, PermissionError):
        pass
    raise CacheClosedError(
        f"the cache's memory {backing.location} should be open, but its owner"
        f" (pid {backing.owner_pid}) closed it or exited"
    )


def _release(attachment: _Attachment, backing: _Backing, unlink: bool) -> None:
    """Close one process's attachment; in the owner, also remove a file (the finalizer)."""
    with _PROCESS_LOCK:
        attachment.close()
    if unlink and os.getpid() == backing.owner_pid and not backing.location.startswith("/proc/"):
        Path(backing.location).unlink(missing_ok=True)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _claim_slot(words: memoryview, pid: int) -> int:
    """Return the first word of this process's statistics slot, or -1 (call under the lock)."""
    slots = range(_W_SLOTS, _W_SLOTS + 3 * _MAX_SLOTS, 3)
    for retire_dead in (False, True):
        for slot in slots:
            owner = words[slot]
            if retire_dead and owner != 0 and not process_exists(owner):  # fold its counts
                words[_W_HITS] += words[slot + 1]
                words[_W_MISSES] += words[slot + 2]
                words[slot + 1] = words[slot + 2] = owner = 0
            if owner in (0, pid):
                words[slot] = pid
                return slot
    return -1


def shrink(array: npt.NDArray[np.uint8], max_side: int) -> npt.NDArray[np.uint8]:
    """Return ``array`` resized (``cv2.INTER_AREA``) so its shorter side is at most ``max_side``."""
    height, width = array.shape[:2]
    if min(height, width) <= max_side:
        return array
    scale = max_side / min(height, width)
    new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
    import cv2  # here: only max_side needs it, and the module stays cheap to import

    resized = cv2.resize(np.ascontiguousarray(array), (new_w, new_h), interpolation=cv2.INTER_AREA)
    return np.asarray(resized, dtype=np.uint8).reshape(new_h, new_w, *array.shape[2:])


def default_cache_bytes(*, fraction: float = DEFAULT_CACHE_FRACTION) -> int:
    """Return ``fraction`` of the memory available now (psutil's, capped by cgroup v2)."""
    if not 0 < fraction <= 1:
        raise OptionsError(f"fraction should be in (0, 1], but got fraction={fraction}")
    available = available_memory_bytes()
    if available is None:
        raise H5PackError("the available memory is unknown here: install psutil")
    return int(available * fraction)


def _check_budget(name: str, budget: int, num_samples: int) -> None:
    least = -(-_aligned(_HEADER_BYTES + 8 * num_samples) // mmap.PAGESIZE) * mmap.PAGESIZE
    if budget < least:
        raise OptionsError(
            f"{name} should be at least {least} (the header and index of {num_samples}"
            f" samples, in whole pages), but got {name}={budget}"
        )


@dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """``make_loader(cache=...)``: the ``DecodedCache`` a dataset builds in the main process.

    ``cache_bytes``: the budget (None: ``default_cache_bytes()``); ``cache_max_side``: shrink
    images to this shorter side before caching (``DecodedCache(max_side=...)``).
    """

    cache_bytes: int | None = None
    cache_max_side: int | None = None

    def __post_init__(self) -> None:
        check_optional_int("cache_bytes", self.cache_bytes, minimum=1)
        check_optional_int("cache_max_side", self.cache_max_side, minimum=1)

    def build(self, num_samples: int) -> DecodedCache:
        """Return the cache for a dataset of ``num_samples`` (in this, the main, process)."""
        num_samples = max(1, num_samples)
        budget = default_cache_bytes() if self.cache_bytes is None else self.cache_bytes
        _check_budget("cache_bytes", budget, num_samples)
        return DecodedCache(num_samples, budget, max_side=self.cache_max_side)


class DecodedCache:
    """Decoded images in shared memory, under a byte budget, for every process of a loader.

    Made in the main process, it pickles (any start method) and attaches once per process.
    On Linux the block is an anonymous ``memfd`` opened through ``/proc/<pid>/fd/<fd>``:
    nothing is left behind even when the owner is killed, and ``/dev/shm`` limits do not
    apply; elsewhere a temporary file mapped shared, removed by ``close``. ``budget_bytes``
    (header and index included) is never exceeded; ``max_side`` shrinks each image before
    storing it (``shrink``), so more fit.
    """

    def __init__(self, num_samples: int, budget_bytes: int, *, max_side: int | None = None):
        self.num_samples = check_int("num_samples", num_samples, minimum=1)
        self.max_side = check_optional_int("max_side", max_side, minimum=1)
        _check_budget("budget_bytes", budget_bytes, num_samples)
        data_start = _aligned(_HEADER_BYTES + 8 * num_samples)
        size = budget_bytes // mmap.PAGESIZE * mmap.PAGESIZE
        self.budget_bytes = budget_bytes
        self._closed = False
        self._backing, attachment = _create(size)
        attachment.words[_W_SIZE], attachment.words[_W_NEXT] = size, data_start
        self._adopt(attachment)
        # Forked workers inherit this finalizer too; it unlinks only in the owner.
        self._finalizer = weakref.finalize(self, _release, attachment, self._backing, True)

    def _adopt(self, attachment: _Attachment) -> None:
        self._attachment: _Attachment | None = attachment
        self._pid = os.getpid()
        with _locked(attachment.lock_fd):
            self._slot = _claim_slot(attachment.words, self._pid)

    def _attached(self) -> _Attachment:
        attachment = self._attachment
        if attachment is not None and self._pid == os.getpid():
            return attachment
        with _PROCESS_LOCK:  # first use in this process: attach once, whatever the threads
            attachment = self._attachment
            if attachment is not None and self._pid == os.getpid():
                return attachment
            if self._closed:
                raise CacheClosedError("the cache should be open, but it was closed")
            if attachment is None:  # unpickled: open the block (a forked child inherits it)
                attachment = _attach(self._backing)
                self._finalizer = weakref.finalize(self, _release, attachment, self._backing, False)
            self._adopt(attachment)
            return attachment

    def __getstate__(self) -> dict[str, Any]:
        if self._closed:
            raise CacheClosedError("the cache should be open to be pickled, but it was closed")
        local = ("_attachment", "_finalizer", "_pid", "_slot")
        return {key: value for key, value in self.__dict__.items() if key not in local}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._attachment = None
        self._pid = self._slot = -1

    @property
    def location(self) -> str:
        """Where processes open the block: ``/proc/<pid>/fd/<fd>``, or a file."""
        return self._backing.location

    def get(self, index: SupportsIndex) -> npt.NDArray[np.uint8] | None:
        """Return sample ``index`` as a read-only view, or None when it is not (yet) stored."""
        found = self.entry(index)
        return None if found is None else found[0]

    def entry(self, index: SupportsIndex) -> tuple[npt.NDArray[np.uint8], int] | None:
        """Return sample ``index`` and the tag it was put with, or None (as :meth:`get`)."""
        attachment = self._attached()
        position = self._check(index)
        words = attachment.words
        offset = words[_W_INDEX + position]  # see the note "cache layout"
        self._count(attachment, 1 if offset > 0 else 2)
        if offset <= 0:
            return None
        record = offset // 8
        height, width, channels = words[record], words[record + 1], words[record + 2]
        start = offset + 8 * _RECORD_WORDS
        shape = (height, width, channels) if channels else (height, width)
        pixels = attachment.readonly[start : start + height * width * max(channels, 1)]
        return pixels.reshape(shape), int(words[record + 3])

    def put(self, index: SupportsIndex, array: npt.NDArray[np.uint8], *, tag: int = 0) -> bool:
        """Store a 2-D or 3-D uint8 image as sample ``index``; False if full or already there."""
        attachment = self._attached()
        position = self._check(index)
        if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim not in (2, 3):
            raise OptionsError(
                "array should be a 2-D or 3-D uint8 array, but got array="
                f"{type(array).__name__}{getattr(array, 'shape', '')} of"
                f" {getattr(array, 'dtype', '?')}"
            )
        words = attachment.words
        if words[_W_INDEX + position] != 0:  # stored already: spare the shrink (checked again)
            return False
        if self.max_side is not None:
            array = shrink(array, self.max_side)
        with _locked(attachment.lock_fd):  # claim the index word and the space
            offset = words[_W_NEXT]
            end = offset + _aligned(8 * _RECORD_WORDS + array.size)
            if words[_W_INDEX + position] != 0:
                return False
            if end > words[_W_SIZE]:
                words[_W_REJECTED] += 1
                return False
            words[_W_INDEX + position], words[_W_NEXT] = -1, end  # claimed
        published = 0
        try:
            attachment.write(offset + 8 * _RECORD_WORDS, array)
            record = offset // 8
            words[record], words[record + 1] = array.shape[0], array.shape[1]
            words[record + 2] = array.shape[2] if array.ndim == 3 else 0
            words[record + 3] = tag
            published = offset
        finally:  # on an error the sample is unclaimed again and its space is lost
            with _locked(attachment.lock_fd):
                words[_W_INDEX + position] = published
                words[_W_ENTRIES] += published > 0
        return True

    def has_room(self, nbytes: int) -> bool:
        """Whether an image of ``nbytes`` pixel bytes would fit now (a hint: False stays False)."""
        words = self._attached().words
        return words[_W_NEXT] + _aligned(8 * _RECORD_WORDS + nbytes) <= words[_W_SIZE]

    def stats(self) -> CacheStats:
        """Return the counters, summed over every process (see ``CacheStats``)."""
        attachment = self._attached()
        words = attachment.words
        with _locked(attachment.lock_fd):
            slots = words[_W_SLOTS : _W_SLOTS + 3 * _MAX_SLOTS].tolist()
            return CacheStats(
                hits=words[_W_HITS] + sum(slots[1::3]),
                misses=words[_W_MISSES] + sum(slots[2::3]),
                entries=words[_W_ENTRIES],
                used_bytes=words[_W_NEXT],
                budget_bytes=self.budget_bytes,
                rejected=words[_W_REJECTED],
            )

    def close(self) -> None:
        """Detach this process; in the owner, free the block once no process maps it."""
        self._closed = True
        self._attachment = None
        if hasattr(self, "_finalizer"):
            self._finalizer()

    def __enter__(self) -> DecodedCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "closed" if self._closed else self.location
        return f"DecodedCache({self.num_samples} samples, {self.budget_bytes} bytes, {where})"

    def _check(self, index: SupportsIndex) -> int:
        position = operator.index(index)
        if not 0 <= position < self.num_samples:
            raise IndexError(
                f"index should be in [0, {self.num_samples}), but got index={position}"
            )
        return position

    def _count(self, attachment: _Attachment, word: int) -> None:
        """Count a hit (``word`` 1) or miss (2): in this process's slot, else under the lock."""
        slot = self._slot
        with _PROCESS_LOCK if slot >= 0 else _locked(attachment.lock_fd):
            attachment.words[slot + word if slot >= 0 else _W_HITS + word - 1] += 1


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    """The cache lock: ``_PROCESS_LOCK``, then ``fcntl.lockf`` on the block's descriptor."""
    with _PROCESS_LOCK:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
