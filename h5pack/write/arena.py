"""Shared memory cut into slots: how the conversion's workers and parent trade big arrays.

Decoded pixels and chunks are megabytes each; sent through a pipe they are pickled,
copied through the kernel and unpickled, which measured 200-300 MB/s here, well below the
decoders' output (docs/ARCHITECTURE.md, "Conversion pipeline"). Through a slot of shared
memory they cost one ``memcpy`` on each side. A slot belongs to one task at a time: the
parent acquires it when it submits the task and releases it when it has copied the result
out.

NOTE [ Memory that cannot leak ]: on Linux the block is an anonymous ``memfd``: it has no
name, so nothing is left when the conversion is killed, SIGKILL included (named POSIX
segments stayed in ``/dev/shm`` until reboot: the resource tracker that would remove them
dies with the process group). Workers open it through ``/proc/<parent pid>/fd/<fd>`` (the
pool is started before the arena exists, so they cannot inherit it), checking its inode,
and map it. Where that is impossible (no memfd, or a worker may not open the parent's
descriptors), ``convert`` falls back to a named segment whose name holds its owner's pid
and start time and which its owner keeps locked, so that the next conversion can remove
it if the owner is killed (``leftovers``).

NOTE [ Views of shared memory ]: the parent never keeps a numpy view of the block (a
live view makes closing it fail); it copies in and out inside ``put``, ``take`` and
``view``. Workers keep their views: they never close the block and end with the pool.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from h5pack.write.leftovers import SEGMENT_DIR, lock_segment, segment_name

# Start no named segment bigger than this share of /dev/shm's free space (containers often
# have 64 MiB there); without an arena, results travel through the pipe instead.
_SHM_SHARE = 0.5

_USE_MEMFD = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
_MEMFD_NAME = "h5pack-arena"


@dataclass(frozen=True)
class SlotRef:
    """Where a task's slot lies: the block, a byte offset and size.

    ``name`` is ``/proc/<pid>/fd/<fd>`` for a memfd (``inode`` tells it from a later file
    under the same descriptor number) or a shared-memory segment's name.
    """

    name: str
    offset: int
    nbytes: int
    inode: int = 0


class Arena:
    """Parent side: a block of shared memory of ``num_slots`` slots of ``slot_bytes``.

    Args:
        num_slots: Slots in the block.
        slot_bytes: Bytes of one slot.
        anonymous: An anonymous memfd (Linux); else a named segment.

    Raises:
        OSError: the block cannot be created.
    """

    def __init__(self, num_slots: int, slot_bytes: int, *, anonymous: bool = _USE_MEMFD) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.anonymous = anonymous
        size = max(1, num_slots * slot_bytes)
        self._shm: shared_memory.SharedMemory | None = None
        self._map: mmap.mmap | None = None
        self._fd = -1  # the memfd, or the descriptor holding a named segment's lock
        if anonymous:
            self._fd = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC)
            try:
                os.ftruncate(self._fd, size)
                self._map = mmap.mmap(self._fd, size)
            except OSError:
                os.close(self._fd)
                raise
            self.name = f"/proc/{os.getpid()}/fd/{self._fd}"
            self.inode = os.fstat(self._fd).st_ino
            self._buffer = memoryview(self._map)
        else:
            # Workers share the parent's resource tracker (pipeline.make_executor).
            resource_tracker.ensure_running()
            self._shm = shared_memory.SharedMemory(create=True, size=size, name=segment_name())
            self.name = self._shm.name
            self.inode = 0
            lock = lock_segment(self.name.lstrip("/"))
            self._fd = -1 if lock is None else lock
            buffer = self._shm.buf
            assert buffer is not None
            self._buffer = buffer
        self._free = list(range(num_slots - 1, -1, -1))

    @classmethod
    def maybe(cls, num_slots: int, slot_bytes: int) -> Arena | None:
        """Return an arena, or None when shared memory is short or unavailable."""
        return _maybe(num_slots, slot_bytes, anonymous=_USE_MEMFD)

    @classmethod
    def named(cls, num_slots: int, slot_bytes: int) -> Arena | None:
        """Return an arena in a named segment (workers cannot open a memfd), or None."""
        return _maybe(num_slots, slot_bytes, anonymous=False)

    def acquire(self) -> int:
        """Take a free slot."""
        if not self._free:
            raise RuntimeError("no free slot: more tasks in flight than slots")
        return self._free.pop()

    def release(self, slot: int) -> None:
        """Give a slot back."""
        self._free.append(slot)

    def ref(self, slot: int) -> SlotRef:
        """Return the picklable reference of a slot, for a task."""
        return SlotRef(self.name, slot * self.slot_bytes, self.slot_bytes, self.inode)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` fit one slot."""
        return nbytes <= self.slot_bytes

    def put(self, slot: int, data: np.ndarray) -> None:
        """Copy ``data`` (C-contiguous) to the start of a slot."""
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        with self.view(slot, 0, flat.size) as target:
            target[:] = flat.data

    def take(self, slot: int, offset: int, nbytes: int) -> np.ndarray:
        """Return a copy of ``nbytes`` at ``offset`` within a slot."""
        out = np.empty(nbytes, dtype=np.uint8)
        with self.view(slot, offset, nbytes) as source:
            out.data.cast("B")[:] = source
        return out

    @contextlib.contextmanager
    def view(self, slot: int, offset: int, nbytes: int) -> Iterator[memoryview]:
        """Lend a memoryview of ``nbytes`` at ``offset`` within a slot, released on exit."""
        if offset < 0 or offset + nbytes > self.slot_bytes:
            raise ValueError(f"{nbytes} bytes at {offset} do not fit a slot of {self.slot_bytes}")
        start = slot * self.slot_bytes + offset
        with self._buffer[start : start + nbytes] as view:
            yield view

    def close(self) -> None:
        """Unmap the block and remove its name, if any (never raises)."""
        # A view kept alive by a traceback makes unmapping fail: the memory then goes with
        # the last view. A memfd's pages go with its last descriptor and mapping.
        with contextlib.suppress(BufferError):
            self._buffer.release()
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
        if self._shm is not None:
            with contextlib.suppress(BufferError):
                self._shm.close()
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _maybe(num_slots: int, slot_bytes: int, *, anonymous: bool) -> Arena | None:
    if not anonymous and SEGMENT_DIR.is_dir():
        free = shutil.disk_usage(SEGMENT_DIR).free
        if num_slots * slot_bytes > _SHM_SHARE * free:
            return None
    try:
        return Arena(num_slots, slot_bytes, anonymous=anonymous)
    except OSError:
        return None


