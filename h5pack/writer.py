"""Streaming, parallel, crash-safe conversion of an image folder (or arrays) into a pack.

``convert`` scans a folder, chooses the storage, decodes in a pool of processes
(``pipeline``) and lays the samples into whole chunks written once and in order
(``storage``). Everything goes to a hidden temporary file beside the target that is renamed
into place only when complete; an exception, Ctrl-C or SIGTERM removes it, and a SIGKILL
leaves nothing under the target's name. ``write_arrays`` packs in-memory samples through
the same back end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np

from h5pack import __version__
from h5pack import format as fmt
from h5pack._types import StrPath
from h5pack.errors import DecodeError, OptionsError, SourceError, TargetExistsError
from h5pack.format import SkippedFile
from h5pack.layout import DEFAULT_CHUNK_BYTES, array_chunk_shape, chunk_samples_for
from h5pack.options import ConvertOptions
from h5pack.pipeline import (
    DecodeSpec,
    Prepared,
    Rejected,
    compress_block,
    make_executor,
    ordered_map,
    prepare_batch,
    prepare_pixels,
    prepare_sample,
    probe_batch,
    release_core,
)
from h5pack.storage import ArrayAssembler, BlobAssembler, Block, ImagesSpec, ImagesWriter
from h5pack.storage import copy_array_rows as _copy_rows

EventKind = Literal["scanned", "phase", "mode", "skipped", "note"]


@dataclass(frozen=True)
class ConvertEvent:
    """Something a user should hear about during a conversion (the CLI renders it).

    Attributes:
        kind: ``"scanned"`` (the source was scanned), ``"phase"`` (a stage with ``total``
            steps starts; ``progress`` then counts them), ``"mode"`` (the storage chosen
            and why), ``"skipped"`` (a file left out; ``path`` names it), ``"note"``.
        message: One line of text.
        total: Steps of a phase.
        path: The file concerned.
    """

    kind: EventKind
    message: str
    total: int | None = None
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConvertReport:
    """What a conversion did.

    Attributes:
        path: The pack written.
        meta: Its metadata, as a reader sees it.
        num_samples: Samples packed.
        num_found: Files found by the scan (or samples given).
        skipped: Files left out, and why (sorted by path).
        mode: ``"raw"`` or ``"encoded"``.
        storage: ``"array"`` or ``"blob"``.
        reason: Why this mode and storage.
        elapsed_s: Wall time of the whole conversion.
        file_bytes: Size of the pack.
    """

    path: str
    meta: fmt.PackMeta
    num_samples: int
    num_found: int
    skipped: tuple[SkippedFile, ...]
    mode: str
    storage: str
    reason: str
    elapsed_s: float
    file_bytes: int

    @property
    def images_per_s(self) -> float:
        """Files processed per second, over the whole conversion."""
        return self.num_found / self.elapsed_s if self.elapsed_s > 0 else float("inf")


@dataclass(frozen=True)
class StoragePlan:
    """The resolved storage of a conversion: what workers make and how it is laid out."""

    mode: Literal["raw", "encoded"]
    spec: ImagesSpec
    decode: DecodeSpec
    group_samples: int
    chunk_bytes: int
    reason: str

    @property
    def storage(self) -> Literal["array", "blob"]:
        """``"array"`` or ``"blob"``."""
        return self.spec.storage


def _size_text(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def plan_storage(
    options: ConvertOptions,
    sizes: Counter[tuple[int, int]] | None,
    *,
    num_samples: int,
    can_encode: bool = True,
) -> StoragePlan:
    """Choose mode, storage and chunks from the options and the images' (H, W) sizes.

    Args:
        options: The conversion options.
        sizes: How many images have each (H, W), from their headers; None when not needed
            (``size`` given, or encoded mode).
        num_samples: Samples to pack (the automatic chunk never holds more).
        can_encode: Whether the samples have encoded bytes (not so for arrays).

    Raises:
        OptionsError: the options do not fit the images (e.g. ``chunk_samples`` for images
            of several sizes, which are stored as a blob chunked by bytes).
    """
    channels = options.channels
    sizes = sizes if sizes is not None else Counter()
    common = next(iter(sizes)) if len(sizes) == 1 else None
    if options.mode == "encoded" or (
        options.mode == "auto" and options.size is None and can_encode and len(sizes) > 1
    ):
        mode: Literal["raw", "encoded"] = "encoded"
        if options.mode == "encoded":
            reason = "encoded mode: the files' bytes are stored as they are"
        else:
            examples = ", ".join(_size_text(s) for s, _ in sizes.most_common(2))
            reason = (
                f"auto mode chose encoded (original file bytes): the images come in "
                f"{len(sizes)} sizes (e.g. {examples}); pass --size H W to store raw pixels"
            )
        if options.max_side is not None:
            reason += f"; files over {options.max_side} px are re-encoded to JPEG"
        shape = None
    else:
        mode = "raw"
        prefix = "auto mode chose raw pixels" if options.mode == "auto" else "raw mode"
        if options.size is not None:
            shape = (*options.size, channels)
            reason = f"{prefix}: every image is resized to {_size_text(options.size)}"
        elif common is not None:
            shape = (*common, channels)
            reason = f"{prefix}: all {num_samples} images are {_size_text(common)}"
        else:
            shape = None
            reason = (
                f"{prefix}: the images come in {len(sizes)} sizes, so pixels are stored at "
                "their original sizes (a byte blob with shapes); pass --size H W for one size"
            )
    if shape is None:
        return _blob_plan(options, mode, reason)
    sample_shape: tuple[int, int, int] = (int(shape[0]), int(shape[1]), int(shape[2]))
    decode = DecodeSpec(
        mode="raw",
        size=options.size,
        resize=options.resize,
        channels=channels,
        backend=options.backend,
        fixed_shape=sample_shape,
    )
    sample_bytes = sample_shape[0] * sample_shape[1] * sample_shape[2]
    if options.layout == "contiguous":
        spec = ImagesSpec("array", sample_shape, None)
        group = chunk_samples_for(sample_bytes, DEFAULT_CHUNK_BYTES)
        return StoragePlan(mode, spec, decode, group, 0, reason)
    chunks = array_chunk_shape(
        sample_shape,
        chunk_samples=options.chunk_samples,
        chunk_shape=options.chunk_shape,
        chunk_bytes=options.chunk_bytes,
    )
    if options.chunk_samples is None and options.chunk_shape is None:
        # A chunk sized from a byte target never holds more samples than the pack.
        chunks = (max(1, min(chunks[0], num_samples)), *chunks[1:])
    spec = ImagesSpec("array", sample_shape, chunks, options.compression)
    return StoragePlan(mode, spec, decode, chunks[0], 0, reason)


def _blob_plan(
    options: ConvertOptions, mode: Literal["raw", "encoded"], reason: str
) -> StoragePlan:
    if options.chunk_samples is not None or options.chunk_shape is not None:
        raise OptionsError(
            "these images are stored as one byte blob chunked by bytes (they differ in size), "
            "so --chunk-samples/--chunk-shape do not apply: use --chunk-bytes, or --size H W "
            "for a fixed-size array"
        )
    chunk_bytes = options.target_chunk_bytes
    chunks = None if options.layout == "contiguous" else (chunk_bytes,)
    spec = ImagesSpec("blob", None, chunks, options.compression)
    decode = DecodeSpec(
        mode=mode,
        flat=True,
        channels=options.channels,
        backend=options.backend,
        max_side=options.max_side,
        quality=options.effective_quality,
    )
    return StoragePlan(mode, spec, decode, 0, chunk_bytes, reason)


# -- the temporary file -----------------------------------------------------------------


def check_target(target: StrPath, *, overwrite: bool) -> Path:
    """Return the target path, refusing an existing one unless ``overwrite``.

    Raises:
        TargetExistsError: the target exists and ``overwrite`` is False.
        OptionsError: the target is a directory.
    """
    path = Path(target)
    if path.is_dir():
        raise OptionsError(f"{path} is a directory; give the pack's file name, e.g. {path}/out.h5")
    if path.exists() and not overwrite:
        raise TargetExistsError(f"{path} already exists; pass --overwrite to replace it")
    return path


def temp_path(target: Path, tag: str = "") -> Path:
    """Return the hidden temporary name beside ``target`` for this process."""
    return target.parent / f".{target.name}.{os.getpid()}{tag}.tmp"


class _TempFiles:
    """Temporary files of one conversion, removed unless published."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def add(self, path: Path) -> Path:
        self.paths.append(path)
        return path

    def remove_all(self) -> None:
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _publish(temp: Path, target: Path, *, overwrite: bool) -> None:
    """Move the finished file into place (atomically; without overwrite, never clobbering)."""
    if overwrite:
        os.replace(temp, target)
        return
    try:
        os.link(temp, target)  # fails if the target appeared meanwhile
    except FileExistsError as err:
        raise TargetExistsError(f"{target} appeared during the conversion; not replaced") from err
    except OSError:  # no hard links on this file system
        if target.exists():
            raise TargetExistsError(
                f"{target} appeared during the conversion; not replaced"
            ) from None
        os.replace(temp, target)
        return
    temp.unlink()


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(143)`` so that ``finally`` blocks clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the back end -----------------------------------------------------------------------


