"""Batches handed from DataLoader workers through a ring of reused shared-memory buffers."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import weakref
from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

# NOTE [ Batch ring ]
# A batch crossing from a worker in a fresh shared-memory segment costs a new file, pages
# faulted and zeroed on both sides, an fd per tensor and an unlink. ``BatchRing`` keeps
# ``slots`` buffers per worker instead, sent to the main process once; afterwards a batch
# crosses as ``(worker, slot, shape, strides)`` and the main process rebuilds a view
# (``_ring_tensor``). One byte per slot in a ``RawArray`` made before the workers start says
# who may write it: 0 free, 1 taken. Only the main process frees a slot, once the storage's
# use count is back to the ring's own references. With no free slot a worker uses a fresh
# segment: the ring never blocks. Small tensors (labels) cross by value.

SMALL_TENSOR_BYTES = 1 << 16  # tensors up to this size cross by value

_RINGS: weakref.WeakValueDictionary[str, BatchRing] = weakref.WeakValueDictionary()


# torch's count of a storage's references is no public API: without it no buffer is ever
# found unreferenced, so every batch gets a fresh one (reuse_route() says so).
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _use_count(storage: torch.UntypedStorage) -> int:
    return 0 if _STORAGE_USE_COUNT is None else int(_STORAGE_USE_COUNT(storage._cdata))


def _unreferenced(storage: torch.UntypedStorage, own: int) -> bool:
    return _STORAGE_USE_COUNT is not None and _use_count(storage) <= own


def reuse_route() -> str:
    """Whether batch buffers are reused once unreferenced in this process (for reports)."""
    if _STORAGE_USE_COUNT is None:
        return "fresh buffers (this torch does not count a storage's references)"
    return "reused once unreferenced"


class BatchRing:
    """Reused shared-memory batch buffers per DataLoader worker (NOTE [ Batch ring ]).

    Made in the main process before the workers start, with ``slots`` buffers per worker
    (its batches in flight plus those the training loop holds).
    """

    def __init__(self, workers: int, slots: int) -> None:
        self.workers, self.slots = workers, slots
        self.token = f"{os.getpid()}-{id(self)}"
        self.states: Any = multiprocessing.get_context().RawArray("b", workers * slots)
        self.fallbacks = 0  # fresh segments made because no slot was free (worker side)
        self._init_local()
        _RINGS[self.token] = self

    def _init_local(self) -> None:
        # worker side: this process's buffers and whether the main process has them
        self._own: dict[int, torch.UntypedStorage] = {}
        self._sent: set[int] = set()
        # main side: buffers received, and the slots taken by batches not yet released
        self._lock = threading.Lock()
        self._mapped: dict[int, tuple[torch.UntypedStorage, int]] = {}
        self._held: set[int] = set()
        self.arrivals = 0  # batches received through a slot (main side)

    def __getstate__(self) -> dict[str, Any]:
        # the slot states travel only to processes being started: elsewhere the ring is off
        states = self.states if get_spawning_popen() is not None else None
        return {"workers": self.workers, "slots": self.slots, "token": self.token,
                "states": states, "fallbacks": 0}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()

    def buffer(self, shape: Sequence[int]) -> torch.Tensor:
        """(Worker side) an uninitialised uint8 tensor of ``shape``: a free slot's, else fresh."""
        info = get_worker_info()
        nbytes = math.prod(shape)
        if info is None:
            return torch.empty(tuple(shape), dtype=torch.uint8)
        index = self._take(info.id % self.workers)
        if index is None:
            self.fallbacks += 1
            return _fresh_shared(shape)
        storage = self._own.get(index)
        if storage is None or storage.nbytes() < nbytes:
            storage = torch.UntypedStorage._new_shared(max(1, nbytes))
            self._own[index] = storage
            self._sent.discard(index)
        return _view(storage, shape)

    def _take(self, worker: int) -> int | None:
        states = self.states
        if states is None:
            return None
        for index in range(worker * self.slots, (worker + 1) * self.slots):
            if states[index] == 0:
                states[index] = 1
                return index
        return None

    def slot_of(self, tensor: torch.Tensor) -> int | None:
        """The slot whose buffer ``tensor`` views (in this worker), or None."""
        ptr = tensor.untyped_storage().data_ptr()
        for index, storage in self._own.items():
            if storage.data_ptr() == ptr:
                return index
        return None

    def reference(self, tensor: torch.Tensor, index: int) -> _Crossing:
        """What crosses instead of ``tensor`` (a view of slot ``index``'s buffer)."""
        storage = None if index in self._sent else self._own[index]
        self._sent.add(index)
        shape, offset = tuple(tensor.shape), int(tensor.storage_offset())
        return _Crossing(_ring_tensor, self.token, index, storage, shape, tensor.stride(), offset)

    def arrived(self, index: int, storage: torch.UntypedStorage | None) -> torch.UntypedStorage:
        """(Main side) record a batch in slot ``index`` (buffer sent once); free unused slots."""
        with self._lock:
            if storage is not None:  # the ring's references: this one and the one kept
                self._mapped[index] = (storage, _use_count(storage))
            mapped = self._mapped.get(index)
            if mapped is None:
                raise RuntimeError(f"h5pack batch ring: slot {index} arrived before its buffer")
            self._release_unused()
            self._held.add(index)
            self.arrivals += 1
            return mapped[0]

    def release_unused(self) -> int:
        """Free every slot whose buffer nothing references any more; return how many."""
        with self._lock:
            return self._release_unused()

    def _release_unused(self) -> int:
        freed = [i for i in self._held if _unreferenced(*self._mapped[i])]
        for index in freed:
            self._held.discard(index)
            if self.states is not None:
                self.states[index] = 0
        return len(freed)

    def held(self) -> set[int]:
        """The slots the main process has received and not yet released."""
        with self._lock:
            return set(self._held)