# -- worker side ------------------------------------------------------------------------

_ATTACHED: dict[tuple[str, int], tuple[object, np.ndarray]] = {}


def slot_array(ref: SlotRef) -> np.ndarray:
    """Return this process's uint8 view of a slot (workers only, see the NOTE above).

    Raises:
        OSError: the block cannot be opened (its owner closed it, or may not be opened).
    """
    key = (ref.name, ref.inode)
    entry = _ATTACHED.get(key)
    if entry is None:
        entry = _attach(ref)
        _ATTACHED[key] = entry
    return entry[1][ref.offset : ref.offset + ref.nbytes]


def _attach(ref: SlotRef) -> tuple[object, np.ndarray]:
    if not ref.name.startswith("/proc/"):
        segment = shared_memory.SharedMemory(name=ref.name)
        return segment, np.ndarray((segment.size,), dtype=np.uint8, buffer=segment.buf)
    fd = os.open(ref.name, os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_ino != ref.inode:
            raise FileNotFoundError(f"{ref.name} is no longer the arena (its owner closed it)")
        block = mmap.mmap(fd, st.st_size)
    finally:
        os.close(fd)  # the mapping keeps the memory
    return block, np.frombuffer(block, dtype=np.uint8)


def attachable(ref: SlotRef) -> bool:
    """Whether this process can open the block of ``ref`` (run in a worker by ``convert``)."""
    try:
        slot_array(ref)
    except OSError:
        return False
    return True
