"""A decoded-image cache in shared memory, shared by the main process and DataLoader workers.

An encoded pack makes every worker decode every JPEG again each epoch. ``DecodedCache`` keeps
the decoded ``(H, W, C)`` uint8 arrays in one shared block of memory, so from the second epoch
on a sample is a lookup instead of a decode, in whichever process asks for it::

    cache = DecodedCache(len(dataset), default_cache_bytes())
    arr = cache.get(index)              # in any process; None on a miss
    if arr is None:
        arr = decode(jpeg_bytes)
        cache.put(index, arr)           # False when it does not fit, or is already there

The block is ``budget_bytes`` long and holds everything: a header (counters), an index of one
word per sample and the records, appended in arrival order (first come, first kept; no
eviction). A sample that does not fit is not cached and is decoded each epoch.

This module does not import torch, so it stays cheap to import.
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
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt

from h5pack.core.arguments import check_optional_int
from h5pack.core.machine import available_memory_bytes, process_exists
from h5pack.errors import CacheClosedError, H5PackError, OptionsError

DEFAULT_CACHE_FRACTION = 0.25
"""Share of the currently available memory that ``default_cache_bytes`` gives the cache."""

# NOTE [ cache layout ]
#
# One block of int64 words, ``size`` bytes (the budget rounded down to whole pages):
#   header, 4 KiB: magic, version, sizes, the allocation cursor, counters and 128 per-process
#     statistics slots (pid, hits, misses) that only their process writes, without the lock;
#   index, one word per sample: 0 empty, -1 claimed (being written), else the record's offset;
#   records, 64-byte aligned: height, width, channels (0 for a 2-D image), the caller's tag
#     (read.crop's orientation tag, NOTE [ the cache changes no pixel ]); then pixels.
#
# NOTE [ publishing an entry ]
#
# ``put`` claims the index word and moves the cursor under the lock, copies the pixels without
# it, then stores the record's offset in the index word under the lock again. A reader loads
# that one aligned word (a single load, atomic on 64-bit CPUs) and reaches the record through
# it, so its later loads depend on the offset and cannot see older bytes; the writer's stores
# are ordered by the lock's system calls. A reader racing a writer sees 0 or -1: a miss.
# Records are never moved or overwritten, so ``get`` can return a view: it stays valid.
#
# NOTE [ writing pixels ]
#
# On the memfd, ``put`` writes the pixels with ``pwrite``: the kernel allocates and fills the
# new pages, faster than writing through the mapping, where every new page is a
# write fault (fault-around maps 16 pages per fault for reads only; docs/decisions/0025).
# Readers fault the pages in (read faults, 16 pages at a time), once per process.
#
# NOTE [ cache lock ]
#
# POSIX record locks (``fcntl.lockf``) belong to a process, not to a descriptor: a forked
# worker that shares its parent's descriptor is still excluded (``flock`` would not exclude
# it). They do not exclude threads of one process, and closing any descriptor of the file drops
# them, so every cache in a process also takes ``_PROCESS_LOCK``, which is made anew in a
# forked child in case another thread held it at the fork.

_MAGIC = 0x3168_6370_6B35_6468
_VERSION = 1
_HEADER_BYTES = 4096
_ALIGN = 64
_RECORD_WORDS = 4
_CLAIMED = -1
_MAX_SLOTS = 128
_W_MAGIC, _W_VERSION, _W_SAMPLES, _W_SIZE, _W_NEXT, _W_ENTRIES, _W_REJECTED = range(7)
_W_HITS, _W_MISSES = 7, 8  # folded from the slots of processes that exited
_W_SLOTS = 16
_W_INDEX = _HEADER_BYTES // 8
_MEMFD_NAME = "h5pack-cache"
_USE_MEMFD = sys.platform.startswith("linux") and hasattr(os, "memfd_create")

# Reentrant: a finalizer that the garbage collector runs inside a locked section takes it too.
_PROCESS_LOCK = threading.RLock()


def _new_process_lock() -> None:
    global _PROCESS_LOCK
    _PROCESS_LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_process_lock)


@dataclass(frozen=True)
class CacheStats:
    """Counters of one cache, summed over every process that used it.

    Attributes:
        hits: ``get`` calls that found the sample.
        misses: ``get`` calls that did not (a sample being written counts as a miss).
        entries: Samples stored.
        used_bytes: Bytes of the block in use: header, index and records.
        budget_bytes: The budget; ``used_bytes`` never exceeds it.
        rejected: ``put`` calls refused because the sample did not fit.
    """

    hits: int
    misses: int
    entries: int
    used_bytes: int
    budget_bytes: int
    rejected: int


@dataclass(frozen=True)
class _Backing:
    """How a process finds the block; this, not the mapping, is what pickles."""

    owner_pid: int
    size: int
    fd: int = -1  # memfd: the owner's descriptor, opened as /proc/<owner_pid>/fd/<fd>
    device: int = 0
    inode: int = 0
    name: str = ""  # named segment (no memfd): the shared_memory name
    lock_path: str = ""

    @property
    def location(self) -> str:
        return f"/proc/{self.owner_pid}/fd/{self.fd}" if self.fd >= 0 else self.name


class _Attachment:
    """One process's mapping of the block and the descriptor it locks (and writes, a memfd)."""

    def __init__(
        self, block: mmap.mmap | shared_memory.SharedMemory, lock_fd: int, fds: list[int]
    ) -> None:
        # Views of a view of ``shm.buf``: SharedMemory.close can then release ``buf`` itself.
        if isinstance(block, mmap.mmap):
            buffer: mmap.mmap | memoryview = block
        else:
            assert block.buf is not None  # a block just attached is open
            buffer = memoryview(block.buf)
        self.words = memoryview(buffer).cast("B").cast("q")
        self.pixels = np.frombuffer(buffer, dtype=np.uint8)
        self.readonly = np.frombuffer(memoryview(buffer).toreadonly(), dtype=np.uint8)
        self.lock_fd = lock_fd
        self.block = block
        self._fds = fds

    def close(self) -> None:
        """Drop the mapping; a view handed out by ``get`` keeps it until the view is freed."""
        self.words.release()
        self.pixels = self.readonly = np.empty(0, dtype=np.uint8)
        with contextlib.suppress(BufferError):  # else unmapped when the last view goes
            self.block.close()
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def write(self, start: int, array: npt.NDArray[np.uint8]) -> None:
        """Copy ``array``'s pixels to byte ``start`` of the block (see "writing pixels")."""
        if not isinstance(self.block, mmap.mmap):
            self.pixels[start : start + array.size].reshape(array.shape)[...] = array
            return
        data = np.ascontiguousarray(array).reshape(-1).data
        done = 0
        while done < len(data):
            done += os.pwrite(self.lock_fd, data[done:], start + done)


