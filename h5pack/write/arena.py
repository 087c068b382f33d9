"""Shared memory cut into slots: how the conversion's workers and parent trade big arrays.

Decoded pixels and chunks are megabytes each; sent through a pipe they are pickled,
copied through the kernel and unpickled, which measured 200-300 MB/s here, well below the
decoders' output (docs/ARCHITECTURE.md, "Conversion pipeline"). Through a slot of shared
memory they cost one ``memcpy`` on each side. A slot belongs to one task at a time: the
parent acquires it when it submits the task and releases it when it has copied the result
out.

NOTE [ Views of shared memory ]: the parent never keeps a numpy view of the segment (a
live view makes ``SharedMemory.close`` fail); it copies in and out inside ``put``,
``take`` and ``view``. Workers keep their views: they never close the segment and end
with the pool.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np

# Start no arena bigger than this share of /dev/shm's free space (containers often have
# 64 MiB there); without an arena, results travel through the pipe instead.
_SHM_SHARE = 0.5


@dataclass(frozen=True)
class SlotRef:
    """Where a task's slot lies: shared-memory segment name, byte offset and size."""

    name: str
    offset: int
    nbytes: int


class Arena:
    """Parent side: a shared-memory segment of ``num_slots`` slots of ``slot_bytes``.

    Raises:
        OSError: the segment cannot be created.
    """

    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        resource_tracker.ensure_running()
        self._shm = shared_memory.SharedMemory(create=True, size=max(1, num_slots * slot_bytes))
        self.name = self._shm.name
        self._free = list(range(num_slots - 1, -1, -1))

    @classmethod
    def maybe(cls, num_slots: int, slot_bytes: int) -> Arena | None:
        """Return an arena, or None when shared memory is short or unavailable."""
        shm_dir = Path("/dev/shm")
        if shm_dir.is_dir():
            free = shutil.disk_usage(shm_dir).free
            if num_slots * slot_bytes > _SHM_SHARE * free:
                return None
        try:
            return cls(num_slots, slot_bytes)
        except OSError:
            return None

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
        return SlotRef(self.name, slot * self.slot_bytes, self.slot_bytes)

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
        buffer = self._shm.buf
        assert buffer is not None
        with buffer[start : start + nbytes] as view:
            yield view

    def close(self) -> None:
        """Unmap and remove the segment."""
        with contextlib.suppress(BufferError):  # a view kept alive by a traceback
            self._shm.close()
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()


# -- worker side ------------------------------------------------------------------------

_ATTACHED: dict[str, tuple[shared_memory.SharedMemory, np.ndarray]] = {}


def slot_array(ref: SlotRef) -> np.ndarray:
    """Return this process's uint8 view of a slot (workers only, see the NOTE above)."""
    entry = _ATTACHED.get(ref.name)
    if entry is None:
        segment = shared_memory.SharedMemory(name=ref.name)
        entry = (segment, np.ndarray((segment.size,), dtype=np.uint8, buffer=segment.buf))
        _ATTACHED[ref.name] = entry
    return entry[1][ref.offset : ref.offset + ref.nbytes]
