"""Merge packs (the shards of a pack set, or any list of packs) into one pack.

``merge_packs`` copies the shards' stored chunks into the merged pack as they are, without
decompressing them (HDF5's direct chunk read and write), and concatenates and re-indexes
their metadata; the merged pack is published atomically, as a conversion's is
(``write.publish``). ``virtual=True`` writes an HDF5 virtual-dataset view of the shards
instead, whose sources readers check before serving a sample (NOTE [ Virtual packs ]).

NOTE [ Merging by chunks ]: a chunk is only copied as it is when it lands on a chunk
boundary of the merged dataset.

- A blob (variable-size samples, chunked by bytes) always does: every shard starts at a
  chunk boundary of the merged blob, its sample offsets shifted by whole chunks; the rest
  of a shard's last chunk is padding that belongs to its last slot, as the padding of an
  aligned blob always does (NOTE [ Aligned blobs ] in ``write/images.py``). So every
  chunk is copied and the chunk map of the merged pack is the shards' maps, one after the
  other. The exception: a shard shorter than one chunk was written with a chunk cut to
  its length, so the merged blob takes the largest shard's chunk and such shards are laid
  out again in it (``_relay``: read decompressed, written through HDF5).
- A fixed-size array's chunk holds ``C`` samples, so a shard whose count is not a multiple
  of ``C`` ends in a partial chunk, after which every row would be shifted within chunks
  (HDF5's chunks form a regular grid). Shards of ``convert --shards`` cut the samples
  evenly, so this is the rule rather than the exception. By default every shard's whole
  chunks are copied in order, and the rows of the shards' partial last chunks go to the
  end of the pack, where they are written again in whole chunks through HDF5, which
  compresses them (``tails_last_order``; ``MergeReport.moved_to_end``): at most one chunk
  per shard is decompressed and compressed. ``keep_order`` keeps the exact concatenation
  instead: from the first shard that does not fill its chunks, every row is re-chunked
  (``MergeReport.chunks_rechunked``), as slow as decompressing and compressing the rest.
- Contiguous datasets (uncompressed blobs, by default) have no chunks: their bytes are
  copied in large blocks and the offsets shifted by the exact length of the shards before.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5pack._types import StrPath
from h5pack._version import __version__
from h5pack.core import format as fmt
from h5pack.core.fields import field_difference, fields_of, stored_fields
from h5pack.core.format import PackMeta, SkippedFile
from h5pack.core.layout import FILTER_NAMES, ChunkMap
from h5pack.core.packset import (
    PackSetManifest,
    check_shard,
    is_packset,
    meta_digest,
    pack_paths,
)
from h5pack.core.record import PackRecord, write_record
from h5pack.core.store import open_store
from h5pack.errors import FormatError, H5PackError
from h5pack.write.builder import ConvertEvent, create_file, skipped_text
from h5pack.write.images import COPY_BYTES, aligned_offsets, copy_array_rows
from h5pack.write.leftovers import describe_removed, remove_leftovers
from h5pack.write.publish import (
    TempFiles,
    check_not_a_source,
    check_room,
    check_target,
    publish,
    sigterm_as_exit,
    temp_path,
)
from h5pack.write.remote import merge_with_urls

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
VIRTUAL_SOURCES_KEY = fmt.VIRTUAL_SOURCES_KEY


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


@dataclass(frozen=True)
class _Shard:
    path: Path
    meta: PackMeta
    paths: list[str]
    filters: tuple[tuple[int, tuple[int, ...]], ...]
    dtype: np.dtype[Any]


def source_paths(
    sources: StrPath | Sequence[StrPath],
) -> tuple[list[Path], PackSetManifest | None]:
    """Return the packs of ``sources`` (a pack, a pack set, or a list) and the set's manifest.

    Raises:
        OptionsError: an empty list.
        PackNotFoundError: a pack set without a manifest.
        FormatError: a malformed manifest.
    """
    if isinstance(sources, str | os.PathLike) and not is_packset(sources):
        return [Path(sources)], None
    return pack_paths(sources)


def _filters(dataset: h5py.Dataset) -> tuple[tuple[int, tuple[int, ...]], ...]:
    plist = dataset.id.get_create_plist()
    found = []
    for i in range(plist.get_nfilters()):
        filter_id, _flags, values, _name = plist.get_filter(i)
        found.append((int(filter_id), tuple(int(v) for v in values)))
    return tuple(found)


def _filters_text(filters: tuple[tuple[int, tuple[int, ...]], ...]) -> str:
    if not filters:
        return "no filters"
    return " + ".join(
        f"{FILTER_NAMES.get(fid, f'filter {fid}')}{list(values) if values else ''}"
        for fid, values in filters
    )


def _load(path: Path, manifest: PackSetManifest | None) -> _Shard:
    text = os.fspath(path)
    with fmt.open_h5(text) as handle:
        meta = fmt.read_meta(handle, text)
        paths = fmt.read_paths(handle, meta)
        with fmt.reading(text, f"dataset {fmt.IMAGES!r}"):
            images = handle[fmt.IMAGES]
            filters, dtype = _filters(images), images.dtype
            if images.is_virtual:
                raise FormatError(
                    f"{text} is a virtual pack (h5pack merge --virtual); merge its sources instead"
                )
    if manifest is not None:
        entry = next(e for e in manifest.shards if manifest.root / e.path == path)
        check_shard(manifest, entry, meta)
    return _Shard(path, meta, paths, filters, dtype)


def _differences(shard: _Shard, first: _Shard) -> list[str]:
    """Return what keeps ``shard`` from being merged with ``first`` (empty: nothing)."""
    a, b = shard.meta, first.meta
    found: list[str] = []

    def differ(what: str, mine: object, theirs: object) -> None:
        if mine != theirs:
            found.append(f"{what} {mine} here, {theirs} in {first.path}")

    differ(
        "format version",
        f"{a.format_version}.{a.format_minor}",
        f"{b.format_version}.{b.format_minor}",
    )
    differ("mode", a.mode, b.mode)
    differ("storage", a.storage, b.storage)
    differ("channels", a.channels, b.channels)
    differ("dtype", shard.dtype, first.dtype)
    if a.storage == "array":
        differ("sample shape", a.images_shape[1:], b.images_shape[1:])
    if a.storage != "blob" or (a.chunks is None) != (b.chunks is None):
        differ(
            "chunk shape",
            a.chunks if a.chunks is not None else "none (contiguous)",
            b.chunks if b.chunks is not None else "none (contiguous)",
        )
    differ("filters", _filters_text(shard.filters), _filters_text(first.filters))
    fields = field_difference(fields_of(a), fields_of(b), str(shard.path), str(first.path))
    found.extend([fields] if fields else [])
    if a.classes != b.classes:
        only = sorted(set(a.classes) ^ set(b.classes))[:3]
        detail = f" (e.g. {', '.join(map(repr, only))} in one only)" if only else " (order)"
        found.append(f"classes: {len(a.classes)} here, {len(b.classes)} in {first.path}{detail}")
    return found


def _check_distinct_paths(shards: Sequence[_Shard]) -> None:
    """Refuse packs that hold the same source path (a pack holds each file once).

    Raises:
        FormatError: two packs hold a sample of the same path (the message names both
            files and the path).
    """
    owner: dict[str, int] = {}
    for k, shard in enumerate(shards):
        for path in shard.paths:
            first = owner.setdefault(path, k)
            if first != k:
                raise FormatError(
                    f"{shard.path} cannot be merged with {shards[first].path}: both hold "
                    f"{path!r} (a pack holds each source file once; were they converted "
                    "from the same folder, or merged twice?)"
                )


def load_shards(paths: Sequence[Path], manifest: PackSetManifest | None = None) -> list[_Shard]:
    """Read every pack's metadata and refuse packs that cannot be merged.

    Raises:
        FileNotFoundError: a pack does not exist.
        FormatError: a pack is damaged, changed since its set's manifest was written, or
            differs from the first in format, mode, storage, sample shape, dtype, chunks,
            filters or classes, or two packs hold the same source path (the message names
            both files and what differs).
    """
    shards = [_load(path, manifest) for path in paths]
    first = shards[0]
    for shard in shards[1:]:
        differences = _differences(shard, first)
        if differences:
            raise FormatError(
                f"{shard.path} cannot be merged with {first.path}: "
                + "; ".join(differences)
                + "; convert them with the same options"
            )
    step = _blob_step(shards)
    if step is None:
        _check_distinct_paths(shards)
        return shards
    largest = next(s for s in shards if s.meta.chunks == (step,))
    for shard in shards:
        chunks = shard.meta.chunks
        if chunks is not None and chunks[0] != step and not _one_chunk(shard):
            raise FormatError(
                f"{shard.path} cannot be merged with {largest.path}: blob chunk {chunks[0]} "
                f"bytes here, {step} in {largest.path} (only a shard shorter than one chunk, "
                "whose chunk is cut to its length, can be laid out again); convert them with "
                "the same options"
            )
    _check_distinct_paths(shards)
    return shards


# -- metadata ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Merged:
    """The merged metadata of the shards, with blob offsets shifted (see ``_plan_blob``).

    ``arrays`` holds the per-sample arrays by dataset name (NOTE [ Per-sample arrays ]),
    ``columns`` every stored field's values (``core.fields``) by name.
    """

    arrays: dict[str, np.ndarray]
    columns: dict[str, Any]
    paths: list[str]
    skipped: tuple[SkippedFile, ...]
    length: int  # rows of the merged images dataset


def _one_chunk(shard: _Shard) -> bool:
    """Return whether a shard's blob is one chunk cut to the blob's length.

    A blob shorter than the chunk planned gets a chunk of its own length
    (``images.ImagesWriter.spec_for``): the small shards of a set differ in chunk so.
    """
    chunks = shard.meta.chunks
    return chunks is not None and chunks[0] >= shard.meta.images_shape[0]


def _blob_step(shards: Sequence[_Shard]) -> int | None:
    """Return the chunk of the merged blob: the largest of the shards' (None: contiguous)."""
    if shards[0].meta.storage != "blob" or shards[0].meta.chunks is None:
        return None
    return max(s.meta.chunks[0] for s in shards if s.meta.chunks is not None)


