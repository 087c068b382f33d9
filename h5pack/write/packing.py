"""Write a pack from samples in write order: decode them in the pool, check the room, publish.

Shared by ``convert``, ``write_arrays`` and each shard of ``convert_set``. A sample that
cannot be packed is skipped with a warning naming it, or with ``strict`` stops it all.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import BrokenExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from h5pack.core.format import SkippedFile
from h5pack.errors import DecodeError, H5PackError, SourceError
from h5pack.write.arena import Arena, attachable
from h5pack.write.builder import PackBuilder, SampleTable
from h5pack.write.options import ConvertOptions
from h5pack.write.pipeline import (
    Prepared,
    Rejected,
    made_batch,
    make_executor,
    ordered_map,
    prepare_batch,
    probe_batch,
    release_core,
)
from h5pack.write.plan import StoragePlan, batch_size, block_slot_bytes, sample_slot_bytes
from h5pack.write.publish import TempFiles, check_room, publish, temp_path
from h5pack.write.report import ConvertEvent
from h5pack.write.sources import Sample
from h5pack.write.sources.base import image_bytes, ship


def rejecter(
    options: ConvertOptions, skipped: list[SkippedFile], emit: Callable[[ConvertEvent], None]
) -> Callable[[str, str], None]:
    """Return what a conversion does with a sample it cannot pack: record it, or stop."""

    def reject(path: str, reason: str) -> None:
        if options.strict:
            raise DecodeError(f"{path}: {reason} (--strict stops at the first bad file)")
        skipped.append(SkippedFile(path, reason))
        emit(ConvertEvent("skipped", f"skipped {path}: {reason}", path=path))

    return reject


@dataclass(frozen=True)
class Pool:
    """Where a conversion decodes and compresses (``workers`` processes), and reports."""

    executor: Any
    workers: int
    emit: Callable[[ConvertEvent], None]
    step: Callable[[int], None]


@contextlib.contextmanager
def worker_pool(
    workers: int, emit: Callable[[ConvertEvent], None], step: Callable[[int], None]
) -> Iterator[Pool]:
    """Lend the pool that decodes and compresses (inline for 1 worker); one error if one dies."""
    executor = make_executor(workers)
    try:
        yield Pool(executor, workers, emit, step)
    except BrokenExecutor as err:
        raise H5PackError(
            "a worker process died (it crashed on a file, or was killed, e.g. for lack of "
            "memory); rerun with --workers 1 to see where"
        ) from err
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def write_samples(
    target_path: Path,
    plan: StoragePlan,
    samples: Sequence[Sample],
    table: SampleTable,
    pool: Pool,
    *,
    options: ConvertOptions,
    temps: TempFiles,
    skipped: list[SkippedFile],
    overwrite: bool,
    shard: str | None = None,
    room: Callable[[int], None] | None = None,
) -> Path:
    """Decode ``samples`` (in write order) in ``pool``; publish their pack as ``target_path``.

    Rejected samples go to ``skipped``; ``shard`` is a shard's identity (JSON text);
    ``room`` is called first with the fewest bytes the pack will take.

    Raises:
        H5PackError: the pack cannot be written (one line for a full or read-only disk).
    """
    if room is not None:
        room(min_pack_bytes(plan, samples))
    executor, workers = pool.executor, pool.workers
    arenas: list[Arena] = []
    builder: PackBuilder | None = None
    try:
        builder = PackBuilder(temp_path(target_path), plan, allocate=len(table), temps=temps)
        samples_arena = blocks_arena = None
        if workers > 1:
            samples_arena = open_arena(executor, 2 * workers, sample_slot_bytes(plan))
            if plan.spec.compressed:
                blocks_arena = open_arena(executor, workers + 1, block_slot_bytes(plan))
            arenas = [a for a in (samples_arena, blocks_arena) if a is not None]
        reject = rejecter(options, skipped, pool.emit)
        prepared = prepared_samples(pool, plan, samples, samples_arena, reject)
        checked = room_checked(prepared, table, plan, target_path, temps, in_flight=workers + 1)
        builder.write(checked, executor, workers + 1, blocks_arena)
        if not builder.record.count:
            first = f" (e.g. {skipped[0].path}: {skipped[0].reason})" if skipped else ""
            raise SourceError(f"none of the {len(table)} images could be packed{first}")
        if builder.images.needs_rebuild:
            note = "files were skipped: copying the contiguous array to its final size"
            pool.emit(ConvertEvent("note", note))
        skipped.sort(key=lambda s: os.fsencode(s.path))
        finished = builder.finish(table, options, skipped, shard=shard, mapper=pooled(pool))
        publish(finished, target_path, overwrite=overwrite)
    except H5PackError as err:  # some are OSErrors too (SourceError)
        if (clean := disk_error(err.__cause__, target_path)) is None:
            raise
        raise clean from err
    except OSError as err:  # the pack's file: decoding errors are DecodeErrors
        failed = H5PackError(f"writing {target_path} failed: {err}")
        raise disk_error(err, target_path) or failed from err
    finally:
        if builder is not None:
            builder.close()
        release_core()
        for arena in arenas:
            arena.close()
    temps.release_reserved(target_path)
    return target_path


def pooled(pool: Pool) -> Callable[..., Iterator[Any]]:
    """Return a ``LazyColumn`` mapper: its masks made and encoded in the pool, a few at a time."""

    def mapper(encode: Any, make: Any, items: Sequence[Any]) -> Iterator[Any]:
        pool.emit(ConvertEvent("phase", "decoding masks", total=len(items)))
        tasks = (
            (encode, make, list(items[lo : lo + MASK_BATCH]))
            for lo in range(0, len(items), MASK_BATCH)
        )
        in_flight = pool.workers + 1
        for _, made in ordered_map(pool.executor, made_batch, tasks, max_in_flight=in_flight):
            pool.step(len(made))
            yield from made

    return mapper


def open_arena(executor: Any, num_slots: int, slot_bytes: int) -> Arena | None:
    """Return an arena the workers can open (NOTE [ Memory that cannot leak ]), or None."""
    arena = Arena.maybe(num_slots, slot_bytes)
    if arena is None:
        return None
    slot = arena.acquire()
    arena.release(slot)
    if executor.submit(attachable, slot).result():
        return arena
    arena.close()
    return None


MASK_BATCH = 8  # samples whose masks a worker makes in one task

# Metadata per sample: labels, shapes, checksums, source order, digest (blobs: offsets and
# sizes); HDF5's headers take 1/16 more and a slack. The compact index copies them with a
# path length and at most a chunk entry a sample (NOTE [ Compact index ]).
_SAMPLE_METADATA_BYTES = 8 + 12 + 4 + 8 + 8
_BLOB_METADATA_BYTES = 16
_METADATA_SLACK_BYTES = 2**15
_INDEX_SAMPLE_BYTES = 4 + 4 * 8 + 3 * 8


def metadata_bytes(num_samples: int, path_bytes: int, *, blob: bool) -> int:
    """Return about the bytes a pack's metadata and compact index take, erring large."""
    per_sample = _SAMPLE_METADATA_BYTES + (_BLOB_METADATA_BYTES if blob else 0)
    data = num_samples * per_sample + path_bytes
    hdf5 = data + data // 16 + _METADATA_SLACK_BYTES
    index = data + num_samples * _INDEX_SAMPLE_BYTES + _METADATA_SLACK_BYTES
    return hdf5 + index


