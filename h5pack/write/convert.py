"""Streaming, parallel, crash-safe conversion of a sample source into a pack.

``convert`` lists a source (``sources``: a folder, arrays...), chooses the storage
(``plan``), decodes in a pool of processes (``pipeline``) and lays the samples into whole
chunks written once and in order (``builder``, ``images``). Everything goes to a hidden
temporary file beside the target that is renamed into place only when complete; an
exception, Ctrl-C or SIGTERM removes it, and a SIGKILL leaves nothing under the target's
name. ``write_arrays`` packs in-memory samples as an ``ArraySource``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core.fields import Field
from h5pack.core.store import Store, is_url, open_store
from h5pack.write import dask as dask_module
from h5pack.write import shards as shards_module
from h5pack.write.options import ConvertOptions
from h5pack.write.packing import probe_sizes, worker_pool, write_samples
from h5pack.write.plan import plan_storage
from h5pack.write.publish import TempFiles, check_not_a_source, check_target, sigterm_as_exit
from h5pack.write.remote import publish_staged
from h5pack.write.report import ConvertEvent, ConvertReport, make_report
from h5pack.write.shards import PackSetReport
from h5pack.write.sources import ArraySource, SampleSource, sample_source
from h5pack.write.sources.base import Image, image_bytes
from h5pack.write.split import list_source, needs_probe, remove_leftovers_beside, sample_table

__all__ = [
    "ConvertEvent",
    "ConvertReport",
    "convert",
    "convert_file",
    "convert_on_dask",
    "convert_set",
    "write_arrays",
]

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
    store: Store | None = None,
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
        storage_options: For URLs (``target``, or a ``source`` in a bucket): the bucket's
            settings that the environment does not give (docs/object-storage.md).
        store: Where ``target`` is kept (instead of ``storage_options``).
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
    source = in_place(source, options, storage_options)
    store = store or open_store(target, storage_options)
    if store.remote:  # NOTE [ Stores ]
        report = publish_staged(
            store,
            os.fspath(target),
            lambda local, room: convert_file(
                source, local, options, progress=progress, on_event=on_event, room=room
            ),
            overwrite=overwrite,
            staging_dir=staging_dir,
            emit=on_event or (lambda event: None),
        )
        return replace(report, path=os.fspath(target))
    return convert_file(
        source, target, options, overwrite=overwrite, progress=progress, on_event=on_event
    )


def in_place(
    source: StrPath | SampleSource,
    options: ConvertOptions | None,
    storage_options: Mapping[str, str] | None,
) -> StrPath | SampleSource:
    """Return ``source``, or the source its URL names (NOTE [ Sources in a bucket ])."""
    if isinstance(source, SampleSource) or not is_url(source):
        return source
    labels = (options or ConvertOptions()).labels_csv
    return sample_source(source, labels_csv=labels, storage_options=storage_options)


def convert_set(
    source: StrPath | SampleSource,
    out_dir: StrPath,
    options: ConvertOptions | None = None,
    *,
    shards: int,
    only: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
    storage_options: Mapping[str, str] | None = None,
    staging_dir: StrPath | None = None,
) -> PackSetReport:
    """Pack ``source`` into a pack set of ``shards`` shards (``write.shards.convert_set``).

    ``storage_options``: for a bucket (``out_dir``, or a ``source`` in one), the settings
    the environment does not give.
    """
    return shards_module.convert_set(
        in_place(source, options, storage_options),
        out_dir,
        options,
        shards=shards,
        only=only,
        overwrite=overwrite,
        progress=progress,
        on_event=on_event,
        store=open_store(out_dir, storage_options),
        staging_dir=staging_dir,
    )


def convert_on_dask(
    client: Any,
    source: StrPath | SampleSource,
    out_dir: StrPath,
    options: ConvertOptions | None = None,
    *,
    shards: int,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
    storage_options: Mapping[str, str] | None = None,
    staging_dir: StrPath | None = None,
) -> PackSetReport:
    """Pack ``source`` into a pack set, one Dask task per shard (``write.dask.convert_on_dask``).

    ``storage_options``: for a bucket, the settings the environment does not give (the
    workers' environment is read where they run).
    """
    return dask_module.convert_on_dask(
        client,
        in_place(source, options, storage_options),
        out_dir,
        options,
        shards=shards,
        overwrite=overwrite,
        progress=progress,
        on_event=on_event,
        store=open_store(out_dir, storage_options),
        staging_dir=staging_dir,
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
