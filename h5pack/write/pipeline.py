"""The conversion's two parallel stages and the pool that runs them.

Stage 1 (``prepare_batch``) decodes, resizes and checksums files; stage 2
(``compress_block``) compresses a block of whole chunks. The parent takes results in order
(``ordered_map``) with few tasks in flight (memory O(chunk x workers)), and only it places
samples into chunks: a skipped file shifts every later sample.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import math
import multiprocessing
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import h5py
import numpy as np

from h5pack.core.decode import Backend, ResizeMethod
from h5pack.core.format import Mode, checksum
from h5pack.errors import DecodeError
from h5pack.write.arena import SlotRef, slot_array
from h5pack.write.images import ImagesSpec
from h5pack.write.sources.base import Image, load

# A stored chunk: (chunk offset, filter mask, its bytes or their (offset, size) in a slot).
StoredChunk = tuple[tuple[int, ...], int, "bytes | tuple[int, int]"]

T = TypeVar("T")


@dataclass(frozen=True)
class DecodeSpec:
    """What stage 1 makes of each file: ``flat`` pixels (a blob), or ``fixed_shape`` ones."""

    mode: Mode
    flat: bool = False
    size: tuple[int, int] | None = None
    resize: ResizeMethod = "stretch"
    channels: int = 3
    backend: Backend = "pillow"
    fixed_shape: tuple[int, int, int] | None = None
    max_side: int | None = None
    quality: int = 90


@dataclass(frozen=True, slots=True)
class Prepared:
    """A sample ready to store: ``pos`` in write order, data (or its ``span`` in a slot), CRC."""

    pos: int
    data: np.ndarray | None
    shape: tuple[int, int, int]
    crc: int
    span: tuple[int, int] | None = None
    source: tuple[int, int] | None = None  # (H, W) decoded, when resized (``write.fitting``)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A file that cannot be packed: ``pos`` in the write order, its path and why."""

    pos: int
    path: str
    reason: str