def min_pack_bytes(plan: StoragePlan, samples: Sequence[Sample]) -> int:
    """Return the fewest bytes the pack of ``samples`` can take (0 when compressed pixels)."""
    if plan.mode == "encoded":
        return int(image_bytes(samples).sum())
    if plan.spec.compressed:
        return 0
    if plan.spec.sample_shape is not None:
        return len(samples) * math.prod(plan.spec.sample_shape)
    return plan.spec.blob_bytes or 0


def images_left_bytes(
    plan: StoragePlan, num_samples: int, sample_bytes: int, *, in_flight: int
) -> int:
    """Return the most bytes of images still to write once every sample is decoded.

    The partial last block and the ``in_flight`` blocks in the pool (at most all the
    ``sample_bytes``); a staged contiguous blob: all of it.
    """
    if plan.spec.chunks is None and plan.storage == "blob":
        return sample_bytes + plan.chunk_bytes
    if plan.spec.sample_shape is not None:
        sample = math.prod(plan.spec.sample_shape)
        block = plan.group_samples * sample
        partial = (num_samples % plan.group_samples) * sample
    else:
        block = partial = plan.chunk_bytes
    if not plan.spec.compressed:
        return partial
    # Codecs expand incompressible data by well under 1/64.
    bound = sample_bytes + sample_bytes // 64 + _METADATA_SLACK_BYTES
    return min(partial + (in_flight - 1) * block, bound)


