"""Merge packs (the shards of a pack set, or any list of packs) into one pack.

``merge_packs`` copies the shards' stored chunks as they are, without decompressing them
(HDF5's direct chunk read and write), concatenates and re-indexes their metadata, and
publishes the merged pack atomically (``write.publish``).

NOTE [ Merging by chunks ]: a chunk is copied as it is only where it lands on a chunk
boundary of the merged dataset (``write/mergecopy.py``). A chunked blob: every shard starts
on a chunk boundary (the rest of its last chunk pads its last slot); a shard shorter than
one chunk got a chunk of its own length, and is laid out again in the largest shard's
chunk. A fixed-size array: every shard's whole chunks are copied in order and the rows of
the partial last chunks go to the end, re-chunked (``tails_last_order``); ``keep_order``
re-chunks every row after the first such shard instead. Contiguous datasets are copied in
blocks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack._version import __version__
from h5pack.core import format as fmt
from h5pack.core.fields import fields_of, stored_fields
from h5pack.core.format import PackMeta
from h5pack.core.packset import is_packset, pack_paths
from h5pack.core.record import PackRecord, skipped_text, write_record
from h5pack.core.store import Store, open_store
from h5pack.errors import H5PackError, OptionsError
from h5pack.write.builder import create_file
from h5pack.write.mergecopy import (
    BlobPlan,
    Counts,
    create_like,
    merge_images,
    plan_blob,
    tails_last_order,
)
from h5pack.write.mergesources import Shard, load_shards, merge_with_urls
from h5pack.write.publish import (
    TempFiles,
    check_not_a_source,
    check_room,
    check_target,
    publish,
    sigterm_as_exit,
    temp_path,
)
from h5pack.write.report import ConvertEvent
from h5pack.write.split import remove_leftovers_beside

VIRTUAL_RETIRED = (
    "virtual packs (merge --virtual, merge_packs(virtual=True)) are retired: read the "
    "shards' directory (its packset.json) as a pack set, one view with no copy, or merge "
    "without --virtual to write one pack"
)


@dataclass(frozen=True, kw_only=True)
class MergeReport:
    """What a merge did (NOTE [ Merging by chunks ]).

    ``chunks_copied`` were copied as stored, ``chunks_rechunked`` decompressed and written
    again, ``bytes_copied`` copied from contiguous datasets; ``moved_to_end`` samples of
    fixed-size arrays went to the end (the rows of the shards' partial last chunks).
    """

    path: str
    meta: PackMeta
    num_samples: int
    sources: tuple[str, ...]
    chunks_copied: int
    chunks_rechunked: int
    bytes_copied: int
    moved_to_end: int
    elapsed_s: float
    file_bytes: int


def _merge_meta(shards: Sequence[Shard], blob: BlobPlan | None) -> PackRecord:
    """Return the merged pack's record; mode, storage, channels and options are the first's."""
    metas = [s.meta for s in shards]
    first = metas[0]
    skipped = sorted((s for m in metas for s in m.skipped), key=lambda s: os.fsencode(s.path))
    arrays: dict[str, np.ndarray] = {}
    for spec in fmt.SAMPLE_ARRAYS:  # NOTE [ Per-sample arrays ]
        held = [m.sample_arrays().get(spec.name) for m in metas]
        # an optional array that one pack lacks (XXH3 written without xxhash) leaves the
        # merged pack without it: CRC32 only
        present = [p for p in held if p is not None]
        if spec.joins and present and len(present) == len(held):
            arrays[spec.name] = np.concatenate(present)
    arrays[fmt.SOURCE_INDEX] = _source_index(metas)
    if blob is not None:
        parts = [local[:-1] + base for local, base in zip(blob.offsets, blob.bases, strict=True)]
        parts.append(np.array([blob.bases[-1] + int(blob.offsets[-1][-1])], dtype=np.int64))
        arrays[fmt.OFFSETS] = np.concatenate(parts).astype(np.int64)
        sizes = [m.sizes for m in metas if m.sizes is not None]
        arrays[fmt.SIZES] = np.concatenate(sizes).astype(np.int64)
    return PackRecord(
        mode=first.mode,
        storage=first.storage,
        channels=first.channels,
        classes=first.classes,
        paths=[p for s in shards for p in s.paths],
        arrays=arrays,
        texts={
            fmt.OPTIONS_KEY: json.dumps(dict(first.options), sort_keys=True),
            fmt.SKIPPED_KEY: skipped_text(skipped),
        },
        blob_chunk_bytes=blob.step if blob is not None and blob.step else first.blob_chunk_bytes,
        tool_version=__version__,
        fields=fields_of(first),
        columns=_merged_columns(shards),
    )


def _merged_columns(shards: Sequence[Shard]) -> dict[str, Any]:
    """Return every stored field's values, the shards' one after another (in memory)."""
    fields = stored_fields(fields_of(shards[0].meta))
    columns: dict[str, list[Any]] = {stored.name: [] for stored in fields}
    for shard in shards:
        text, meta = os.fspath(shard.path), shard.meta
        with fmt.open_h5(text) as handle:
            for stored in fields:
                with fmt.reading(text, f"field {stored.name!r}"):
                    values = stored.read(handle, np.arange(meta.num_samples), meta.shapes)
                columns[stored.name].extend(values)
    return {f.name: f.column(columns[f.name], len(columns[f.name])) for f in fields}


def _source_index(metas: Sequence[PackMeta]) -> np.ndarray:
    """Return the merged ``source_index``: the shards', or each moved past the previous ones."""
    joined = np.concatenate([m.source_index for m in metas]).astype(np.int64)
    if len(np.unique(joined)) == len(joined):
        return joined
    parts, base = [], 0
    for meta in metas:
        parts.append(meta.source_index.astype(np.int64) + base)
        if meta.num_samples:
            base += int(meta.source_index.max()) + 1
    return np.concatenate(parts)


def _reordered(record: PackRecord, order: np.ndarray) -> PackRecord:
    """Return ``record`` with its samples in ``order`` (array storage: no offsets)."""
    return replace(
        record,
        arrays={name: array[order] for name, array in record.arrays.items()},
        columns={
            f.name: f.take(record.columns[f.name], order) for f in stored_fields(record.fields)
        },
        paths=[record.paths[i] for i in order.tolist()],
    )


def merge_packs(
    sources: StrPath | Sequence[StrPath],
    target: StrPath,
    *,
    overwrite: bool = False,
    virtual: bool = False,
    keep_order: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
    storage_options: Mapping[str, str] | None = None,
    store: Store | None = None,
    staging_dir: StrPath | None = None,
) -> MergeReport:
    """Write the packs ``sources`` (a pack set, a list of packs, or one pack) as one pack.

    The samples follow each other in the sources' order, with their labels, paths, shapes,
    checksums and source indices; stored chunks are copied as they are where they land on
    a chunk boundary (NOTE [ Merging by chunks ]). Nothing exists under ``target`` until
    the merged pack is complete.

    Args:
        sources: A pack set's directory or manifest, a list of packs, or one pack.
        target: The pack to write.
        overwrite: Replace an existing ``target`` (else TargetExistsError).
        virtual: Retired (docs/decisions/0160): OptionsError if true.
        keep_order: Keep fixed-size arrays in the sources' order, re-compressing every
            chunk after the first shard that does not fill its last one (much slower).
        progress: Called with the number of samples just merged.
        on_event: Called with a ``ConvertEvent`` (``"phase"``, ``total`` the samples).
        storage_options: For URLs (sources or target in a bucket): the bucket's settings;
            remote packs are downloaded, a remote target uploaded whole.
        store: Where the sources and target are kept (instead of ``storage_options``).
        staging_dir: For URLs: where to download and write (default: the temporary dir).

    Raises:
        FormatError: a source is damaged, or the sources differ (the message names two
            files and what differs).
    """
    if virtual:
        raise OptionsError(VIRTUAL_RETIRED)
    store = store or open_store(
        [target, *([sources] if isinstance(sources, str | os.PathLike) else sources)],
        storage_options,
    )
    if store.remote:  # NOTE [ Stores ]
        report, said = merge_with_urls(
            sources,
            os.fspath(target),
            store,
            lambda found, local: merge_packs(
                found,
                local,
                overwrite=overwrite,
                keep_order=keep_order,
                progress=progress,
                on_event=on_event,
            ),
            staging_dir=staging_dir,
            overwrite=overwrite,
            emit=on_event or (lambda event: None),
        )
        said = list(report.sources) if len(said) == 1 and len(report.sources) > 1 else said
        return replace(report, path=os.fspath(target), sources=tuple(said))
    started = time.perf_counter()
    step_done = progress or (lambda n: None)
    target_path = check_target(target, overwrite=overwrite)
    if isinstance(sources, str | os.PathLike) and not is_packset(sources):
        paths, manifest = [Path(sources)], None
    else:
        paths, manifest = pack_paths(sources)
    check_not_a_source(target_path, paths)
    shards = load_shards(paths, manifest)
    emit = on_event or (lambda event: None)
    remove_leftovers_beside(target_path, emit)  # of a merge or conversion killed there
    total = sum(s.meta.num_samples for s in shards)
    emit(ConvertEvent("phase", f"merging {len(shards)} packs", total=total))
    first = shards[0].meta
    blob = plan_blob(shards) if first.storage == "blob" else None
    record = _merge_meta(shards, blob)
    length = blob.length if blob is not None else total
    moved = 0
    if not (keep_order or blob is not None or first.chunks is None):
        rows, order = tails_last_order([s.meta.num_samples for s in shards], first.chunks[0])
        if order is not None:
            record = _reordered(record, order)
            moved = 0 if np.array_equal(order, np.arange(order.size)) else order.size - sum(rows)
    counts = Counts()
    with sigterm_as_exit(), TempFiles(target_path) as temps:
        temp = temps.add(temp_path(target_path))
        size = sum(p.stat().st_size for p in paths)
        check_room(target_path.parent, size, what=f"the merged pack {target_path}")
        try:
            handle = create_file(temp)
        except OSError as err:
            raise H5PackError(f"cannot create {temp}: {err}") from err
        try:
            step = blob.step if blob is not None else None
            with fmt.open_h5(paths[0]) as opened:
                images = create_like(handle, opened[fmt.IMAGES], length, step)
            merge_images(shards, images, blob, counts, step_done, keep_order=keep_order)
            write_record(handle, record)
        except H5PackError:
            raise
        except OSError as err:
            raise H5PackError(f"writing {target_path} failed: {err}") from err
        finally:
            handle.close()
        publish(temp, target_path, overwrite=overwrite)
    meta = fmt.load_meta(target_path)
    return MergeReport(
        path=os.fspath(target_path),
        meta=meta,
        num_samples=meta.num_samples,
        sources=tuple(os.fspath(p) for p in paths),
        chunks_copied=counts.copied,
        chunks_rechunked=counts.rechunked,
        bytes_copied=counts.bytes,
        moved_to_end=moved,
        elapsed_s=time.perf_counter() - started,
        file_bytes=target_path.stat().st_size,
    )