def _create(size: int) -> tuple[_Backing, _Attachment]:
    pid = os.getpid()
    if _USE_MEMFD:
        fd = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)  # pages are allocated when first written
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        st = os.fstat(fd)
        backing = _Backing(pid, size, fd=fd, device=st.st_dev, inode=st.st_ino)
        return backing, _Attachment(mmap.mmap(fd, size), fd, [fd])
    shm = shared_memory.SharedMemory(create=True, size=size)
    lock_fd, lock_path = tempfile.mkstemp(prefix=f"h5pack-cache-{shm.name.lstrip('/')}-")
    backing = _Backing(pid, size, name=shm.name, lock_path=lock_path)
    return backing, _Attachment(shm, lock_fd, [lock_fd])


def _attach(backing: _Backing) -> _Attachment:
    closed = CacheClosedError(
        f"the cache's memory {backing.location} should be open, but its owner"
        f" (pid {backing.owner_pid}) closed it or exited"
    )
    try:
        if backing.fd >= 0:
            fd = os.open(backing.location, os.O_RDWR | os.O_CLOEXEC)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (backing.device, backing.inode):
                os.close(fd)  # the owner closed the cache and reused the descriptor number
                raise closed
            return _Attachment(mmap.mmap(fd, backing.size), fd, [fd])
        # Registers the name with the resource tracker, which DataLoader workers share with
        # their parent: a no-op there, undone by the owner's unlink.
        shm = shared_memory.SharedMemory(name=backing.name)
        lock_fd = os.open(backing.lock_path, os.O_RDWR | os.O_CLOEXEC)
    except (FileNotFoundError, PermissionError) as err:
        raise closed from err
    return _Attachment(shm, lock_fd, [lock_fd])


