"""The write half of a pack's record, beside its read half (``core.format.read_meta``).

Everything a pack records besides its images is one ``PackRecord``, written by
``write_record``: conversions (``write.builder``) and merges (``write.merge``) build the
record and nothing else spells a dataset or an attribute. The per-sample arrays travel as
one mapping keyed by dataset name, which this module, ``read_meta``, the pack-set fold and
``merge`` iterate (NOTE [ Per-sample arrays ] in ``core.format``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import h5py
import numpy as np

from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.fields import LEGACY_FIELDS, Field, fields_text, stored_fields
from h5pack.core.format import SkippedFile
from h5pack.core.layout import DEFAULT_CHUNK_BYTES
from h5pack.errors import FormatError

# Uncompressed bytes of one chunk of /paths (fixed-length strings, gzip); the paths are
# encoded and written ``format.PATH_SLAB`` at a time (bounded memory for huge packs).
PATHS_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class PackRecord:
    """Everything a pack records besides its images: what ``write_record`` writes.

    Attributes:
        mode: ``"raw"`` or ``"encoded"``.
        storage: ``"array"`` or ``"blob"``.
        channels: 1 or 3.
        classes: Class names; labels index into them.
        paths: Relative source paths, in pack order.
        arrays: The numeric per-sample arrays by dataset name (``format.SAMPLE_ARRAYS``):
            every one that is not optional, the blob ones only for blob storage.
        texts: Text attributes, each digested (options, skipped, and the optional ones).
        blob_chunk_bytes: Bytes per chunk of a blob (0 for array storage).
        tool_version: The h5pack version writing the pack.
        fields: The sample's fields, listed in the pack (``core.fields``).
        columns: Each stored field's values, in pack order, by name (``StoredField.column``).
        field_rows: Samples per chunk of the stored fields' datasets (None: about one chunk
            of the images dataset already in the file, NOTE [ Stored fields ]).
    """

    mode: fmt.Mode
    storage: fmt.Storage
    channels: int
    classes: Sequence[str]
    paths: Sequence[str]
    arrays: Mapping[str, np.ndarray]
    texts: Mapping[str, str]
    blob_chunk_bytes: int
    tool_version: str
    fields: tuple[Field, ...] = LEGACY_FIELDS
    columns: Mapping[str, Any] = field(default_factory=dict)
    field_rows: int | None = None


def write_record(handle: h5py.File, record: PackRecord) -> None:
    """Write every dataset and attribute of a pack but its images (``core.format`` names them).

    Format 1.1: no variable-length data (the global heap has no checksum, and damage there
    made HDF5 loop), a new pack id, and the CRC32 of every dataset and of every text
    attribute in ``record.texts`` a reader trusts (``metadata_crc32``).

    Raises:
        FormatError: an array the format requires is missing, or one that it does not know
            is given (a writer's mistake, caught before a file holds it).
    """
    num = len(record.paths)
    digests: dict[str, str] = {}
    known = {spec.name for spec in fmt.SAMPLE_ARRAYS}
    unknown = sorted(set(record.arrays) - known)
    if unknown:
        raise FormatError(f"the format has no per-sample arrays {unknown}")

    def numeric(spec: fmt.SampleArray) -> None:
        values = record.arrays.get(spec.name)
        if values is None:
            if spec.optional or (spec.blob_only and record.storage != "blob"):
                return
            raise FormatError(f"a {record.storage} pack needs its {spec.name!r} array")
        if spec.blob_only and record.storage != "blob":
            return
        data = np.asarray(values)
        if data.ndim <= 1:
            data = data.reshape(num + spec.extra_rows)
        data = np.ascontiguousarray(data.astype(np.dtype(spec.dtype)))
        handle.create_dataset(spec.name, data=data)
        digests[spec.name] = integrity.array_digest(data, spec.dtype)

    first, *rest = fmt.SAMPLE_ARRAYS  # labels, then classes and paths, then the others
    numeric(first)
    names = [c.encode("utf-8", "surrogateescape") for c in record.classes]
    stored_classes, class_type = fmt.fixed_strings(names)
    dataset = handle.create_dataset(fmt.CLASSES, shape=(len(names),), dtype=class_type)
    fmt.write_fixed_strings(dataset, 0, stored_classes)
    digests[fmt.CLASSES] = fmt.classes_digest(tuple(record.classes))
    digests[fmt.PATHS] = _write_paths(handle, record.paths)
    for spec in rest:
        numeric(spec)
    rows = record.field_rows or _field_rows(handle, record)
    for stored in stored_fields(record.fields):  # NOTE [ Stored fields ] in core.fieldkinds
        if stored.name not in record.columns:
            raise FormatError(f"field {stored.name!r} is listed, but has no values")
        digests.update(stored.write(handle, record.columns[stored.name], rows_per_chunk=rows))
    attrs = handle.attrs
    fmt.set_text(attrs, fmt.FORMAT_MARKER_KEY, fmt.FORMAT_MARKER)
    attrs[fmt.FORMAT_VERSION_KEY] = fmt.FORMAT_VERSION
    attrs[fmt.FORMAT_MINOR_KEY] = fmt.FORMAT_MINOR
    fmt.set_text(attrs, fmt.PACK_ID_KEY, integrity.new_pack_id())
    fmt.set_text(attrs, fmt.MODE_KEY, record.mode)
    fmt.set_text(attrs, fmt.STORAGE_KEY, record.storage)
    attrs[fmt.NUM_SAMPLES_KEY] = num
    attrs[fmt.CHANNELS_KEY] = record.channels
    fmt.set_text(attrs, fmt.TOOL_VERSION_KEY, record.tool_version)
    fmt.set_text(attrs, fmt.CREATED_KEY, datetime.now(timezone.utc).isoformat(timespec="seconds"))
    texts = {**record.texts, fmt.FIELDS_KEY: fields_text(record.fields)}
    for key, text in texts.items():
        fmt.set_text(attrs, key, text)
        digests[key] = integrity.text_digest(text)
    attrs[fmt.CHUNK_BYTES_KEY] = record.blob_chunk_bytes
    fmt.set_text(attrs, fmt.METADATA_DIGESTS_KEY, json.dumps(digests, sort_keys=True))


def _field_rows(handle: h5py.File, record: PackRecord) -> int:
    """Samples per chunk of the stored fields: about one chunk of the images' (or all)."""
    num = len(record.paths)
    images = handle.get(fmt.IMAGES)
    if images is None:
        return max(1, num)
    if record.storage == "blob":  # a contiguous blob: as the default chunk
        chunk = record.blob_chunk_bytes or DEFAULT_CHUNK_BYTES
        return max(1, num * chunk // max(1, int(images.shape[0])))
    return int(images.chunks[0]) if images.chunks else max(1, num)


def _write_paths(handle: h5py.File, paths: Sequence[str]) -> str:
    """Write /paths as fixed-length strings in gzip chunks; return their digest."""
    num = len(paths)
    width = max([1, *(len(os.fsencode(p)) for p in paths)])
    rows = max(1, min(num, PATHS_CHUNK_BYTES // width))
    stored = handle.create_dataset(
        fmt.PATHS,
        shape=(num,),
        dtype=h5py.string_dtype("utf-8", width),
        chunks=(rows,),
        compression="gzip",
        compression_opts=4,
    )
    crc = 0
    for lo in range(0, num, fmt.PATH_SLAB):
        encoded = [os.fsencode(p) for p in paths[lo : lo + fmt.PATH_SLAB]]
        crc = integrity.strings_crc(encoded, crc)
        values = np.array(encoded, dtype=f"S{width}")
        fmt.write_fixed_strings(stored, lo, values)
    return integrity.hex32(crc)


def skipped_text(skipped: Sequence[SkippedFile]) -> str:
    """Return the ``skipped`` attribute's text (JSON list of {path, reason})."""
    return json.dumps([{"path": s.path, "reason": s.reason} for s in skipped])
