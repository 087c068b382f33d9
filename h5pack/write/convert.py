"""Streaming, parallel, crash-safe conversion of a sample source into a pack.

``convert`` lists a source (``sources``: a folder, arrays...), chooses the storage
(``plan``), decodes in a pool of processes (``pipeline``) and lays the samples into whole
chunks written once and in order (``builder``, ``images``). Everything goes to a hidden
temporary file beside the target that is renamed into place only when complete; an
exception, Ctrl-C or SIGTERM removes it, and a SIGKILL leaves nothing under the target's
name. ``write_arrays`` packs in-memory samples as an ``ArraySource``.
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
from h5pack.core.fields import LEGACY_FIELDS, Field
from h5pack.core.format import SkippedFile
from h5pack.errors import DecodeError, H5PackError
from h5pack.write.arena import Arena, attachable
from h5pack.write.builder import (
    ConvertEvent,
    ConvertReport,
    SampleTable,
    Workers,
    build_pack,
    make_report,
)
from h5pack.write.leftovers import describe_removed, remove_leftover_segments, remove_leftovers
from h5pack.write.options import ConvertOptions
from h5pack.write.pipeline import (
    Prepared,
    Rejected,
    make_executor,
    ordered_map,
    prepare_batch,
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
from h5pack.write.scan import group_problems, name_paths
from h5pack.write.sources import ArraySource, Sample, SampleSource, sample_source
from h5pack.write.sources.base import Image, image_bytes
from h5pack.write.upload import is_url

__all__ = ["ConvertEvent", "ConvertReport", "convert", "convert_file", "write_arrays"]

# Skipped files are also reported here (one summary per conversion), for Python callers
# who do not pass ``on_event``; the CLI renders the events instead.
logger = logging.getLogger("h5pack")


def convert(
    source: StrPath | SampleSource,
    target: StrPath,
    options: ConvertOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
    storage_options: Mapping[str, str] | None = None,
    staging_dir: StrPath | None = None,
) -> ConvertReport:
    """Pack the images of ``source`` into the HDF5 file ``target``.

    Args:
        source: A path whose kind is detected (``sources.sample_source``: an ImageFolder
            tree, a flat folder, or any folder with ``labels_csv``), or a ``SampleSource``.
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
    source: StrPath | SampleSource,
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
    source: StrPath | SampleSource,
    target_path: Path,
    options: ConvertOptions,
    temps: TempFiles,
    overwrite: bool,
    emit: Callable[[ConvertEvent], None],
    step: Callable[[int], None],
    *,
    room: Callable[[int], None] | None = None,
) -> ConvertReport:
    """List ``source`` and write the pack (``convert``, inside its lock and signal handler)."""
    started = time.perf_counter()
    found = sample_source(source, labels_csv=options.labels_csv)
    skipped = list_source(found, options, emit)
    check_not_a_source(target_path, found.files())
    order = found.split(seed=options.seed, shuffle=options.shuffle_samples)
    samples = [found.samples[i] for i in order]
    workers = options.effective_workers if found.parallel else 1
    with worker_pool(workers) as executor:
        sizes = (
            probe_sizes(executor, samples, workers, emit, step) if needs_probe(options) else None
        )
        plan = plan_storage(
            options,
            sizes,
            num_samples=len(samples),
            can_encode=found.encoded,
            sample_bytes=lambda limit: image_bytes(samples[:limit]),
        )
        emit(ConvertEvent("mode", plan.reason))
        emit(ConvertEvent("phase", "converting", total=len(samples)))
        published = write_samples(
            target_path,
            plan,
            samples,
            sample_table(samples, found.classes, order, found.listing.fields, found.columns(order)),
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
    return make_report(published, plan, len(samples), skipped, started)


def list_source(
    source: SampleSource, options: ConvertOptions, emit: Callable[[ConvertEvent], None]
) -> list[SkippedFile]:
    """List ``source``; return the entries it left out (announced through ``emit``).

    Raises:
        SourceError: the source is missing or holds no image.
        DecodeError: with ``strict``, the first entry the listing left out.
        OptionsError: the options do not fit the source's samples.
    """
    num = len(source.samples)
    source.check(options)
    labelled = f" in {len(source.classes)} classes" if source.classes else " (unlabelled)"
    emit(ConvertEvent("scanned", f"found {num} images{labelled} under {source.root}", total=num))
    for note in source.notes:
        emit(ConvertEvent("skipped", note))
    skipped: list[SkippedFile] = []
    # One warning per kind of problem (a hundred stray files make one line), every entry
    # recorded.
    for reason, paths in group_problems(source.problems):
        if options.strict:
            _rejecter(options, skipped, emit)(paths[0], reason)
        skipped.extend(SkippedFile(path, reason) for path in paths)
        emit(ConvertEvent("skipped", f"skipped {name_paths(paths)}: {reason}", path=paths[0]))
    return skipped


def _rejecter(
    options: ConvertOptions, skipped: list[SkippedFile], emit: Callable[[ConvertEvent], None]
) -> Callable[[str, str], None]:
    """Return what a conversion does with a sample it cannot pack: record it, or stop."""

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
    samples: Sequence[Sample],
    classes: Sequence[str],
    order: np.ndarray,
    fields: tuple[Field, ...] = (),
    columns: Mapping[str, Any] | None = None,
) -> SampleTable:
    """Return the table of ``samples`` in write order.

    ``order`` are their source positions; ``fields`` the stored fields besides image, label
    and key, with their ``columns`` in write order (``SampleSource.columns``).
    """
    return SampleTable(
        labels=np.asarray([s.label for s in samples], dtype=np.int64),
        classes=tuple(classes),
        paths=[s.key for s in samples],
        source_index=np.asarray(order, dtype=np.int64),
        fields=(*LEGACY_FIELDS, *fields),
        columns=dict(columns or {}),
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


def write_samples(
    target_path: Path,
    plan: StoragePlan,
    samples: Sequence[Sample],
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
    """Decode ``samples`` (in write order) in ``executor``; publish their pack as ``target_path``.

    Samples that cannot be packed are appended to ``skipped`` (or stop the conversion with
    ``strict``); ``shard`` is the identity a pack set's shard records (JSON text); ``room``
    is called first with the fewest bytes the pack will take (``min_pack_bytes``).

    Raises:
        H5PackError: the pack cannot be written (one line for a full or read-only disk).
    """
    if room is not None:
        room(min_pack_bytes(plan, samples))
    reject = _rejecter(options, skipped, emit)
    arenas: list[Arena] = []
    try:
        samples_arena = blocks_arena = None
        if workers > 1:
            samples_arena = _open_arena(executor, 2 * workers, sample_slot_bytes(plan))
            if plan.spec.compressed:
                blocks_arena = _open_arena(executor, workers + 1, block_slot_bytes(plan))
            arenas.extend(a for a in (samples_arena, blocks_arena) if a is not None)
        prepared = _prepared(executor, plan, samples, samples_arena, workers, reject, step)
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


def min_pack_bytes(plan: StoragePlan, samples: Sequence[Sample]) -> int:
    """Return the fewest bytes the pack of ``samples`` can take (0 when nothing is sure).

    Encoded samples are the files' own bytes; uncompressed fixed-size pixels are their
    array. Compressed pixels can shrink to almost nothing, so they promise no bytes: a
    disk that fills later stops the conversion with one error instead.
    """
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
    samples: Sequence[Sample],
    arena: Arena | None,
    workers: int,
    reject: Callable[[str, str], None],
    step: Callable[[int], None],
) -> Iterator[Prepared]:
    """Yield the prepared samples in write order (stage 1), reporting rejected files."""
    batch = batch_size(plan)
    slots: deque[int | None] = deque()

    def tasks() -> Iterator[tuple[Any, ...]]:
        for lo in range(0, len(samples), batch):
            slot = arena.acquire() if arena is not None else None
            slots.append(slot)
            ref = arena.ref(slot) if arena is not None and slot is not None else None
            items = [(lo + i, s.image, s.key) for i, s in enumerate(samples[lo : lo + batch])]
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
    samples: Sequence[Sample],
    workers: int,
    emit: Callable[[ConvertEvent], None],
    step: Callable[[int], None],
) -> Counter[tuple[int, int]]:
    """Read every image's (H, W) from its header, in the pool."""
    emit(ConvertEvent("phase", "reading image sizes", total=len(samples)))
    batch = 64
    tasks = (
        ([(s.image, s.key) for s in samples[lo : lo + batch]],)
        for lo in range(0, len(samples), batch)
    )
    sizes: Counter[tuple[int, int]] = Counter()
    for results in ordered_map(executor, probe_batch, tasks, max_in_flight=2 * workers):
        sizes.update(size for size in results if size is not None)
        step(len(results))
    return sizes


def write_arrays(
    target: StrPath,
    samples: Sequence[Image],
    labels: Sequence[int] | np.ndarray,
    *,
    classes: Sequence[str] = (),
    paths: Sequence[str] | None = None,
    options: ConvertOptions | None = None,
    overwrite: bool = False,
    on_event: Callable[[ConvertEvent], None] | None = None,
    fields: Mapping[str | Field, Any] | None = None,
) -> ConvertReport:
    """Pack in-memory samples through the same back end as ``convert`` (``ArraySource``).

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
    source = ArraySource(samples, labels, classes=classes, paths=paths, fields=fields)
    return convert_file(source, target, options, overwrite=overwrite, on_event=on_event)
