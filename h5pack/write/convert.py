"""Streaming, parallel, crash-safe conversion of an image folder (or arrays) into a pack.

``convert`` scans a folder, chooses the storage (``plan``), decodes in a pool of processes
(``pipeline``) and lays the samples into whole chunks written once and in order
(``builder``, ``images``). Everything goes to a hidden temporary file beside the target
that is renamed into place only when complete; an exception, Ctrl-C or SIGTERM removes
it, and a SIGKILL leaves nothing under the target's name. ``write_arrays`` packs in-memory
samples through the same back end.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import BrokenExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core.fields import LEGACY_FIELDS, Field, columns_of
from h5pack.core.format import SkippedFile
from h5pack.errors import DecodeError, H5PackError, OptionsError
from h5pack.write.arena import Arena, attachable
from h5pack.write.builder import (
    ConvertEvent,
    ConvertReport,
    SampleTable,
    Workers,
    build_pack,
    make_report,
    write_order,
)
from h5pack.write.leftovers import describe_removed, remove_leftover_segments, remove_leftovers
from h5pack.write.options import ConvertOptions
from h5pack.write.pipeline import (
    Prepared,
    Rejected,
    make_executor,
    ordered_map,
    prepare_batch,
    prepare_pixels,
    prepare_sample,
    probe_batch,
)
from h5pack.write.plan import (
    StoragePlan,
    batch_size,
    block_slot_bytes,
    plan_storage,
    sample_slot_bytes,
)
from h5pack.write.publish import (
    TempFiles,
    check_not_a_source,
    check_room,
    check_target,
    sigterm_as_exit,
)
from h5pack.write.scan import (
    ScanResult,
    SourceFile,
    file_sizes,
    group_problems,
    name_paths,
    scan,
)
from h5pack.write.upload import is_url

__all__ = ["ConvertEvent", "ConvertReport", "convert", "convert_file", "write_arrays"]

# Skipped files are also reported here (one summary per conversion), for Python callers
# who do not pass ``on_event``; the CLI renders the events instead.
logger = logging.getLogger("h5pack")


def convert(
    source: StrPath,
    target: StrPath,
    options: ConvertOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
    storage_options: Mapping[str, str] | None = None,
    staging_dir: StrPath | None = None,
) -> ConvertReport:
    """Pack the image folder ``source`` into the HDF5 file ``target``.

    Args:
        source: An ImageFolder tree, a flat folder, or any folder with ``labels_csv``.
        target: The pack to write: a path, or a URL (``s3://bucket/key.h5``), where the
            pack is uploaded once complete (NOTE [ Publishing in a bucket ]).
        options: How to convert (default ``ConvertOptions()``).
        overwrite: Replace an existing ``target``.
        progress: Called with the number of steps just done in the current phase (see the
            ``"phase"`` event).
        on_event: Called with each ``ConvertEvent`` (skipped files, the mode chosen...).
        storage_options: For a URL: the bucket's settings that the environment does not
            give (docs/object-storage.md).
        staging_dir: For a URL: where the pack is written before it is uploaded (default:
            the system's temporary directory).

    Returns:
        What was written (``path`` is the URL for a URL).

    Raises:
        TargetExistsError: ``target`` exists and ``overwrite`` is False.
        SourceError: the source is missing or holds no image that can be packed.
        DecodeError: with ``strict``, the first file that cannot be packed.
        OptionsError: the options do not fit the images.
        H5PackError: for a URL, the staging directory is too small or the upload failed.
    """
    if is_url(target):
        from h5pack.write.remote import convert_to_url

        return convert_to_url(
            source,
            str(target),
            options,
            overwrite=overwrite,
            progress=progress,
            on_event=on_event,
            storage_options=storage_options,
            staging_dir=staging_dir,
        )
    return convert_file(
        source, target, options, overwrite=overwrite, progress=progress, on_event=on_event
    )


def convert_file(
    source: StrPath,
    target: StrPath,
    options: ConvertOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
    room: Callable[[int], None] | None = None,
) -> ConvertReport:
    """Pack ``source`` into the local file ``target`` (``convert`` of a path).

    ``room``, when given, is called with the fewest bytes the pack will take, once the
    storage is planned and before any image is decoded (a staging directory's check).
    """
    options = options or ConvertOptions()
    emit = on_event or (lambda event: None)
    step = progress or (lambda n: None)
    target_path = check_target(target, overwrite=overwrite)
    remove_leftovers_beside(target_path, emit)
    with sigterm_as_exit(), TempFiles(target_path) as temps:
        return _logged(
            _convert(source, target_path, options, temps, overwrite, emit, step, room=room)
        )


def _convert(
    source: StrPath,
    target_path: Path,
    options: ConvertOptions,
    temps: TempFiles,
    overwrite: bool,
    emit: Callable[[ConvertEvent], None],
    step: Callable[[int], None],
    *,
    room: Callable[[int], None] | None = None,
) -> ConvertReport:
    """Scan ``source`` and write the pack (``convert``, inside its lock and signal handler)."""
    started = time.perf_counter()
    found, skipped = scan_source(source, options, emit)
    check_not_a_source(target_path, (f.path for f in found.files))
    num = len(found.files)
    order = write_order(num, options)
    files = [found.files[i] for i in order]
    workers = options.effective_workers
    with worker_pool(workers) as executor:
        sizes = probe_sizes(executor, files, workers, emit, step) if needs_probe(options) else None
        plan = plan_storage(
            options,
            sizes,
            num_samples=num,
            sample_bytes=lambda limit: file_sizes(files[:limit]),
        )
        emit(ConvertEvent("mode", plan.reason))
        emit(ConvertEvent("phase", "converting", total=num))
        published = write_files(
            target_path,
            plan,
            files,
            sample_table(files, found.classes, order),
            options=options,
            executor=executor,
            workers=workers,
            temps=temps,
            skipped=skipped,
            emit=emit,
            step=step,
            overwrite=overwrite,
            room=room,
        )
    return make_report(published, plan, num, skipped, started)


def scan_source(
    source: StrPath, options: ConvertOptions, emit: Callable[[ConvertEvent], None]
) -> tuple[ScanResult, list[SkippedFile]]:
    """Scan ``source``; return the scan and the files it left out (announced through ``emit``).

    Raises:
        SourceError: the source is missing or holds no image.
        DecodeError: with ``strict``, the first file the scan left out.
    """
    found = scan(source, labels_csv=options.labels_csv)
    labelled = f" in {len(found.classes)} classes" if found.classes else " (unlabelled)"
    emit(
        ConvertEvent(
            "scanned",
            f"found {len(found.files)} images{labelled} under {found.root}",
            total=len(found.files),
        )
    )
    if found.unlisted:
        total = len(found.files) + len(found.unlisted)
        emit(
            ConvertEvent(
                "skipped",
                f"the labels CSV {options.labels_csv} lists {len(found.files)} of the {total} "
                f"images under {found.root}: {len(found.unlisted)} left out "
                f"({name_paths(found.unlisted)}); only listed images are packed",
            )
        )
    skipped: list[SkippedFile] = []
    # One warning per kind of scan problem (a hundred stray files make one line), every
    # file recorded.
    for reason, paths in group_problems(found.problems):
        if options.strict:
            _rejecter(options, skipped, emit)(paths[0], reason)
        skipped.extend(SkippedFile(path, reason) for path in paths)
        emit(ConvertEvent("skipped", f"skipped {name_paths(paths)}: {reason}", path=paths[0]))
    return found, skipped


def _rejecter(
    options: ConvertOptions, skipped: list[SkippedFile], emit: Callable[[ConvertEvent], None]
) -> Callable[[str, str], None]:
    """Return what a conversion does with a file it cannot pack: record it, or stop."""

    def reject(path: str, reason: str) -> None:
        if options.strict:
            raise DecodeError(f"{path}: {reason} (--strict stops at the first bad file)")
        skipped.append(SkippedFile(path, reason))
        emit(ConvertEvent("skipped", f"skipped {path}: {reason}", path=path))

    return reject


def needs_probe(options: ConvertOptions) -> bool:
    """Return whether planning needs every image's size (read from its header)."""
    return options.mode != "encoded" and options.size is None


def sample_table(
    files: Sequence[SourceFile], classes: Sequence[str], order: np.ndarray
) -> SampleTable:
    """Return the table of ``files`` (in write order; ``order`` their scan positions)."""
    return SampleTable(
        labels=np.asarray([f.label for f in files], dtype=np.int64),
        classes=tuple(classes),
        paths=[f.relative for f in files],
        source_index=np.asarray(order, dtype=np.int64),
    )


@contextlib.contextmanager
def worker_pool(workers: int) -> Iterator[Any]:
    """Lend the pool that decodes and compresses (``workers`` processes; inline for 1).

    Raises:
        H5PackError: a worker process died.
    """
    executor = make_executor(workers)
    try:
        yield executor
    except BrokenExecutor as err:
        raise H5PackError(
            "a worker process died (it crashed on a file, or was killed, e.g. for lack of "
            "memory); rerun with --workers 1 to see where"
        ) from err
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def write_files(
    target_path: Path,
    plan: StoragePlan,
    files: Sequence[SourceFile],
    table: SampleTable,
    *,
    options: ConvertOptions,
    executor: Any,
    workers: int,
    temps: TempFiles,
    skipped: list[SkippedFile],
    emit: Callable[[ConvertEvent], None],
    step: Callable[[int], None],
    overwrite: bool,
    shard: str | None = None,
    room: Callable[[int], None] | None = None,
) -> Path:
    """Decode ``files`` (in write order) in ``executor`` and publish their pack as ``target_path``.

    Files that cannot be packed are appended to ``skipped`` (or stop the conversion with
    ``strict``); ``shard`` is the identity a pack set's shard records (JSON text); ``room``
    is called first with the fewest bytes the pack will take (``min_pack_bytes``).

    Raises:
        H5PackError: the pack cannot be written (one line for a full or read-only disk).
    """
    if room is not None:
        room(min_pack_bytes(plan, files))
    reject = _rejecter(options, skipped, emit)
    arenas: list[Arena] = []
    try:
        samples_arena = blocks_arena = None
        if workers > 1:
            samples_arena = _open_arena(executor, 2 * workers, sample_slot_bytes(plan))
            if plan.spec.compressed:
                blocks_arena = _open_arena(executor, workers + 1, block_slot_bytes(plan))
            arenas.extend(a for a in (samples_arena, blocks_arena) if a is not None)
        prepared = _prepared(executor, plan, files, samples_arena, workers, reject, step)
        published = build_pack(
            target_path,
            plan,
            _room_checked(prepared, table, plan, target_path, temps, in_flight=workers + 1),
            table,
            options=options,
            workers=Workers(executor, workers + 1, blocks_arena),
            temps=temps,
            skipped=skipped,
            emit=emit,
            overwrite=overwrite,
            shard=shard,
        )
    except H5PackError as err:
        clean = _disk_error(err, target_path)
        if clean is None:
            raise
        raise clean from err
    finally:
        for arena in arenas:
            arena.close()
    temps.release_reserved(published)
    return published


def remove_leftovers_beside(target: Path, emit: Callable[[ConvertEvent], None]) -> None:
    """Remove what killed conversions left beside ``target`` and in shared memory; say so."""
    removed = remove_leftovers(target.parent) + remove_leftover_segments()
    if removed:
        message = describe_removed(removed)
        logger.warning("%s", message)
        emit(ConvertEvent("note", message))


def _open_arena(executor: Any, num_slots: int, slot_bytes: int) -> Arena | None:
    """Return an arena the workers can open (NOTE [ Memory that cannot leak ]), or None."""
    arena = Arena.maybe(num_slots, slot_bytes)
    if arena is None or not arena.anonymous:
        return arena
    if executor.submit(attachable, arena.ref(0)).result():
        return arena
    arena.close()
    return Arena.named(num_slots, slot_bytes)


# Bytes per sample of the metadata: labels (int64), shapes (3 x int32), checksums (uint32),
# source order (int64), a digest (uint64); blobs add offsets and sizes (int64 each). The
# paths count with their bytes, uncompressed; HDF5's object headers and chunk indexes with
# 1/16 on top and a fixed slack.
_SAMPLE_METADATA_BYTES = 8 + 12 + 4 + 8 + 8
_BLOB_METADATA_BYTES = 16
_METADATA_SLACK_BYTES = 2**15
# The compact index appended at publish (NOTE [ Compact index ] in core/index) copies the
# per-sample arrays and the paths once more, with a length per path and an entry per chunk:
# at most one chunk a sample, its offsets (up to 4 x int64) and its byte offset, size and
# filter mask (3 x int64); its JSON header (attributes, classes) counts in a second slack.
_INDEX_SAMPLE_BYTES = 4 + 4 * 8 + 3 * 8


def metadata_bytes(num_samples: int, path_bytes: int, *, blob: bool) -> int:
    """Return about the bytes a pack's metadata and compact index take, erring on the large side.

    Args:
        num_samples: Samples in the pack.
        path_bytes: The bytes of their paths.
        blob: Whether the pack is a blob (offsets and sizes).
    """
    per_sample = _SAMPLE_METADATA_BYTES + (_BLOB_METADATA_BYTES if blob else 0)
    data = num_samples * per_sample + path_bytes
    hdf5 = data + data // 16 + _METADATA_SLACK_BYTES
    index = data + num_samples * _INDEX_SAMPLE_BYTES + _METADATA_SLACK_BYTES
    return hdf5 + index


def min_pack_bytes(plan: StoragePlan, files: Sequence[SourceFile]) -> int:
    """Return the fewest bytes the pack of ``files`` can take (0 when nothing is sure).

    Encoded samples are the files' own bytes; uncompressed fixed-size pixels are their
    array. Compressed pixels can shrink to almost nothing, so they promise no bytes: a
    disk that fills later stops the conversion with one error instead.
    """
    if plan.mode == "encoded":
        return int(file_sizes(files).sum())
    if plan.spec.compressed:
        return 0
    if plan.spec.sample_shape is not None:
        return len(files) * math.prod(plan.spec.sample_shape)
    return plan.spec.blob_bytes or 0


def images_left_bytes(
    plan: StoragePlan, num_samples: int, sample_bytes: int, *, in_flight: int
) -> int:
    """Return the most bytes of images still to write once every sample is decoded.

    Chunked: the partial last block and, when compressing, the blocks still in the pool
    (at most ``in_flight``, the last one included), never more than all the samples'
    bytes (``sample_bytes``, with a codec's worst expansion). A contiguous blob: all of it,
    staged in a side file until then (``sample_bytes``, plus a chunk for the alignment).
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
    # The blocks in flight hold at most every sample: a small pack (or one compressed well)
    # never needs room for whole blocks it does not have (issue 20 H: 6.4 MiB asked for a
    # 2.5 MiB pack of 3.5 MiB of pixels). Codecs expand incompressible data by well under
    # 1/64 (zstd, lz4: ~0.4%; blosc: 16 bytes a block).
    bound = sample_bytes + sample_bytes // 64 + _METADATA_SLACK_BYTES
    return min(partial + (in_flight - 1) * block, bound)


def _room_checked(
    prepared: Iterable[Prepared],
    table: SampleTable,
    plan: StoragePlan,
    target: Path,
    temps: TempFiles,
    *,
    in_flight: int,
) -> Iterator[Prepared]:
    """Yield ``prepared``; once all are through, reserve the room that the rest needs.

    The rest is the images not written yet and the metadata (NOTE [ Room for the metadata ]
    in ``publish``). A contiguous array of which files were skipped is copied into a new
    file (NOTE [ Contiguous packs and skipped files ]): the room is only checked then,
    since a reservation in the old file would take the room the copy needs.
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


# errno values of a target that cannot take the pack.
_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def _disk_error(err: H5PackError, target: Path) -> H5PackError | None:
    """Return one line saying that the disk is full or read-only, if that is ``err``'s cause.

    HDF5's messages carry a timestamp, addresses and line breaks.
    """
    cause = err.__cause__
    if not isinstance(cause, OSError) or cause.errno not in _DISK_ERRORS:
        return None
    return H5PackError(
        f"writing {target} failed: {os.strerror(cause.errno)} on the file system of {target.parent}"
    )


def _logged(report: ConvertReport) -> ConvertReport:
    """Log one warning summarising the files a conversion skipped, if any."""
    if report.skipped:
        count = len(report.skipped)
        shown = "; ".join(f"{s.path}: {s.reason}" for s in report.skipped[:5])
        more = f"; and {count - 5} more" if count > 5 else ""
        logger.warning(
            "%s: skipped %d %s (recorded in the pack and in the report's skipped): %s%s",
            report.path,
            count,
            "file" if count == 1 else "files",
            shown,
            more,
        )
    return report


def _prepared(
    executor: Any,
    plan: StoragePlan,
    files: Sequence[Any],
    arena: Arena | None,
    workers: int,
    reject: Callable[[str, str], None],
    step: Callable[[int], None],
) -> Iterator[Prepared]:
    """Yield the prepared samples in write order (stage 1), reporting rejected files."""
    batch = batch_size(plan)
    slots: deque[int | None] = deque()

    def tasks() -> Iterator[tuple[Any, ...]]:
        for lo in range(0, len(files), batch):
            slot = arena.acquire() if arena is not None else None
            slots.append(slot)
            ref = arena.ref(slot) if arena is not None and slot is not None else None
            items = [
                (lo + i, os.fspath(f.path), f.relative)
                for i, f in enumerate(files[lo : lo + batch])
            ]
            yield plan.decode, items, ref

    for results in ordered_map(executor, prepare_batch, tasks(), max_in_flight=2 * workers):
        slot = slots.popleft()
        for result in results:
            if isinstance(result, Rejected):
                reject(result.path, result.reason)
                continue
            if result.span is not None:
                assert arena is not None
                assert slot is not None
                data = arena.take(slot, *result.span)
                if plan.storage == "array":
                    data = data.reshape(result.shape)
                result = replace(result, data=data, span=None)
            yield result
        if slot is not None:
            assert arena is not None
            arena.release(slot)
        step(len(results))


def probe_sizes(
    executor: Any,
    files: Sequence[Any],
    workers: int,
    emit: Callable[[ConvertEvent], None],
    step: Callable[[int], None],
) -> Counter[tuple[int, int]]:
    """Read every image's (H, W) from its header, in the pool."""
    emit(ConvertEvent("phase", "reading image sizes", total=len(files)))
    batch = 64
    tasks = (
        ([(os.fspath(f.path), f.relative) for f in files[lo : lo + batch]],)
        for lo in range(0, len(files), batch)
    )
    sizes: Counter[tuple[int, int]] = Counter()
    for results in ordered_map(executor, probe_batch, tasks, max_in_flight=2 * workers):
        sizes.update(size for size in results if size is not None)
        step(len(results))
    return sizes


Sample = np.ndarray | bytes | bytearray | memoryview


def write_arrays(
    target: StrPath,
    samples: Sequence[Sample],
    labels: Sequence[int] | np.ndarray,
    *,
    classes: Sequence[str] = (),
    paths: Sequence[str] | None = None,
    options: ConvertOptions | None = None,
    overwrite: bool = False,
    on_event: Callable[[ConvertEvent], None] | None = None,
    fields: Mapping[str | Field, Any] | None = None,
) -> ConvertReport:
    """Pack in-memory samples through the same back end as ``convert``.

    Samples are HWC (or HW for one channel) uint8 arrays, or encoded image files as bytes.
    Arrays of one size become a raw (N, H, W, C) array (resized first when
    ``options.size`` is set); arrays of several sizes a raw blob; bytes are stored as they
    are (``mode="encoded"`` or ``"auto"``) or decoded (``mode="raw"``). With
    ``options.shuffle_samples`` (the default) the samples are stored in a seeded random
    order, exactly as ``convert`` does: pack sample ``i`` is ``samples[source_index[i]]``;
    pass ``ConvertOptions(shuffle_samples=False)`` to keep the given order. Compression
    runs in this process (``options.workers`` is not used).

    Args:
        target: The pack to write.
        samples: The images.
        labels: One int per sample, ``-1`` for unlabelled.
        classes: Class names; default ``"0".."max label"``.
        paths: A name per sample (stored as its source path); default ``sample-000000``...
        options: Conversion options.
        overwrite: Replace an existing ``target``.
        on_event: Called with ``ConvertEvent``s (skipped samples, the mode chosen).
        fields: More values per sample, by field (``core.fields``): keyed by a name, the
            kind told from the values (numbers, equal-shape arrays, arrays of several
            lengths, ``str``, ``bytes``), or by a field (``MaskField("mask")``: H x W
            uint8, its image's size).

    Raises:
        OptionsError: samples, labels, classes, paths or fields do not fit together.
        DecodeError: with ``strict``, bytes that do not decode.
    """
    started = time.perf_counter()
    options = options or ConvertOptions()
    emit = on_event or (lambda event: None)
    target_path = check_target(target, overwrite=overwrite)
    remove_leftovers_beside(target_path, emit)
    num = len(samples)
    label_array = np.asarray(labels, dtype=np.int64).reshape(-1)
    names = list(paths) if paths is not None else [f"sample-{i:06d}" for i in range(num)]
    if label_array.size != num or len(names) != num:
        raise OptionsError(
            f"samples, labels and paths should have one entry each, but got {num} samples, "
            f"{label_array.size} labels and {len(names)} paths"
        )
    if num == 0:
        raise OptionsError("samples should not be empty")
    classes = tuple(classes) or tuple(str(i) for i in range(int(label_array.max()) + 1))
    if label_array.min() < -1 or label_array.max() >= len(classes):
        raise OptionsError(
            f"labels should be -1 or index the {len(classes)} classes, but got labels in "
            f"{label_array.min()}..{label_array.max()}"
        )
    extra, columns = columns_of(fields or {}, num)
    kinds = {isinstance(s, np.ndarray) for s in samples}
    if len(kinds) > 1:
        raise OptionsError("samples should be all arrays or all encoded bytes, not a mix")
    arrays = kinds == {True}
    if arrays:
        _check_arrays(samples, options.channels)
        if options.mode == "encoded":
            raise OptionsError("mode 'encoded' needs encoded bytes; these samples are arrays")
    sizes = None
    if options.mode != "encoded" and options.size is None:
        sizes = _sizes_of(samples, names)
    plan = plan_storage(
        options,
        sizes,
        num_samples=num,
        can_encode=not arrays,
        sample_bytes=lambda limit: np.asarray(
            [_nbytes(samples[i]) for i in write_order(num, options)[:limit]], dtype=np.int64
        ),
    )
    emit(ConvertEvent("mode", plan.reason))
    order = write_order(num, options)
    skipped: list[SkippedFile] = []

    def prepared() -> Iterator[Prepared]:
        for pos, index in enumerate(order):
            sample, name = samples[index], names[index]
            if isinstance(sample, np.ndarray):
                result = _prepare_array(plan, sample, name, pos)
            else:
                result = prepare_sample(plan.decode, bytes(sample), name, pos)
            if isinstance(result, Rejected):
                if options.strict:
                    raise DecodeError(f"{name}: {result.reason}")
                skipped.append(SkippedFile(name, result.reason))
                emit(ConvertEvent("skipped", f"skipped {name}: {result.reason}", path=name))
            else:
                yield result

    executor = make_executor(1)
    with sigterm_as_exit(), TempFiles(target_path) as temps:
        table = SampleTable(
            labels=label_array[order],
            classes=tuple(classes),
            paths=[names[i] for i in order],
            source_index=order,
            fields=(*LEGACY_FIELDS, *extra),
            columns={f.name: f.take(columns[f.name], order) for f in extra},
        )
        try:
            published = build_pack(
                target_path,
                plan,
                _room_checked(prepared(), table, plan, target_path, temps, in_flight=1),
                table,
                options=options,
                workers=Workers(executor, 1),
                temps=temps,
                skipped=skipped,
                emit=emit,
                overwrite=overwrite,
            )
        except H5PackError as err:
            clean = _disk_error(err, target_path)
            if clean is None:
                raise
            raise clean from err
        temps.release_reserved(published)
        report = make_report(published, plan, num, skipped, started)
    return _logged(report)


def _nbytes(sample: Sample) -> int:
    return sample.nbytes if isinstance(sample, np.ndarray | memoryview) else len(sample)


def _check_arrays(samples: Sequence[Sample], channels: int) -> None:
    for i, sample in enumerate(samples):
        assert isinstance(sample, np.ndarray)
        shape_ok = sample.ndim == 3 and sample.shape[2] == channels
        shape_ok = shape_ok or (sample.ndim == 2 and channels == 1)
        if sample.dtype != np.uint8 or not shape_ok or 0 in sample.shape:
            raise OptionsError(
                f"samples[{i}] should be an HWC uint8 array with {channels} channel(s), but "
                f"got shape {sample.shape} and dtype {sample.dtype}"
            )


def _sizes_of(samples: Sequence[Sample], names: Sequence[str]) -> Counter[tuple[int, int]]:
    from h5pack.core.decode import probe_size

    sizes: Counter[tuple[int, int]] = Counter()
    for sample, name in zip(samples, names, strict=True):
        if isinstance(sample, np.ndarray):
            sizes[(int(sample.shape[0]), int(sample.shape[1]))] += 1
            continue
        with contextlib.suppress(DecodeError):
            h, w = probe_size(bytes(sample), name=name)
            sizes[(int(h), int(w))] += 1
    return sizes


def _prepare_array(
    plan: StoragePlan, sample: np.ndarray, name: str, pos: int
) -> Prepared | Rejected:
    image = sample if sample.ndim == 3 else sample[:, :, None]
    if plan.decode.size is not None and image.shape[:2] != plan.decode.size:
        from h5pack.core.decode import resize_image

        image = resize_image(
            image,
            plan.decode.size,
            method=plan.decode.resize,
            backend=plan.decode.backend,
        )
        if image.ndim == 2:
            image = image[:, :, None]
    return prepare_pixels(plan.decode, image, name, pos)