def room_checked(
    prepared: Iterable[Prepared],
    table: SampleTable,
    plan: StoragePlan,
    target: Path,
    temps: TempFiles,
    *,
    in_flight: int,
) -> Iterator[Prepared]:
    """Yield ``prepared``; then reserve the room the rest needs (NOTE [ Room for the metadata ]).

    A contiguous array with skipped files is copied into a new file, so the room is only
    checked (NOTE [ Contiguous packs and skipped files ]).
    """
    count = path_bytes = sample_bytes = 0
    for item in prepared:
        count += 1
        path_bytes += len(os.fsencode(table.paths[item.pos]))
        sample_bytes += item.data.nbytes if item.data is not None else 0
        yield item
    what = f"the rest of {target.name} (its last images and metadata)"
    metadata = metadata_bytes(count, path_bytes, blob=plan.storage == "blob")
    if plan.spec.chunks is None and plan.storage == "array" and count < len(table):
        check_room(target.parent, sample_bytes + metadata, what=what)
        return
    images = images_left_bytes(plan, count, sample_bytes, in_flight=in_flight)
    temps.reserve(images + metadata, what=what)


_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def disk_error(cause: BaseException | None, target: Path) -> H5PackError | None:
    """Return one line saying that the disk is full or read-only, if that is the ``cause``."""
    if not isinstance(cause, OSError) or cause.errno not in _DISK_ERRORS:
        return None
    return H5PackError(
        f"writing {target} failed: {os.strerror(cause.errno)} on the file system of {target.parent}"
    )


def prepared_samples(
    pool: Pool,
    plan: StoragePlan,
    samples: Sequence[Sample],
    arena: Arena | None,
    reject: Callable[[str, str], None],
) -> Iterator[Prepared]:
    """Yield the prepared samples in write order (stage 1), reporting rejected files."""
    batch = batch_size(plan)
    tasks = (
        (
            plan.decode,
            [(lo + i, ship(s.image), s.key) for i, s in enumerate(samples[lo : lo + batch])],
            arena.acquire() if arena is not None else None,
        )
        for lo in range(0, len(samples), batch)
    )
    in_flight = 2 * pool.workers
    for (_, _, slot), results in ordered_map(
        pool.executor, prepare_batch, tasks, max_in_flight=in_flight
    ):
        for result in results:
            if isinstance(result, Rejected):
                reject(result.path, result.reason)
                continue
            if result.span is not None and arena is not None and slot is not None:
                data = arena.take(slot, *result.span)
                if plan.storage == "array":
                    data = data.reshape(result.shape)
                result = replace(result, data=data, span=None)
            yield result
        if arena is not None and slot is not None:
            arena.release(slot)
        pool.step(len(results))


def probe_sizes(pool: Pool, samples: Sequence[Sample]) -> Counter[tuple[int, int]]:
    """Read every image's (H, W) from its header, in the pool."""
    pool.emit(ConvertEvent("phase", "reading image sizes", total=len(samples)))
    batch = 64
    tasks = (
        ([(ship(s.image), s.key) for s in samples[lo : lo + batch]],)
        for lo in range(0, len(samples), batch)
    )
    sizes: Counter[tuple[int, int]] = Counter()
    in_flight = 2 * pool.workers
    for _, results in ordered_map(pool.executor, probe_batch, tasks, max_in_flight=in_flight):
        sizes.update(size for size in results if size is not None)
        pool.step(len(results))
    return sizes