@dataclass
class _Record:
    """Per-sample metadata gathered while writing, in pack order."""

    positions: list[int] = field(default_factory=list)
    shapes: list[tuple[int, int, int]] = field(default_factory=list)
    crcs: list[int] = field(default_factory=list)


class _PackBuilder:
    """Write the images of a pack, then its metadata; owns the open temporary file."""

    def __init__(self, path: Path, plan: StoragePlan, *, allocate: int, temps: _TempFiles) -> None:
        self.path = path
        self.plan = plan
        self.temps = temps
        self.record = _Record()
        self.handle = h5py.File(temps.add(path), "w", libver="latest")
        staging = None
        if plan.spec.chunks is None and plan.storage == "blob":
            staging = temps.add(path.with_name(path.name + ".blob"))
        self.images = ImagesWriter(
            self.handle, fmt.IMAGES, plan.spec, allocate=allocate, staging=staging
        )
        self.assembler: ArrayAssembler | BlobAssembler
        if plan.storage == "array":
            assert plan.spec.sample_shape is not None
            self.assembler = ArrayAssembler(plan.spec.sample_shape, plan.group_samples)
        else:
            self.assembler = BlobAssembler(plan.chunk_bytes)

    def _blocks(self, prepared: Iterable[Prepared]) -> Iterator[Block]:
        record = self.record
        for item in prepared:
            record.positions.append(item.pos)
            record.shapes.append(item.shape)
            record.crcs.append(item.crc)
            yield from self.assembler.add(item.data)
        yield from self.assembler.finish()

    def write(self, prepared: Iterable[Prepared], executor: Any, max_in_flight: int) -> None:
        """Write every prepared sample, compressing blocks through ``executor``."""
        blocks = self._blocks(prepared)
        if not self.plan.spec.compressed:
            for block in blocks:
                self.images.write_block(block)
            return
        spans: deque[tuple[int, int]] = deque()

        def tasks() -> Iterator[tuple[ImagesSpec, int, np.ndarray]]:
            for block in blocks:
                spans.append((block.start, len(block.data)))
                yield self.images.spec_for(block), block.start, block.data

        for chunks in ordered_map(executor, compress_block, tasks(), max_in_flight=max_in_flight):
            start, length = spans.popleft()
            self.images.write_chunks(start, length, chunks)

    def finish(
        self,
        *,
        labels: np.ndarray,
        classes: Sequence[str],
        paths: Sequence[str],
        source_index: np.ndarray,
        options: ConvertOptions,
        skipped: Sequence[SkippedFile],
    ) -> Path:
        """Complete the images and write the metadata; return the finished file's path."""
        num = len(self.record.positions)
        self.images.finish()
        if self.images.needs_rebuild:
            self._rebuild(num)
        handle = self.handle
        pos = np.asarray(self.record.positions, dtype=np.int64)
        _write_metadata(
            handle,
            plan=self.plan,
            labels=labels[pos] if num else np.zeros(0, np.int64),
            classes=classes,
            paths=[paths[p] for p in pos],
            shapes=np.asarray(self.record.shapes, dtype=np.int32).reshape(num, 3),
            crcs=np.asarray(self.record.crcs, dtype=np.uint32),
            source_index=source_index[pos] if num else np.zeros(0, np.int64),
            options=options,
            skipped=skipped,
            blob=self.assembler if isinstance(self.assembler, BlobAssembler) else None,
            chunk_bytes=_final_chunk_bytes(self.images.spec, self.plan),
        )
        handle.close()
        return self.path

    def _rebuild(self, num: int) -> None:
        """Copy a contiguous array allocated for every scanned file into one of ``num`` rows.

        NOTE [ Contiguous packs and skipped files ]: a contiguous dataset cannot be resized,
        and the sample count is known only once every file is decoded. The array is
        allocated for all scanned files (the common case: nothing skipped) and, when files
        were skipped, copied into a fresh temporary file of the exact size.
        """
        fresh_path = self.temps.add(self.path.with_name(self.path.name + ".rebuilt"))
        fresh = h5py.File(fresh_path, "w", libver="latest")
        dataset = self.plan.spec.create(fresh, fmt.IMAGES, num)
        _copy_rows(self.handle[fmt.IMAGES], dataset, num)
        self.handle.close()
        self.path.unlink()
        self.handle = fresh
        self.path = fresh_path

    def close(self) -> None:
        """Close the file (after an error)."""
        self.images.abort()
        if self.handle.id.valid:
            self.handle.close()