def _release(attachment: _Attachment, backing: _Backing, unlink: bool) -> None:
    """Close one process's attachment; in the owner, also remove any name (the finalizer)."""
    with _PROCESS_LOCK:
        attachment.close()
    block = attachment.block
    if (
        unlink
        and os.getpid() == backing.owner_pid
        and isinstance(block, shared_memory.SharedMemory)
    ):
        block.unlink()
        Path(backing.lock_path).unlink(missing_ok=True)


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
    """Return ``array`` resized so that its shorter side is at most ``max_side``.

    The aspect ratio is kept (sides rounded) and the resize is antialiased
    (``cv2.INTER_AREA``); an image already small enough is returned as it is.

    Args:
        array: ``(H, W)`` or ``(H, W, C)`` uint8 image.
        max_side: The longest the shorter side may be.

    Returns:
        The image, shrunk if it was larger.
    """
    height, width = array.shape[:2]
    new_h, new_w = shrunk_size(height, width, max_side)
    if (new_h, new_w) == (height, width):
        return array
    import cv2  # here: only max_side needs it, and the module stays cheap to import

    source = np.ascontiguousarray(array)
    resized = cv2.resize(source, (new_w, new_h), interpolation=cv2.INTER_AREA)
    return np.asarray(resized, dtype=np.uint8).reshape(new_h, new_w, *array.shape[2:])


