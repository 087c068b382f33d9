"""Streaming, parallel, crash-safe conversion of a sample source into a pack.

``convert`` lists a source, plans the storage (``plan``), decodes in a pool (``pipeline``)
and writes whole chunks once, in order (``builder``), into a hidden temporary file
published only when complete (``publish``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core.fields import Field
from h5pack.core.store import Store, open_store
from h5pack.write.dask import convert_on_dask
from h5pack.write.options import ConvertOptions
from h5pack.write.packing import probe_sizes, worker_pool, write_samples
from h5pack.write.plan import plan_storage
from h5pack.write.publish import TempFiles, check_not_a_source, check_target, sigterm_as_exit
from h5pack.write.remote import publish_staged
from h5pack.write.report import ConvertEvent, ConvertReport, make_report
from h5pack.write.shards import convert_set, in_place
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

# One summary of the skipped files per conversion, for callers without ``on_event``.
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

    ``source`` is a path whose kind is detected (``sources.sample_source``) or a source;
    ``target`` a path, or a URL (``s3://bucket/key.h5``) where the finished pack is uploaded
    from ``staging_dir`` (default ``TMPDIR``; NOTE [ Publishing in a bucket ]), with the
    bucket's ``storage_options`` the environment does not give (docs/object-storage.md) or
    its ``store``. ``progress`` is called with the steps just done in the current
    ``"phase"`` event's phase; ``on_event`` with each ``ConvertEvent``.

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
    """Pack ``source`` into the local file ``target``; ``room`` checks a staging directory."""
    options = options or ConvertOptions()
    emit = on_event or (lambda event: None)
    target_path = check_target(target, overwrite=overwrite)
    remove_leftovers_beside(target_path, emit)
    started = time.perf_counter()
    with sigterm_as_exit(), TempFiles(target_path) as temps:
        found = sample_source(source, labels_csv=options.labels_csv)
        skipped = list_source(found, options, emit)
        check_not_a_source(target_path, found.files())
        order = found.split(seed=options.seed, shuffle=options.shuffle_samples)
        samples = [found.samples[i] for i in order]
        workers = options.effective_workers if found.parallel else 1
        with worker_pool(workers, emit, progress or (lambda n: None)) as pool:
            sizes = probe_sizes(pool, samples) if needs_probe(options) else None
            plan = plan_storage(
                options,
                sizes,
                num_samples=len(samples),
                can_encode=found.encoded,
                sample_bytes=lambda limit: image_bytes(samples[:limit]),
            )
            emit(ConvertEvent("mode", plan.reason))
            emit(ConvertEvent("phase", "converting", total=len(samples)))
            table = sample_table(
                samples, found.classes, order, found.listing.fields, found.columns(order)
            )
            published = write_samples(
                target_path,
                plan,
                samples,
                table,
                pool,
                options=options,
                temps=temps,
                skipped=skipped,
                overwrite=overwrite,
                room=room,
            )
        return _logged(make_report(published, plan, len(samples), skipped, started))


def _logged(report: ConvertReport) -> ConvertReport:
    """Log one warning summarising the files a conversion skipped, if any."""
    if count := len(report.skipped):
        shown = "; ".join(f"{s.path}: {s.reason}" for s in report.skipped[:5])
        more = f"; and {count - 5} more" if count > 5 else ""
        files = "file" if count == 1 else "files"
        where = "recorded in the pack and in the report's skipped"
        logger.warning(
            "%s: skipped %d %s (%s): %s%s", report.path, count, files, where, shown, more
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
    """Pack in-memory samples (``ArraySource``) as ``convert`` does, in this process.

    ``samples`` are HWC (or HW) uint8 arrays or encoded files as bytes, with a label each
    (-1: none); ``classes`` default to ``"0".."max label"``, ``paths`` to
    ``sample-000000``...; ``fields`` holds more values per sample, keyed by a name (the
    kind told from the values) or a field (``MaskField("mask")``: H x W uint8). Samples
    are stored in a seeded random order unless ``ConvertOptions(shuffle_samples=False)``
    (pack sample ``i`` is ``samples[source_index[i]]``).

    Raises:
        OptionsError: samples, labels, classes, paths or fields do not fit together.
        DecodeError: with ``strict``, bytes that do not decode.
    """
    source = ArraySource(samples, labels, classes=classes, paths=paths, fields=fields)
    return convert_file(source, target, options, overwrite=overwrite, on_event=on_event)
