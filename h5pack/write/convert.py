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
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import BrokenExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core.format import SkippedFile
from h5pack.errors import DecodeError, H5PackError, OptionsError
from h5pack.write.arena import Arena
from h5pack.write.builder import (
    ConvertEvent,
    ConvertReport,
    SampleTable,
    Workers,
    build_pack,
    make_report,
    write_order,
)
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
from h5pack.write.publish import TempFiles, check_target, sigterm_as_exit

__all__ = ["ConvertEvent", "ConvertReport", "convert", "write_arrays"]


def convert(
    source: StrPath,
    target: StrPath,
    options: ConvertOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
) -> ConvertReport:
    """Pack the image folder ``source`` into the HDF5 file ``target``.

    Args:
        source: An ImageFolder tree, a flat folder, or any folder with ``labels_csv``.
        target: The pack to write.
        options: How to convert (default ``ConvertOptions()``).
        overwrite: Replace an existing ``target``.
        progress: Called with the number of steps just done in the current phase (see the
            ``"phase"`` event).
        on_event: Called with each ``ConvertEvent`` (skipped files, the mode chosen...).

    Returns:
        What was written.

    Raises:
        TargetExistsError: ``target`` exists and ``overwrite`` is False.
        SourceError: the source is missing or holds no image that can be packed.
        DecodeError: with ``strict``, the first file that cannot be packed.
        OptionsError: the options do not fit the images.
    """
    from h5pack.write.scan import scan

    started = time.perf_counter()
    options = options or ConvertOptions()
    emit = on_event or (lambda event: None)
    step = progress or (lambda n: None)
    target_path = check_target(target, overwrite=overwrite)
    found = scan(source, labels_csv=options.labels_csv)
    labelled = f" in {len(found.classes)} classes" if found.classes else " (unlabelled)"
    emit(
        ConvertEvent(
            "scanned",
            f"found {len(found.files)} images{labelled} under {found.root}",
            total=len(found.files),
        )
    )
    skipped: list[SkippedFile] = []

    def reject(path: str, reason: str) -> None:
        if options.strict:
            raise DecodeError(f"{path}: {reason} (--strict stops at the first bad file)")
        skipped.append(SkippedFile(path, reason))
        emit(ConvertEvent("skipped", f"skipped {path}: {reason}", path=path))

    for problem in found.problems:
        reject(problem.path, problem.reason)
    num = len(found.files)
    order = write_order(num, options)
    files = [found.files[i] for i in order]
    workers = options.effective_workers
    temps = TempFiles()
    arenas: list[Arena] = []
    with sigterm_as_exit():
        executor = make_executor(workers)
        try:
            sizes = None
            if options.mode != "encoded" and options.size is None:
                sizes = _probe(executor, files, workers, emit, step)
            plan = plan_storage(options, sizes, num_samples=num)
            emit(ConvertEvent("mode", plan.reason))
            emit(ConvertEvent("phase", "converting", total=num))
            samples_arena = blocks_arena = None
            if workers > 1:
                samples_arena = Arena.maybe(2 * workers, sample_slot_bytes(plan))
                if plan.spec.compressed:
                    blocks_arena = Arena.maybe(workers + 1, block_slot_bytes(plan))
                arenas.extend(a for a in (samples_arena, blocks_arena) if a is not None)
            prepared = _prepared(executor, plan, files, samples_arena, workers, reject, step)
            table = SampleTable(
                labels=np.asarray([f.label for f in files], dtype=np.int64),
                classes=tuple(found.classes),
                paths=[f.relative for f in files],
                source_index=order,
            )
            published = build_pack(
                target_path,
                plan,
                prepared,
                table,
                options=options,
                workers=Workers(executor, workers + 1, blocks_arena),
                temps=temps,
                skipped=skipped,
                emit=emit,
                overwrite=overwrite,
            )
        except BrokenExecutor as err:
            raise H5PackError(
                "a worker process died (it crashed on a file, or was killed, e.g. for lack of "
                "memory); rerun with --workers 1 to see where"
            ) from err
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
            for arena in arenas:
                arena.close()
            temps.remove_all()
    return make_report(published, plan, num, skipped, started)


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


def _probe(
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

    Raises:
        OptionsError: samples, labels, classes or paths do not fit together.
        DecodeError: with ``strict``, bytes that do not decode.
    """
    started = time.perf_counter()
    options = options or ConvertOptions()
    emit = on_event or (lambda event: None)
    target_path = check_target(target, overwrite=overwrite)
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
    plan = plan_storage(options, sizes, num_samples=num, can_encode=not arrays)
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

    temps = TempFiles()
    executor = make_executor(1)
    with sigterm_as_exit():
        try:
            table = SampleTable(
                labels=label_array[order],
                classes=tuple(classes),
                paths=[names[i] for i in order],
                source_index=order,
            )
            published = build_pack(
                target_path,
                plan,
                prepared(),
                table,
                options=options,
                workers=Workers(executor, 1),
                temps=temps,
                skipped=skipped,
                emit=emit,
                overwrite=overwrite,
            )
        finally:
            temps.remove_all()
    return make_report(published, plan, num, skipped, started)


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