@dataclass(frozen=True)
class _BlobPlan:
    """Where each shard's blob goes in the merged blob (NOTE [ Merging by chunks ]).

    Attributes:
        step: The merged chunk (None: contiguous, or a virtual view).
        bases: Where each shard starts (a chunk boundary when chunked).
        offsets: Each shard's slot offsets from its base (N_k + 1).
        relaid: Whether a shard's samples are laid out again (its chunk differs).
        length: Bytes of the merged blob.
    """

    step: int | None
    bases: list[int]
    offsets: list[np.ndarray]
    relaid: list[bool]
    length: int


def _plan_blob(shards: Sequence[_Shard], *, virtual: bool) -> _BlobPlan:
    step = None if virtual else _blob_step(shards)
    bases: list[int] = []
    offsets: list[np.ndarray] = []
    relaid: list[bool] = []
    position = end = 0
    for shard in shards:
        meta = shard.meta
        shard_offsets, shard_sizes = meta.blob_slots()
        length = meta.images_shape[0]
        local, again = shard_offsets, False
        if step is not None and meta.chunks != (step,):
            local, again = aligned_offsets(shard_sizes, step), True
            length = int(local[-1])
        bases.append(position)
        offsets.append(local.astype(np.int64))
        relaid.append(again)
        end = position + length
        position = end if step is None else -(-end // step) * step
    return _BlobPlan(step, bases, offsets, relaid, end)


def _merge_meta(shards: Sequence[_Shard], blob: _BlobPlan | None) -> _Merged:
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


def _merged_columns(shards: Sequence[_Shard]) -> dict[str, Any]:
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


def _reordered(merged: _Merged, order: np.ndarray) -> _Merged:
    """Return ``merged`` with its samples in ``order`` (array storage: no offsets)."""
    return replace(
        merged,
        arrays={name: array[order] for name, array in merged.arrays.items()},
        columns={name: _taken(values, order) for name, values in merged.columns.items()},
        paths=[merged.paths[i] for i in order.tolist()],
    )


def _taken(values: Any, order: np.ndarray) -> Any:
    return values[order] if isinstance(values, np.ndarray) else [values[i] for i in order]


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
            field_rows=_field_rows(first, merged, blob_chunk_bytes),
        ),
    )