def _final_chunk_bytes(spec: ImagesSpec, plan: StoragePlan) -> int:
    if spec.storage != "blob":
        return 0
    return int(spec.chunks[0]) if spec.chunks is not None else plan.chunk_bytes


def _write_metadata(
    handle: h5py.File,
    *,
    plan: StoragePlan,
    labels: np.ndarray,
    classes: Sequence[str],
    paths: Sequence[str],
    shapes: np.ndarray,
    crcs: np.ndarray,
    source_index: np.ndarray,
    options: ConvertOptions,
    skipped: Sequence[SkippedFile],
    blob: BlobAssembler | None,
    chunk_bytes: int,
) -> None:
    num = len(paths)
    handle.create_dataset(fmt.LABELS, data=np.asarray(labels, dtype=np.int64).reshape(num))
    handle.create_dataset(
        fmt.CLASSES, data=np.array(list(classes), dtype=object), dtype=fmt.UTF8_STR
    )
    encoded = np.empty(num, dtype=object)
    for i, relative in enumerate(paths):
        encoded[i] = fmt.encode_path(relative)
    # Built element by element: paths of one length would otherwise stack into a 2-D array.
    handle.create_dataset(fmt.PATHS, data=encoded, dtype=fmt.PATH_BYTES)
    handle.create_dataset(fmt.SHAPES, data=shapes)
    handle.create_dataset(fmt.CHECKSUMS, data=crcs.reshape(num))
    handle.create_dataset(fmt.SOURCE_INDEX, data=np.asarray(source_index, np.int64).reshape(num))
    if blob is not None:
        handle.create_dataset(fmt.OFFSETS, data=blob.final_offsets())
        handle.create_dataset(fmt.SIZES, data=np.asarray(blob.sizes, dtype=np.int64))
    attrs = handle.attrs
    attrs[fmt.FORMAT_MARKER_KEY] = fmt.FORMAT_MARKER
    attrs[fmt.FORMAT_VERSION_KEY] = fmt.FORMAT_VERSION
    attrs[fmt.MODE_KEY] = plan.mode
    attrs[fmt.STORAGE_KEY] = plan.storage
    attrs[fmt.NUM_SAMPLES_KEY] = num
    attrs[fmt.CHANNELS_KEY] = options.channels
    attrs[fmt.TOOL_VERSION_KEY] = __version__
    attrs[fmt.CREATED_KEY] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    attrs[fmt.OPTIONS_KEY] = json.dumps(options.to_json(), sort_keys=True)
    attrs[fmt.SKIPPED_KEY] = json.dumps([{"path": s.path, "reason": s.reason} for s in skipped])
    attrs[fmt.CHUNK_BYTES_KEY] = chunk_bytes