def _reason(err: Exception, name: str) -> str:
    text = str(err)
    for prefix in (f"{name}: ", f"{name} "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def prepare_sample(
    spec: DecodeSpec, data: bytes | np.ndarray, name: str, pos: int
) -> Prepared | Rejected:
    """Decode (and resize) one image into its stored form; encoded files are checked too."""
    from h5pack.core.decode import decode_image, decode_resized, decoded_size, probe_size
    from h5pack.core.resize import reencode_jpeg, resize_image

    try:
        source = data.shape[:2] if isinstance(data, np.ndarray) else None
        if isinstance(data, np.ndarray):
            image = data if data.ndim == 3 else data[:, :, None]
            if spec.size is not None and image.shape[:2] != spec.size:
                image = resize_image(image, spec.size, method=spec.resize, backend=spec.backend)
                image = image if image.ndim == 3 else image[:, :, None]
        elif spec.mode == "encoded":
            h, w = decoded_size(data, name=name, backend=spec.backend, channels=spec.channels)
            shape = (h, w, spec.channels)
            if spec.max_side is not None and max(shape[:2]) > spec.max_side:
                image = decode_image(data, name=name, backend=spec.backend, channels=spec.channels)
                data = reencode_jpeg(image, quality=spec.quality, max_side=spec.max_side)
                shape = (*probe_size(data, name=name), spec.channels)
            stored = np.frombuffer(data, dtype=np.uint8)
            return Prepared(pos, stored, shape, checksum(data), source=(h, w))
        elif spec.size is not None:
            image, source = decode_resized(
                data,
                spec.size,
                name=name,
                method=spec.resize,
                backend=spec.backend,
                channels=spec.channels,
            )
        else:
            image = decode_image(data, name=name, backend=spec.backend, channels=spec.channels)
    except DecodeError as err:
        return Rejected(pos, name, _reason(err, name))
    image = np.ascontiguousarray(image, dtype=np.uint8)
    shape = (int(image.shape[0]), int(image.shape[1]), int(image.shape[2]))
    if spec.fixed_shape is not None and shape != spec.fixed_shape:
        h, w, c = spec.fixed_shape
        return Rejected(
            pos,
            name,
            f"decodes to {shape[0]}x{shape[1]}x{shape[2]}, but this pack's images are "
            f"{h}x{w}x{c} (its header said otherwise; pass --size N (or H,W) to resize every "
            "image)",
        )
    stored = image.reshape(-1) if spec.flat else image
    decoded = (int(source[0]), int(source[1])) if source is not None else None
    return Prepared(pos, stored, shape, checksum(image), source=decoded)


def prepare_batch(
    spec: DecodeSpec, items: list[tuple[int, Image, str]], slot: SlotRef | None = None
) -> list[Prepared | Rejected]:
    """Stage 1: prepare ``(pos, image, key)`` items; with a ``slot``, bytes go there if they fit."""
    room = slot_array(slot) if slot is not None else None
    cursor = 0
    out: list[Prepared | Rejected] = []
    for pos, image, key in items:
        try:
            data = load(image)
        except DecodeError as err:
            out.append(Rejected(pos, key, _reason(err, getattr(image, "path", key))))
            continue
        result = prepare_sample(spec, data, key, pos)
        if room is not None and isinstance(result, Prepared) and result.data is not None:
            size = result.data.nbytes
            if cursor + size <= room.size:
                room[cursor : cursor + size] = result.data.reshape(-1)
                result = replace(result, data=None, span=(cursor, size))
                cursor += size
        out.append(result)
    return out


def made_batch(
    encode: Callable[[Any], Any], make: Callable[[Any], Any], items: list[Any]
) -> list[Any]:
    """Return ``encode(make(item))`` of each item: a batch of a ``LazyColumn``'s values (masks)."""
    return [encode(make(item)) for item in items]


def probe_batch(items: list[tuple[Image, str]]) -> list[tuple[int, int] | None]:
    """Return each ``(image, key)``'s (H, W) from its header, None if unreadable."""
    from h5pack.core.decode import probe_size

    out: list[tuple[int, int] | None] = []
    for image, key in items:
        try:
            data = load(image)
            h, w = data.shape[:2] if isinstance(data, np.ndarray) else probe_size(data, name=key)
        except DecodeError:
            out.append(None)
        else:
            out.append((int(h), int(w)))
    return out


# One in-memory HDF5 file per process holds a dataset per spec: a block is written there
# and its stored chunks read back, filter-exact for any codec.
_CORE: dict[str, Any] = {}


def _core_dataset(spec: ImagesSpec, rows: int) -> h5py.Dataset:
    handle = _CORE.get("file")
    if handle is None or not handle.id.valid:
        handle = h5py.File(f"h5pack-core-{id(_CORE)}", "w", driver="core", backing_store=False)
        _CORE.clear()
        _CORE["file"] = handle
    key = f"{spec!r} {rows}"
    if key not in _CORE:
        _CORE[key] = spec.create(handle, f"d{len(_CORE)}", rows)
    return _CORE[key]


def compress_block(
    spec: ImagesSpec, start: int, rows: int, data: np.ndarray | None, slot: SlotRef | None = None
) -> list[StoredChunk]:
    """Stage 2: return the stored chunks of the block (``data`` or in ``slot``) at ``start``."""
    if data is None:
        assert slot is not None
        rest = spec.sample_shape if spec.storage == "array" else ()
        assert rest is not None
        data = slot_array(slot)[: rows * math.prod(rest)].reshape(rows, *rest)
    dataset = _core_dataset(spec, rows)
    dataset[...] = data
    room = slot_array(slot) if slot is not None else None
    cursor = 0
    out: list[StoredChunk] = []
    for i in range(dataset.id.get_num_chunks()):
        info = dataset.id.get_chunk_info(i)
        offset = (int(info.chunk_offset[0]) + start, *(int(o) for o in info.chunk_offset[1:]))
        size = int(info.size)
        if room is not None and cursor + size <= room.size:
            mask, _ = dataset.id.read_direct_chunk(
                info.chunk_offset, out=room[cursor : cursor + size]
            )
            out.append((offset, int(mask), (cursor, size)))
            cursor += size
        else:
            mask, stored = dataset.id.read_direct_chunk(info.chunk_offset)
            out.append((offset, int(mask), stored))
    return out


def release_core() -> None:
    """Close this process's in-memory compression file."""
    handle = _CORE.pop("file", None)
    _CORE.clear()
    if handle is not None and handle.id.valid:
        handle.close()


class InlineExecutor(Executor):
    """Run every task at once in this process (``workers=1``: easy to debug and profile)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` now and return its completed future."""
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as err:
            future.set_exception(err)
        return future


def keep_freed_memory(*, die_with_parent: bool = False) -> None:
    """Serve each decoded image from the heap, not a fresh ``mmap`` (glibc; else nothing).

    NOTE [ Worker malloc ]: glibc served every decoded image from a new ``mmap`` and
    returned it on ``free``, so each paid its page faults again (docs/decisions/0025).
    Allocations up to 32 MiB now come from the heap, trimmed past 512 MiB free at its top.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # exotic libc
            libc = ctypes.CDLL(None)
            if die_with_parent:
                libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD (malloc.h)
            libc.mallopt(-1, 512 * 2**20)  # M_TRIM_THRESHOLD


def _init_worker() -> None:
    """Let the parent handle Ctrl-C and SIGTERM; die with the parent; keep freed memory."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    keep_freed_memory(die_with_parent=True)


def pool_start_method() -> str:
    """Return how worker processes are started: fork where safe, else forkserver or spawn."""
    methods = multiprocessing.get_all_start_methods()
    if sys.version_info < (3, 12) and "fork" in methods:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def make_executor(workers: int) -> Executor:
    """Return a pool of ``workers`` processes (inline for 1), all started now."""
    if workers <= 1:
        return InlineExecutor()
    # Forked workers inherit what is imported here instead of each importing it again.
    importlib.import_module("h5pack.core.decode")
    context = multiprocessing.get_context(pool_start_method())
    executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker)
    executor.submit(int).result()
    return executor


def ordered_map(
    executor: Executor,
    fn: Callable[..., T],
    items: Iterable[tuple[Any, ...]],
    *,
    max_in_flight: int,
) -> Iterator[tuple[Any, T]]:
    """Yield ``(item, fn(*item))`` for each item, in order, at most ``max_in_flight`` pending."""
    pending: deque[tuple[Any, Future[T]]] = deque()
    try:
        for item in items:  # taken lazily, as results are: memory stays bounded
            pending.append((item, executor.submit(fn, *item)))
            if len(pending) >= max_in_flight:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
    finally:
        for _, future in pending:
            future.cancel()