def shrunk_size(height: int, width: int, max_side: int | None) -> tuple[int, int]:
    """Return the ``(H, W)`` that ``shrink`` gives an image of ``(height, width)``.

    Args:
        height: The image's height.
        width: The image's width.
        max_side: The longest the shorter side may be; None keeps the size.

    Returns:
        The size, unchanged when the shorter side is at most ``max_side``.
    """
    if max_side is None or min(height, width) <= max_side:
        return height, width
    scale = max_side / min(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def _available_bytes() -> int:
    available = available_memory_bytes()  # core.machine: the one probe, cgroups included
    if available is None:
        raise H5PackError("the available memory is unknown here: install psutil")
    return available


def default_cache_bytes(*, fraction: float = DEFAULT_CACHE_FRACTION) -> int:
    """Return a budget for ``DecodedCache``: ``fraction`` of the memory available now.

    A quarter by default: the cache's pages cannot be dropped like page cache, and the rest
    must hold the pack's own page cache (encoded bytes are read every epoch), the workers'
    prefetched batches and the training process. The available memory is psutil's
    (MemAvailable on Linux), capped by the cgroup v2 limit less current use, if any.

    Args:
        fraction: Share of the available memory, in (0, 1].

    Returns:
        The budget in bytes.

    Raises:
        OptionsError: ``fraction`` is out of range.
    """
    if not 0 < fraction <= 1:
        raise OptionsError(f"fraction should be in (0, 1], but got fraction={fraction}")
    return int(_available_bytes() * fraction)


def min_cache_bytes(num_samples: int) -> int:
    """Return the least budget a ``DecodedCache`` of ``num_samples`` takes: header and index."""
    data_start = _aligned(_HEADER_BYTES + 8 * num_samples)
    return -(-data_start // mmap.PAGESIZE) * mmap.PAGESIZE


@dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """The decoded cache a loader shares across its processes: ``make_loader(cache=...)``.

    ``make_loader(cache="decoded", cache_bytes=..., cache_max_side=...)`` builds this spec
    (the keywords are its fields, under the same names); ``H5ImageDataset(cache=spec)``
    builds the ``DecodedCache`` from it in the main process, for encoded packs read
    through the training image pipeline (a crop or resize).

    Attributes:
        cache_bytes: Budget of the decoded cache, never exceeded; None:
            ``default_cache_bytes()`` (a fraction of the memory available when it is built).
        cache_max_side: Shrink images so their shorter side is at most this before caching
            (more fit; every sample is then cut from the shrunk image); None keeps them whole.

    Raises:
        OptionsError: a field is not a positive integer (the message names the field).

    Example:
        >>> CacheSpec(cache_bytes=1 << 30).cache_max_side is None
        True
    """

    cache_bytes: int | None = None
    cache_max_side: int | None = None

    def __post_init__(self) -> None:
        check_optional_int("cache_bytes", self.cache_bytes, minimum=1)
        check_optional_int("cache_max_side", self.cache_max_side, minimum=1)

    def build(self, num_samples: int) -> DecodedCache:
        """Return the cache for a dataset of ``num_samples`` (in this, the main, process).

        Raises:
            OptionsError: ``cache_bytes`` cannot hold the cache's header and index.
        """
        num_samples = max(1, num_samples)
        budget = default_cache_bytes() if self.cache_bytes is None else self.cache_bytes
        least = min_cache_bytes(num_samples)
        if budget < least:
            raise OptionsError(
                f"cache_bytes should be at least {least} (the header and index of "
                f"{num_samples} samples, in whole pages), but got cache_bytes={budget}"
            )
        return DecodedCache(num_samples, budget, max_side=self.cache_max_side)


class DecodedCache:
    """Decoded images in shared memory, under a byte budget, for every process of a loader.

    Create it in the main process and give it to the dataset: it pickles (``fork``,
    ``spawn``, ``forkserver``; persistent workers or not) and attaches lazily once per process.
    On Linux the block is an anonymous ``memfd`` that other processes open through
    ``/proc/<owner pid>/fd/<fd>``: it has no name, so it cannot be left behind, even when the
    owner is killed (the memory goes when the last worker exits), and it does not live in
    ``/dev/shm`` (a container's 64 MiB limit there does not apply). Elsewhere (macOS) it is a
    named ``multiprocessing.shared_memory`` segment plus a lock file, removed by ``close`` or
    the finalizer; if the owner is killed (``kill -9``) the segment is left to the resource
    tracker and the empty lock file stays in the temporary directory.

    Entries are never evicted or moved: the first samples to arrive are kept. ``get`` returns
    a read-only view into the shared block, valid for as long as it is referenced (even after
    ``close``); crop or resize from it, and copy before writing into it or handing it to
    ``torch.from_numpy`` (which warns on a read-only array).

    Args:
        num_samples: Samples in the dataset; indices are ``0 .. num_samples - 1``.
        budget_bytes: Size of the block, header and index included; never exceeded. Memory is
            used only as entries are written.
        max_side: Shrink each image before storing it so that its shorter side is at most
            this (see ``shrink``): more images fit, and ``get`` returns the shrunk image.

    Raises:
        OptionsError: a size is out of range, or the budget cannot hold the index.

    Example:
        >>> cache = DecodedCache(10, 1 << 20)
        >>> cache.put(3, np.zeros((4, 5, 3), dtype=np.uint8))
        True
        >>> cache.get(3).shape, cache.get(4)
        ((4, 5, 3), None)
        >>> cache.close()
    """

    def __init__(self, num_samples: int, budget_bytes: int, *, max_side: int | None = None):
        if num_samples < 1:
            raise OptionsError(f"num_samples should be >= 1, but got num_samples={num_samples}")
        if max_side is not None and max_side < 1:
            raise OptionsError(f"max_side should be >= 1 or None, but got max_side={max_side}")
        data_start = _aligned(_HEADER_BYTES + 8 * num_samples)
        size = budget_bytes // mmap.PAGESIZE * mmap.PAGESIZE
        if size < data_start:
            raise OptionsError(
                f"budget_bytes should be at least {data_start} (header and index of"
                f" {num_samples} samples, in whole pages), but got budget_bytes={budget_bytes}"
            )
        self.num_samples = num_samples
        self.budget_bytes = budget_bytes
        self.max_side = max_side
        self._closed = False
        self._backing, attachment = _create(size)
        words = attachment.words
        words[_W_MAGIC], words[_W_VERSION], words[_W_SAMPLES] = _MAGIC, _VERSION, num_samples
        words[_W_SIZE], words[_W_NEXT] = size, data_start
        self._adopt(attachment)
        # Forked workers inherit this finalizer too; it unlinks only in the owner.
        self._finalizer = weakref.finalize(self, _release, attachment, self._backing, True)

    # -- process-local state ---------------------------------------------------------------
    def _adopt(self, attachment: _Attachment) -> None:
        self._attachment: _Attachment | None = attachment
        self._pid = os.getpid()
        with _Locked(attachment.lock_fd):
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
        state = self.__dict__.copy()
        for key in ("_attachment", "_finalizer", "_pid", "_slot"):
            del state[key]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._attachment = None
        self._pid = self._slot = -1

    # -- public API ----------------------------------------------------------------------
    @property
    def location(self) -> str:
        """Where processes open the block: ``/proc/<pid>/fd/<fd>``, or the segment's name."""
        return self._backing.location

    def get(self, index: SupportsIndex) -> npt.NDArray[np.uint8] | None:
        """Return sample ``index`` as a read-only view into the shared block, or None.

        Args:
            index: The sample.

        Returns:
            The ``(H, W, C)`` (or ``(H, W)``) uint8 image as it was put (shrunk with
            ``max_side``), read-only; None when it is not stored, or is being stored.

        Raises:
            IndexError: ``index`` is out of range.
            CacheClosedError: the cache was closed.
        """
        found = self.entry(index)
        return None if found is None else found[0]

    def entry(self, index: SupportsIndex) -> tuple[npt.NDArray[np.uint8], int] | None:
        """Return sample ``index`` and the tag it was put with, or None (as :meth:`get`).

        Raises:
            IndexError: ``index`` is out of range.
            CacheClosedError: the cache was closed.
        """
        attachment = self._attached()
        position = self._check(index)
        words = attachment.words
        offset = words[_W_INDEX + position]  # see the note "publishing an entry"
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
        """Store ``array`` (shrunk first with ``max_side``) as sample ``index``.

        Args:
            index: The sample.
            array: ``(H, W)`` or ``(H, W, C)`` uint8 image, any strides.
            tag: A small integer kept with the entry (:meth:`entry` returns it).

        Returns:
            True when stored; False when it does not fit in the budget, or the sample is
            already stored or being stored by another process.

        Raises:
            IndexError: ``index`` is out of range.
            OptionsError: ``array`` is not a 2-D or 3-D uint8 array.
            CacheClosedError: the cache was closed.
        """
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
        with _Locked(attachment.lock_fd):  # claim the index word and the space
            offset = words[_W_NEXT]
            end = offset + _aligned(8 * _RECORD_WORDS + array.size)
            if words[_W_INDEX + position] != 0:
                return False
            if end > words[_W_SIZE]:
                words[_W_REJECTED] += 1
                return False
            words[_W_INDEX + position], words[_W_NEXT] = _CLAIMED, end
        published = 0
        try:
            attachment.write(offset + 8 * _RECORD_WORDS, array)
            record = offset // 8
            words[record], words[record + 1] = array.shape[0], array.shape[1]
            words[record + 2] = array.shape[2] if array.ndim == 3 else 0
            words[record + 3] = tag
            published = offset
        finally:  # on an error the sample is unclaimed again and its space is lost
            with _Locked(attachment.lock_fd):
                words[_W_INDEX + position] = published
                words[_W_ENTRIES] += published > 0
        return True

    def has_room(self, nbytes: int) -> bool:
        """Whether an image of ``nbytes`` pixel bytes would fit now (a hint, without the lock).

        The space only shrinks (entries are never evicted), so False stays False; True may
        be overtaken by another process's ``put``.

        Raises:
            CacheClosedError: the cache was closed.
        """
        words = self._attached().words
        return words[_W_NEXT] + _aligned(8 * _RECORD_WORDS + nbytes) <= words[_W_SIZE]

    def stats(self) -> CacheStats:
        """Return the counters, summed over every process (see ``CacheStats``)."""
        attachment = self._attached()
        words = attachment.words
        with _Locked(attachment.lock_fd):
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
        """Detach this process; in the owner, free the block once no process maps it.

        Later calls raise ``CacheClosedError``; views from ``get`` stay valid. Closing twice
        is allowed. The finalizer does the same when the cache is garbage-collected.
        """
        self._closed = True
        self._attachment = None
        if hasattr(self, "_finalizer"):
            self._finalizer()

    def __enter__(self) -> DecodedCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.location
        return (
            f"DecodedCache(num_samples={self.num_samples},"
            f" budget_bytes={self.budget_bytes}, {state})"
        )

    # -- helpers -------------------------------------------------------------------------
    def _check(self, index: SupportsIndex) -> int:
        position = operator.index(index)
        if not 0 <= position < self.num_samples:
            raise IndexError(
                f"index should be in [0, {self.num_samples}), but got index={position}"
            )
        return position

    def _count(self, attachment: _Attachment, word: int) -> None:
        """Add one hit (``word`` 1) or miss (2) to this process's slot."""
        if self._slot >= 0:
            with _PROCESS_LOCK:
                attachment.words[self._slot + word] += 1
        else:  # more than _MAX_SLOTS live processes: the shared counters, under the lock
            with _Locked(attachment.lock_fd):
                attachment.words[_W_HITS + word - 1] += 1


class _Locked:
    """The cache lock, as a context manager (see the note "cache lock")."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        _PROCESS_LOCK.acquire()
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
        except BaseException:
            _PROCESS_LOCK.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        finally:
            _PROCESS_LOCK.release()