# -- public entry points ----------------------------------------------------------------


def _batch_size(plan: StoragePlan) -> int:
    """Files per stage-1 task: large enough to amortise the hand-off, small enough to balance."""
    if plan.storage == "array":
        return max(1, min(32, plan.group_samples // 2))
    return 16 if plan.mode == "encoded" else 4


def _no_samples(num_found: int, skipped: Sequence[SkippedFile]) -> SourceError:
    first = skipped[0] if skipped else None
    detail = f" (e.g. {first.path}: {first.reason})" if first else ""
    return SourceError(f"none of the {num_found} images could be packed{detail}")


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
    from h5pack.scan import scan

    started = time.perf_counter()
    options = options or ConvertOptions()
    emit = on_event or (lambda event: None)
    step = progress or (lambda n: None)
    target_path = check_target(target, overwrite=overwrite)
    found = scan(source, labels_csv=options.labels_csv)
    emit(
        ConvertEvent(
            "scanned",
            f"found {len(found.files)} images"
            + (f" in {len(found.classes)} classes" if found.classes else " (unlabelled)")
            + f" under {found.root}",
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
    order = _write_order(num, options)
    files = [found.files[i] for i in order]
    workers = options.effective_workers
    temps = _TempFiles()
    with _sigterm_as_exit():
        executor = make_executor(workers)
        try:
            sizes = None
            if options.mode != "encoded" and options.size is None:
                sizes = _probe(executor, files, workers, emit, step)
            plan = plan_storage(options, sizes, num_samples=num)
            emit(ConvertEvent("mode", plan.reason))
            emit(ConvertEvent("phase", "converting", total=num))
            items = [(pos, os.fspath(f.path), f.relative) for pos, f in enumerate(files)]
            batch = _batch_size(plan)

            def prepared() -> Iterator[Prepared]:
                tasks = (
                    (plan.decode, items[lo : lo + batch]) for lo in range(0, len(items), batch)
                )
                for results in ordered_map(
                    executor, prepare_batch, tasks, max_in_flight=2 * workers
                ):
                    for result in results:
                        if isinstance(result, Rejected):
                            reject(result.path, result.reason)
                        else:
                            yield result
                    step(len(results))

            published = _build(
                target_path,
                plan,
                prepared(),
                temps=temps,
                executor=executor,
                max_in_flight=workers + 1,
                allocate=num,
                labels=np.asarray([f.label for f in files], dtype=np.int64),
                classes=found.classes,
                paths=[f.relative for f in files],
                source_index=order,
                options=options,
                skipped=skipped,
                emit=emit,
                overwrite=overwrite,
            )
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
            temps.remove_all()
    return _report(published, plan, num, skipped, started)


def _write_order(num: int, options: ConvertOptions) -> np.ndarray:
    """Return the scan positions in write order (a seeded permutation, or the scan order)."""
    if options.shuffle_samples:
        return np.random.default_rng(options.seed).permutation(num).astype(np.int64)
    return np.arange(num, dtype=np.int64)


def _probe(
    executor: Any,
    files: Sequence[Any],
    workers: int,
    emit: Callable[[ConvertEvent], None],
    step: Callable[[int], None],
) -> Counter[tuple[int, int]]:
    """Read every image's (H, W) from its header, in the pool."""
    emit(ConvertEvent("phase", "reading image sizes", total=len(files)))
    items = [(os.fspath(f.path), f.relative) for f in files]
    batch = 64
    tasks = ((items[lo : lo + batch],) for lo in range(0, len(items), batch))
    sizes: Counter[tuple[int, int]] = Counter()
    for results in ordered_map(executor, probe_batch, tasks, max_in_flight=2 * workers):
        sizes.update(size for size in results if size is not None)
        step(len(results))
    return sizes


def _build(
    target: Path,
    plan: StoragePlan,
    prepared: Iterable[Prepared],
    *,
    temps: _TempFiles,
    executor: Any,
    max_in_flight: int,
    allocate: int,
    labels: np.ndarray,
    classes: Sequence[str],
    paths: Sequence[str],
    source_index: np.ndarray,
    options: ConvertOptions,
    skipped: list[SkippedFile],
    emit: Callable[[ConvertEvent], None],
    overwrite: bool,
) -> Path:
    """Write a pack to a temporary file and publish it as ``target``."""
    builder = _PackBuilder(temp_path(target), plan, allocate=allocate, temps=temps)
    try:
        builder.write(prepared, executor, max_in_flight)
        if not builder.record.positions:
            raise _no_samples(allocate, skipped)
        if builder.images.needs_rebuild:
            emit(
                ConvertEvent(
                    "note", "files were skipped: copying the contiguous array to its final size"
                )
            )
        skipped.sort(key=lambda s: os.fsencode(s.path))
        finished = builder.finish(
            labels=labels,
            classes=classes,
            paths=paths,
            source_index=source_index,
            options=options,
            skipped=skipped,
        )
    finally:
        builder.close()
        release_core()
    _publish(finished, target, overwrite=overwrite)
    return target


def _report(
    path: Path, plan: StoragePlan, num_found: int, skipped: Sequence[SkippedFile], started: float
) -> ConvertReport:
    meta = fmt.load_meta(path)
    return ConvertReport(
        path=os.fspath(path),
        meta=meta,
        num_samples=meta.num_samples,
        num_found=num_found,
        skipped=tuple(skipped),
        mode=plan.mode,
        storage=plan.storage,
        reason=plan.reason,
        elapsed_s=time.perf_counter() - started,
        file_bytes=path.stat().st_size,
    )


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
    order = _write_order(num, options)
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

    temps = _TempFiles()
    executor = make_executor(1)
    with _sigterm_as_exit():
        try:
            published = _build(
                target_path,
                plan,
                prepared(),
                temps=temps,
                executor=executor,
                max_in_flight=1,
                allocate=num,
                labels=label_array[order],
                classes=classes,
                paths=[names[i] for i in order],
                source_index=order,
                options=options,
                skipped=skipped,
                emit=emit,
                overwrite=overwrite,
            )
        finally:
            temps.remove_all()
    return _report(published, plan, num, skipped, started)


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
    from h5pack.decode import probe_size

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
        from h5pack.decode import resize_image

        image = resize_image(
            image,
            plan.decode.size,
            method=plan.decode.resize,  # type: ignore[arg-type]
            backend=plan.decode.backend,  # type: ignore[arg-type]
        )
        if image.ndim == 2:
            image = image[:, :, None]
    return prepare_pixels(plan.decode, image, name, pos)