def _fresh_shared(shape: Sequence[int]) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(max(1, math.prod(shape)))
    return _view(storage, shape)


def _view(storage: torch.UntypedStorage, shape: Sequence[int]) -> torch.Tensor:
    return (
        torch.empty(0, dtype=torch.uint8)
        .set_(storage)
        .view(-1)[: math.prod(shape)]
        .view(tuple(shape))
    )


def _ring_tensor(
    token: str,
    index: int,
    storage: torch.UntypedStorage | None,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    offset: int,
) -> torch.Tensor:
    """Rebuild (in the main process) the uint8 view of a ring slot's buffer."""
    ring = _RINGS.get(token)
    if ring is not None:
        storage = ring.arrived(index, storage)
    elif storage is None:
        raise RuntimeError("h5pack batch ring: a batch arrived in a process without its ring")
    return torch.empty(0, dtype=torch.uint8).set_(storage, offset, shape, stride)


def _small_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


class RingCollate:
    """Collate with ``collate``; a worker sends ring buffers by reference, small tensors by value.

    The outermost collate of a loader with a ``BatchRing``; in the main process it changes
    nothing.
    """

    def __init__(self, collate: Any, ring: BatchRing) -> None:
        self.collate, self.ring = collate, ring

    def __call__(self, samples: Any) -> Any:
        """Return the collated batch, ready to cross to the main process."""
        batch = self.collate(samples)
        if get_worker_info() is None:
            return batch
        return self._wrap(batch, depth=0)

    def _wrap(self, value: Any, depth: int) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dtype == torch.uint8 and value.device.type == "cpu":
                index = self.ring.slot_of(value)
                if index is not None:
                    return self.ring.reference(value, index)
            if (
                value.device.type == "cpu"
                and not value.requires_grad
                and value.untyped_storage().nbytes() <= SMALL_TENSOR_BYTES
                and value.is_contiguous()
                and value.storage_offset() == 0
                and value.numel() * value.element_size() == value.untyped_storage().nbytes()
                and value.dtype in _NUMPY_DTYPES
            ):
                return _Crossing(_small_tensor, value.numpy())
            return value
        if type(value) is list and len(value) > 1 and all(torch.is_tensor(v) for v in value):
            whole = self._whole(value)  # a field's list of tensors: one object crosses
            if whole is not None:
                return whole
        if depth < 2 and type(value) in (tuple, list):
            wrapped = [self._wrap(v, depth + 1) for v in value]
            return tuple(wrapped) if type(value) is tuple else wrapped
        if depth < 2 and type(value) is dict:  # a batch of fields: each as a tuple's item
            return {key: self._wrap(v, depth) for key, v in value.items()}
        return value

    def _whole(self, tensors: list[torch.Tensor]) -> _Crossing | None:
        """A list of views of one ring slot, or of small tensors of one dtype, as one object."""
        first = tensors[0]
        if any(t.device.type != "cpu" or t.dtype != first.dtype for t in tensors):
            return None
        index = self.ring.slot_of(first) if first.dtype == torch.uint8 else None
        if index is not None and all(self.ring.slot_of(t) == index for t in tensors):
            views = [(tuple(t.shape), t.stride(), int(t.storage_offset())) for t in tensors]
            return _Crossing(_ring_list, self.ring.reference(first, index), views)
        total = sum(t.numel() * t.element_size() for t in tensors)
        if total <= SMALL_TENSOR_BYTES and first.dtype in _NUMPY_DTYPES:
            flat = np.concatenate([t.reshape(-1).numpy() for t in tensors])  # one array
            return _Crossing(_small_list, flat, [tuple(t.shape) for t in tensors])
        return None


