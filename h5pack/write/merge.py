"""Merge packs (the shards of a pack set, or any list of packs) into one pack.

``merge_packs`` copies the shards' stored chunks into the merged pack as they are, without
decompressing them (HDF5's direct chunk read and write), and concatenates and re-indexes
their metadata; the merged pack is published atomically, as a conversion's is
(``write.publish``). ``virtual=True`` writes an HDF5 virtual-dataset view of the shards
instead, whose sources readers check before serving a sample (NOTE [ Virtual packs ]).

NOTE [ Merging by chunks ]: a chunk is copied as it is only where it lands on a chunk
boundary of the merged dataset (``write/mergecopy.py``).

- A chunked blob: every shard starts on a chunk boundary, its offsets shifted by whole
  chunks (the rest of its last chunk is padding of its last slot, NOTE [ Aligned blobs ]).
  A shard shorter than one chunk got a chunk of its own length: it is laid out again in the
  largest shard's chunk (``mergecopy._relay``).
- A fixed-size array: a shard whose count is not a multiple of the chunk's ends in a
  partial chunk. Every shard's whole chunks are copied in order and the rows of the partial
  last chunks go to the end, re-chunked through HDF5 (``tails_last_order``,
  ``MergeReport.moved_to_end``); ``keep_order`` re-chunks every row after the first such
  shard instead (``MergeReport.chunks_rechunked``).
- Contiguous datasets have no chunks: bytes are copied in blocks, offsets shifted exactly.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import h5py
import numpy as np

from h5pack._types import StrPath
from h5pack._version import __version__
from h5pack.core import format as fmt
from h5pack.core.fields import fields_of, stored_fields
from h5pack.core.format import PackMeta, SkippedFile
from h5pack.core.record import PackRecord, skipped_text, write_record
from h5pack.core.store import open_store
from h5pack.errors import H5PackError
from h5pack.write.builder import create_file
from h5pack.write.leftovers import describe_removed, remove_leftovers
from h5pack.write.mergecopy import (
    BlobPlan,
    Counts,
    create_like,
    merge_images,
    plan_blob,
    tails_last_order,
    write_virtual,
)
from h5pack.write.mergesources import Shard, load_shards, merge_with_urls, source_paths
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

# NOTE [ Virtual packs ]: a virtual pack records its sources in the root attribute
# ``fmt.VIRTUAL_SOURCES_KEY`` (JSON list of {path, pack_id, file_bytes, num_samples,
# digest}; see core/format.py).
#
# HDF5 returns the fill value, silently, for the part of a virtual dataset whose source
# file it cannot open (missing, moved, or past the limit of open files), so a reader of
# a virtual pack first checks that every recorded source exists and is the same file (its
# pack id and size), and the per-sample digests, checked by default, refuse a sample that
# still comes back as fill values. Source paths are stored relative to the virtual pack's
# directory (HDF5 resolves them against it, from any working directory): the pack and its
# shards move together.


@dataclass(frozen=True, kw_only=True)
class MergeReport:
    """What a merge did.

    Attributes:
        path: The pack written.
        meta: Its metadata, as a reader sees it.
        num_samples: Samples in the merged pack.
        sources: The packs merged, in order.
        virtual: Whether it is a virtual view of the sources (NOTE [ Virtual packs ]).
        chunks_copied: Stored chunks copied as they are (not decompressed).
        chunks_rechunked: Chunks decompressed and written again (NOTE [ Merging by chunks ]).
        bytes_copied: Bytes copied from contiguous datasets.
        moved_to_end: Samples of fixed-size arrays moved to the end of the pack (the rows
            of the shards' last, partial chunks; NOTE [ Merging by chunks ]).
        elapsed_s: Wall time.
        file_bytes: Size of the merged pack.
    """

    path: str
    meta: PackMeta
    num_samples: int
    sources: tuple[str, ...]
    virtual: bool
    chunks_copied: int
    chunks_rechunked: int
    bytes_copied: int
    moved_to_end: int
    elapsed_s: float
    file_bytes: int


# -- metadata ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Merged:
    """The merged metadata of the shards, with blob offsets shifted (see ``plan_blob``).

    ``arrays`` holds the per-sample arrays by dataset name (NOTE [ Per-sample arrays ]),
    ``columns`` every stored field's values (``core.fields``) by name.
    """

    arrays: dict[str, np.ndarray]
    columns: dict[str, Any]
    paths: list[str]
    skipped: tuple[SkippedFile, ...]
    length: int  # rows of the merged images dataset


def _merge_meta(shards: Sequence[Shard], blob: BlobPlan | None) -> _Merged:
    metas = [s.meta for s in shards]
    offsets = sizes = None
    if blob is not None:
        parts = [local[:-1] + base for local, base in zip(blob.offsets, blob.bases, strict=True)]
        parts.append(np.array([blob.bases[-1] + int(blob.offsets[-1][-1])], dtype=np.int64))
        offsets = np.concatenate(parts).astype(np.int64)
        sizes = np.concatenate([m.sizes for m in metas if m.sizes is not None]).astype(np.int64)
        length = blob.length
    else:
        length = sum(m.num_samples for m in metas)
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
    if offsets is not None and sizes is not None:
        arrays[fmt.OFFSETS], arrays[fmt.SIZES] = offsets, sizes
    return _Merged(
        arrays=arrays,
        columns=_merged_columns(shards),
        paths=[p for s in shards for p in s.paths],
        skipped=tuple(skipped),
        length=length,
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
    """Return the merged ``source_index``: the shards', or re-indexed when they collide.

    Shards of one sharded conversion hold positions in the global scan, distinct across
    shards: they are kept. Packs converted on their own each count from 0: each pack's
    positions are then moved past the previous packs' (by their largest position + 1), so
    the merged positions stay distinct and in the order of the sources.
    """
    joined = np.concatenate([m.source_index for m in metas]).astype(np.int64)
    if len(np.unique(joined)) == len(joined):
        return joined
    parts, base = [], 0
    for meta in metas:
        parts.append(meta.source_index.astype(np.int64) + base)
        if meta.num_samples:
            base += int(meta.source_index.max()) + 1
    return np.concatenate(parts)


def _reordered(merged: _Merged, order: np.ndarray, meta: PackMeta) -> _Merged:
    """Return ``merged`` with its samples in ``order`` (array storage: no offsets)."""
    return replace(
        merged,
        arrays={name: array[order] for name, array in merged.arrays.items()},
        columns={
            f.name: f.take(merged.columns[f.name], order) for f in stored_fields(fields_of(meta))
        },
        paths=[merged.paths[i] for i in order.tolist()],
    )


def _write_metadata(
    handle: h5py.File,
    first: PackMeta,
    merged: _Merged,
    extra: dict[str, str],
    blob_chunk_bytes: int,
) -> None:
    """Write every dataset and attribute of the merged pack but its images (format 1.1).

    Mode, storage, channels and the conversion options are the first shard's (they agree);
    ``extra`` text attributes are written and digested too.
    """
    texts = {
        fmt.OPTIONS_KEY: json.dumps(dict(first.options), sort_keys=True),
        fmt.SKIPPED_KEY: skipped_text(merged.skipped),
        **extra,
    }
    write_record(
        handle,
        PackRecord(
            mode=first.mode,
            storage=first.storage,
            channels=first.channels,
            classes=first.classes,
            paths=merged.paths,
            arrays=merged.arrays,
            texts=texts,
            blob_chunk_bytes=blob_chunk_bytes,
            tool_version=__version__,
            fields=fields_of(first),
            columns=merged.columns,
        ),
    )


# -- the merge --------------------------------------------------------------------------


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
    staging_dir: StrPath | None = None,
) -> MergeReport:
    """Write the packs ``sources`` (a pack set, a list of packs, or one pack) as one pack.

    The samples follow each other in the order of the sources (a set's manifest order),
    with their labels, paths, shapes, checksums and source indices; the merged pack gets a
    new pack id and digests. Stored chunks are copied without being decompressed where
    they land on a chunk boundary (NOTE [ Merging by chunks ]). Fixed-size arrays whose
    shards do not fill their last chunk have those rows moved to the end of the pack,
    where they are re-compressed together (``MergeReport.moved_to_end``), unless
    ``keep_order``. Nothing exists under ``target`` until the merged pack is complete.

    Args:
        sources: A pack set's directory or manifest, a list of packs, or one pack (copied).
        target: The pack to write.
        overwrite: Replace an existing ``target``.
        virtual: Write an HDF5 virtual-dataset view of the sources instead of copying their
            images (NOTE [ Virtual packs ]): small and instant, but it reads through HDF5
            (no direct chunk path) and needs every source, unchanged, at its place.
        keep_order: Keep the samples of fixed-size arrays exactly in the sources' order:
            every chunk after the first shard whose sample count is not a multiple of the
            chunk's is then decompressed and compressed again (much slower). Blobs,
            contiguous arrays and virtual packs always keep the order.
        progress: Called with the number of samples just merged.
        on_event: Called with a ``ConvertEvent`` (``"phase"``, with the samples to merge as
            ``total``) once the sources are checked.
        storage_options: For URLs (sources ``s3://bucket/set/`` or ``s3://bucket/a.h5``,
            or the target): the bucket's settings beyond the environment. Remote sources
            are downloaded and a remote target uploaded whole (``mergesources.merge_with_urls``).
        staging_dir: For URLs: where they are downloaded and the merged pack is written
            before it is uploaded (default: the system's temporary directory).

    Returns:
        What was written.

    Raises:
        TargetExistsError: ``target`` exists and ``overwrite`` is False.
        OptionsError: ``target`` is one of the sources, or its directory does not exist.
        FileNotFoundError: a source does not exist.
        FormatError: a source is damaged, or the sources differ in format, mode, storage,
            sample shape, dtype, chunks, filters or classes (the message names two files
            and what differs).
    """
    store = open_store(
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
            virtual=virtual,
            emit=on_event or (lambda event: None),
        )
        said = list(report.sources) if len(said) == 1 and len(report.sources) > 1 else said
        return replace(report, path=os.fspath(target), sources=tuple(said))
    started = time.perf_counter()
    step_done = progress or (lambda n: None)
    target_path = check_target(target, overwrite=overwrite)
    paths, manifest = source_paths(sources)
    check_not_a_source(target_path, paths)
    shards = load_shards(paths, manifest)
    emit = on_event or (lambda event: None)
    removed = remove_leftovers(target_path.parent)  # of a merge or conversion killed there
    if removed:
        emit(ConvertEvent("note", describe_removed(removed)))
    total = sum(s.meta.num_samples for s in shards)
    what = "writing a virtual view of" if virtual else "merging"
    emit(ConvertEvent("phase", f"{what} {len(shards)} packs", total=total))
    first = shards[0].meta
    blob = plan_blob(shards, virtual=virtual) if first.storage == "blob" else None
    merged = _merge_meta(shards, blob)
    moved = 0
    if not (virtual or keep_order or blob is not None or first.chunks is None):
        rows, order = tails_last_order([s.meta.num_samples for s in shards], first.chunks[0])
        if order is not None:
            merged = _reordered(merged, order, first)
            moved = 0 if np.array_equal(order, np.arange(order.size)) else order.size - sum(rows)
    counts = Counts()
    with sigterm_as_exit(), TempFiles(target_path) as temps:
        temp = temps.add(temp_path(target_path))
        if not virtual:
            size = sum(p.stat().st_size for p in paths)
            check_room(target_path.parent, size, what=f"the merged pack {target_path}")
        try:
            handle = create_file(temp)
        except OSError as err:
            raise H5PackError(f"cannot create {temp}: {err}") from err
        try:
            extra: dict[str, str] = {}
            if virtual:
                record = write_virtual(handle, shards, target_path, merged.length)
                extra[fmt.VIRTUAL_SOURCES_KEY] = record
                step_done(len(merged.paths))
            else:
                step = blob.step if blob is not None else None
                with fmt.open_h5(paths[0]) as opened:
                    images = create_like(handle, opened[fmt.IMAGES], merged.length, step)
                merge_images(shards, images, blob, counts, step_done, keep_order=keep_order)
            chunk_bytes = blob.step if blob is not None and blob.step else first.blob_chunk_bytes
            _write_metadata(handle, first, merged, extra, chunk_bytes)
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
        virtual=virtual,
        chunks_copied=counts.copied,
        chunks_rechunked=counts.rechunked,
        bytes_copied=counts.bytes,
        moved_to_end=moved,
        elapsed_s=time.perf_counter() - started,
        file_bytes=target_path.stat().st_size,
    )
