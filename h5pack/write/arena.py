"""Shared memory cut into slots: the conversion's workers and parent trade big arrays there.

A slot costs one ``memcpy`` each side where a pipe pickles and copies through the kernel;
it belongs to one task at a time, from submission until its result is copied out.

NOTE [ Memory that cannot leak ]: the block is an anonymous ``memfd``: nothing is left
when the conversion is killed. Workers open ``/proc/<parent pid>/fd/<fd>``, checking its
inode; where they cannot, there is no arena and results travel through the pipes. The
parent keeps no numpy view of it (a live view makes closing fail).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

_USE_MEMFD = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
_MEMFD_NAME = "h5pack-arena"


@dataclass(frozen=True)
class SlotRef:
    """Where a task's slot lies: ``/proc/<pid>/fd/<fd>`` (with its inode), offset, size."""

    name: str
    offset: int
    nbytes: int
    inode: int = 0


class Arena:
    """Parent side: a memfd of ``num_slots`` slots of ``slot_bytes`` (``OSError`` if not made)."""

    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        size = max(1, num_slots * slot_bytes)
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
        self._free = list(range(num_slots - 1, -1, -1))

    @classmethod
    def maybe(cls, num_slots: int, slot_bytes: int) -> Arena | None:
        """Return an arena, or None where there is no memfd or it cannot be made."""
        if not _USE_MEMFD:
            return None
        try:
            return cls(num_slots, slot_bytes)
        except OSError:
            return None

    def acquire(self) -> SlotRef:
        """Take a free slot (its picklable reference, for a task)."""
        if not self._free:
            raise RuntimeError("no free slot: more tasks in flight than slots")
        offset = self._free.pop() * self.slot_bytes
        return SlotRef(self.name, offset, self.slot_bytes, self.inode)

    def release(self, slot: SlotRef) -> None:
        """Give a slot back."""
        self._free.append(slot.offset // self.slot_bytes)

    def put(self, slot: SlotRef, data: np.ndarray) -> None:
        """Copy ``data`` (C-contiguous) to the start of a slot."""
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        with self.view(slot, 0, flat.size) as target:
            target[:] = flat.data

    def take(self, slot: SlotRef, offset: int, nbytes: int) -> np.ndarray:
        """Return a copy of ``nbytes`` at ``offset`` within a slot."""
        out = np.empty(nbytes, dtype=np.uint8)
        with self.view(slot, offset, nbytes) as source:
            out.data.cast("B")[:] = source
        return out

    @contextlib.contextmanager
    def view(self, slot: SlotRef, offset: int, nbytes: int) -> Iterator[memoryview]:
        """Lend a memoryview of ``nbytes`` at ``offset`` within a slot, released on exit."""
        if offset < 0 or offset + nbytes > self.slot_bytes:
            raise ValueError(f"{nbytes} bytes at {offset} do not fit a slot of {self.slot_bytes}")
        start = slot.offset + offset
        with self._buffer[start : start + nbytes] as view:
            yield view

    def close(self) -> None:
        """Unmap the block (never raises; a view kept by a traceback keeps the memory)."""
        with contextlib.suppress(BufferError):
            self._buffer.release()
            self._map.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_ATTACHED: dict[tuple[str, int], np.ndarray] = {}


def slot_array(ref: SlotRef) -> np.ndarray:
    """Return this process's uint8 view of a slot (workers; ``OSError`` if it cannot be opened)."""
    key = (ref.name, ref.inode)
    block = _ATTACHED.get(key)
    if block is None:
        fd = os.open(ref.name, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_ino != ref.inode:
                raise FileNotFoundError(f"{ref.name} is no longer the arena (its owner closed it)")
            block = _ATTACHED[key] = np.frombuffer(mmap.mmap(fd, st.st_size), dtype=np.uint8)
        finally:
            os.close(fd)  # the mapping keeps the memory
    return block[ref.offset : ref.offset + ref.nbytes]


def attachable(ref: SlotRef) -> bool:
    """Whether this process can open the block of ``ref`` (run in a worker)."""
    try:
        slot_array(ref)
    except OSError:
        return False
    return True