def _field_rows(first: PackMeta, merged: _Merged, blob_chunk_bytes: int) -> int:
    """Samples per chunk of the stored fields: about one image chunk's (``core.fields``)."""
    num = len(merged.paths)
    if first.storage == "array":
        return first.chunks[0] if first.chunks else max(1, num)
    return max(1, num * blob_chunk_bytes // max(1, merged.length))


# -- images -----------------------------------------------------------------------------


class _Counts:
    def __init__(self) -> None:
        self.copied = self.rechunked = self.bytes = 0


def _create_like(
    handle: h5py.File, source: h5py.Dataset, length: int, step: int | None
) -> h5py.Dataset:
    """Create the merged images dataset with ``source``'s type, layout and filters.

    Its chunks are ``source``'s, or ``step`` bytes for a blob (``_blob_step``).
    """
    shape = (length, *source.shape[1:])
    unlimited = source.maxshape[0] is None
    maxshape = (h5py.h5s.UNLIMITED if unlimited else length, *source.shape[1:])
    space = h5py.h5s.create_simple(shape, maxshape)
    dcpl = source.id.get_create_plist()
    if step is not None:
        dcpl.set_chunk((step,))
    dsid = h5py.h5d.create(handle.id, fmt.IMAGES.encode(), source.id.get_type(), space, dcpl=dcpl)
    return h5py.Dataset(dsid)


def _copy_chunks(
    source: h5py.Dataset, target: h5py.Dataset, rows: int, shift: int, counts: _Counts
) -> None:
    """Copy the stored chunks of ``source`` that start before row ``rows``, ``shift`` rows on.

    The chunks are copied as stored (compressed), never decompressed; chunks HDF5 never
    allocated (never written) stay unallocated in the target too.
    """
    tail = (0,) * (source.ndim - 1)
    allocated: list[int] = []
    source.id.chunk_iter(lambda info: allocated.append(int(info.chunk_offset[0])))
    for row in sorted(allocated):
        if row >= rows:
            continue
        mask, data = source.id.read_direct_chunk((row, *tail))
        target.id.write_direct_chunk((row + shift, *tail), data, mask)
        counts.copied += 1


class _Carry:
    """Rows of a fixed-size array waiting to fill whole chunks of the target (re-chunking).

    Rows are written through HDF5 (which compresses them) in whole chunks only, so no
    chunk of the target is ever read back and written twice.
    """

    def __init__(self, target: h5py.Dataset, step: int, counts: _Counts) -> None:
        self.target = target
        self.step = step
        self.counts = counts
        self.start = 0
        self.rows: list[np.ndarray] = []

    @property
    def empty(self) -> bool:
        return not self.rows

    def add(self, at: int, rows: np.ndarray) -> None:
        """Append ``rows``, which belong at row ``at`` of the target; write whole chunks."""
        if not self.rows:
            self.start = at
        self.rows.append(rows)
        self._write(final=False)

    def finish(self) -> None:
        """Write what is left (the target's last, partial chunk)."""
        if self.rows:
            self._write(final=True)

    def _write(self, *, final: bool) -> None:
        rows = np.concatenate(self.rows) if len(self.rows) > 1 else self.rows[0]
        whole = len(rows) if final else len(rows) - len(rows) % self.step
        if whole:
            self.target[self.start : self.start + whole] = rows[:whole]
            self.counts.rechunked += -(-whole // self.step)
        self.rows = [rows[whole:]] if whole < len(rows) else []
        self.start += whole


def _relay(
    source: h5py.Dataset, meta: PackMeta, local: np.ndarray, target: h5py.Dataset, base: int
) -> int:
    """Lay a blob's samples out again at ``local`` offsets from ``base``; return chunks written.

    For a shard whose chunk differs from the merged blob's (a shard shorter than one chunk
    gets a chunk of its own length). Samples are read decompressed and written through
    HDF5, which compresses them, in runs that start on a chunk boundary and end on one (or
    at the shard's end), so that no chunk is written twice.
    """
    offsets, sizes = meta.blob_slots()
    step = int(target.chunks[0])
    starts = ChunkMap.for_blob(local, step).starts
    written = 0
    lo = 0
    while lo < meta.num_samples:
        # whole groups (each starts on a chunk boundary) up to about COPY_BYTES
        g = int(np.searchsorted(starts, lo, side="right"))
        while g < len(starts) - 1 and local[starts[g]] - local[lo] < COPY_BYTES:
            g += 1
        hi = int(starts[g])
        begin = int(offsets[lo])
        end = int(offsets[hi - 1] + sizes[hi - 1])
        data = source[begin:end]
        out = np.zeros(
            int(local[hi] if hi < meta.num_samples else local[-1]) - int(local[lo]), np.uint8
        )
        for i in range(lo, hi):
            at, size = int(local[i] - local[lo]), int(sizes[i])
            start = int(offsets[i]) - begin
            out[at : at + size] = data[start : start + size]
        target[base + int(local[lo]) : base + int(local[lo]) + out.size] = out
        written += -(-out.size // step)
        lo = hi
    return written


def tails_last_order(counts: Sequence[int], step: int) -> tuple[list[int], np.ndarray | None]:
    """Return the rows of each shard copied in place, and the merged order of the samples.

    NOTE [ Merging by chunks ]: the whole chunks of every shard are copied in shard order;
    the rows of each shard's last, partial chunk go to the end of the pack, in shard order,
    where they are re-chunked together. The order is ``None`` when that is the
    concatenation (every shard but the last fills its chunks); else merged sample ``j`` is
    sample ``order[j]`` of the concatenation.

    Example:
        >>> rows, order = tails_last_order([5, 4, 3], 2)
        >>> rows, order.tolist()
        ([4, 4, 2], [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 4, 11])
    """
    whole = [n - n % step for n in counts]
    if all(w == n for w, n in zip(whole[:-1], counts[:-1], strict=True)):
        return [*whole[:-1], counts[-1]], None
    bases = np.cumsum([0, *counts[:-1]])
    kept = [np.arange(b, b + w) for b, w in zip(bases, whole, strict=True)]
    tails = [np.arange(b + w, b + n) for b, w, n in zip(bases, whole, counts, strict=True)]
    return whole, np.concatenate(kept + tails).astype(np.int64)


def _merge_tails_last(
    shards: Sequence[_Shard],
    target: h5py.Dataset,
    rows: Sequence[int],
    counts: _Counts,
    step_done: Callable[[int], None],
) -> None:
    """Fill a chunked array: whole chunks in place, then the shards' tails last.

    See ``tails_last_order``.
    """
    step = int(target.chunks[0])
    position = 0
    for shard, whole in zip(shards, rows, strict=True):
        with fmt.open_h5(shard.path) as handle, fmt.reading(str(shard.path), "the images"):
            _copy_chunks(handle[fmt.IMAGES], target, whole, position, counts)
        position += whole
        step_done(whole)
    carry = _Carry(target, step, counts)
    for shard, whole in zip(shards, rows, strict=True):
        num = shard.meta.num_samples
        if whole == num:
            continue
        with fmt.open_h5(shard.path) as handle, fmt.reading(str(shard.path), "the images"):
            carry.add(position, handle[fmt.IMAGES][whole:num])
        position += num - whole
        step_done(num - whole)
    carry.finish()


def _merge_images(
    shards: Sequence[_Shard],
    target: h5py.Dataset,
    blob: _BlobPlan | None,
    counts: _Counts,
    step_done: Callable[[int], None],
) -> None:
    """Fill the merged images dataset from every shard in order (NOTE [ Merging by chunks ])."""
    step = target.chunks[0] if target.chunks is not None else None
    bases = blob.bases if blob is not None else None
    carry = _Carry(target, step, counts) if step is not None else None
    position = 0
    for k, shard in enumerate(shards):
        num = shard.meta.num_samples
        with fmt.open_h5(shard.path) as handle, fmt.reading(str(shard.path), "the images"):
            source = handle[fmt.IMAGES]
            length = int(source.shape[0])
            if blob is not None and bases is not None:  # whole chunks, or the exact bytes
                if blob.relaid[k]:
                    counts.rechunked += _relay(
                        source, shard.meta, blob.offsets[k], target, bases[k]
                    )
                elif step is None:
                    copy_array_rows(source, target, length, at=bases[k])
                    counts.bytes += length
                else:
                    _copy_chunks(source, target, length, bases[k], counts)
            elif step is None or carry is None:
                copy_array_rows(source, target, num, at=position)
                counts.bytes += int(source.nbytes)
            elif carry.empty and position % step == 0:
                whole = num if k == len(shards) - 1 else num - num % step
                _copy_chunks(source, target, whole, position, counts)
                if whole < num:
                    carry.add(position + whole, source[whole:num])
            else:  # shifted within chunks: decompressed and written again
                block = max(
                    step, COPY_BYTES // max(1, int(np.prod(source.shape[1:]))) // step * step
                )
                for start in range(0, num, block):
                    carry.add(position + start, source[start : min(num, start + block)])
        position += num
        step_done(num)
    if carry is not None:
        carry.finish()


def _write_virtual(handle: h5py.File, shards: Sequence[_Shard], target: Path, length: int) -> str:
    """Create the images dataset as a virtual view of the shards; return its sources' record.

    NOTE [ Virtual packs ]: shards follow each other without padding (a virtual dataset
    has no chunks); paths are stored relative to the target's directory.
    """
    first = shards[0].meta
    shape = (length, *first.images_shape[1:])
    layout = h5py.VirtualLayout(shape=shape, dtype=np.uint8)
    position = 0
    record = []
    for shard in shards:
        rows = shard.meta.images_shape[0]
        relative = os.path.relpath(os.path.abspath(shard.path), os.path.abspath(target.parent))
        layout[position : position + rows] = h5py.VirtualSource(
            relative, fmt.IMAGES, shape=tuple(shard.meta.images_shape)
        )
        position += rows
        record.append(
            {
                "path": relative,
                "pack_id": shard.meta.pack_id,
                "file_bytes": shard.path.stat().st_size,
                "num_samples": shard.meta.num_samples,
                "digest": meta_digest(shard.meta),
            }
        )
    handle.create_virtual_dataset(fmt.IMAGES, layout, fillvalue=0)
    return json.dumps(record, sort_keys=True)


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
            are downloaded and a remote target uploaded whole (``remote.merge_with_urls``).
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
    with sigterm_as_exit(), TempFiles(target_path) as temps:
        counts = _Counts()
        temp = temps.add(temp_path(target_path))
        if not virtual:
            check_room(
                target_path.parent,
                sum(p.stat().st_size for p in paths),
                what=f"the merged pack {target_path}",
            )
        storage_blob = shards[0].meta.storage == "blob"
        blob = _plan_blob(shards, virtual=virtual) if storage_blob else None
        merged = _merge_meta(shards, blob)
        first_meta = shards[0].meta
        rows: list[int] | None = None
        moved = 0
        if not (virtual or keep_order or blob is not None or first_meta.chunks is None):
            rows, order = tails_last_order(
                [s.meta.num_samples for s in shards], first_meta.chunks[0]
            )
            if order is None:
                rows = None  # every shard but the last fills its chunks: in order
            else:
                merged = _reordered(merged, order)
                if not np.array_equal(order, np.arange(order.size)):
                    moved = len(order) - sum(rows)
        try:
            handle = create_file(temp)
        except OSError as err:
            raise H5PackError(f"cannot create {temp}: {err}") from err
        try:
            extra: dict[str, str] = {}
            if virtual:
                extra[VIRTUAL_SOURCES_KEY] = _write_virtual(
                    handle, shards, target_path, merged.length
                )
                step_done(len(merged.paths))
            else:
                step = blob.step if blob is not None else None
                with fmt.open_h5(paths[0]) as first:
                    images = _create_like(handle, first[fmt.IMAGES], merged.length, step)
                if rows is not None:
                    _merge_tails_last(shards, images, rows, counts, step_done)
                else:
                    _merge_images(shards, images, blob, counts, step_done)
            chunk_bytes = shards[0].meta.blob_chunk_bytes
            if blob is not None and blob.step is not None:
                chunk_bytes = blob.step
            _write_metadata(handle, shards[0].meta, merged, extra, chunk_bytes)
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