class _Crossing:
    """What crosses processes as ``function(*args)``."""

    __slots__ = ("call",)

    def __init__(self, function: Any, *args: Any) -> None:
        self.call = (function, args)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.call


def _ring_list(first: torch.Tensor, views: list[tuple[Any, ...]]) -> list[torch.Tensor]:
    storage = first.untyped_storage()
    return [torch.empty(0, dtype=torch.uint8).set_(storage, o, shape, st) for shape, st, o in views]


def _small_list(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    ends = np.cumsum([math.prod(shape) for shape in shapes])[:-1].tolist()
    pieces = torch.from_numpy(flat).tensor_split(ends)
    return [piece.view(shape) for piece, shape in zip(pieces, shapes, strict=True)]


_NUMPY_DTYPES = {
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.float32, torch.float64, torch.bool,
}  # fmt: skip


# NOTE [ Reused batches in the main process ]
# Without workers a fresh torch.empty per batch costs page faults and cold memory.
# ``LocalBatches`` keeps up to ``PER_SHAPE`` buffers for each of ``SHAPES`` batch shapes and
# hands one out again only when nothing references it (the ring's test).


class LocalBatches:
    """Batch buffers of this process reused once unreferenced (NOTE [ Reused batches ... ])."""

    PER_SHAPE = 3
    SHAPES = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, ...], list[tuple[torch.UntypedStorage, int]]] = {}
        self._pid = os.getpid()

    def take(self, shape: Sequence[int]) -> torch.Tensor:
        """A uint8 tensor of ``shape``: a kept buffer nobody references, or a fresh one."""
        key = tuple(int(v) for v in shape)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's buffers are not its own
                self._kept, self._pid = {}, os.getpid()
            kept = self._kept.get(key)
            if kept is None:
                if len(self._kept) >= self.SHAPES:
                    del self._kept[next(iter(self._kept))]
                kept = self._kept[key] = []
            for storage, own in kept:
                if _unreferenced(storage, own):
                    return _view(storage, key)
            storage = torch.UntypedStorage(max(1, math.prod(key)))
            if len(kept) >= self.PER_SHAPE:  # all held (kept by the caller): forget the oldest
                del kept[0]
            kept.append((storage, _use_count(storage)))
            return _view(storage, key)


_LOCAL = LocalBatches()


def batch_buffer(ring: BatchRing | None, shape: Sequence[int]) -> torch.Tensor:
    """A batch's uint8 buffer: a ring slot, a reused one in the main process, or fresh."""
    if ring is not None:
        return ring.buffer(shape)
    if get_worker_info() is None:
        return _LOCAL.take(shape)
    return _fresh_shared(shape)
