"""The write half of a pack's record: ``write_record`` writes all but the images."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
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

PATHS_CHUNK_BYTES = 1 << 20  # uncompressed bytes of one chunk of /paths


@dataclass(frozen=True, kw_only=True)
class PackRecord:
    """Everything a pack records besides its images (``arrays`` by dataset name)."""

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


def write_record(handle: h5py.File, record: PackRecord) -> None:
    """Write every dataset and attribute of a pack but its images, with their digests."""
    num = len(record.paths)
    digests: dict[str, str] = {}
    unknown = sorted(set(record.arrays) - {spec.name for spec in fmt.SAMPLE_ARRAYS})
    if unknown:
        raise FormatError(f"the format has no per-sample arrays {unknown}")

    def numeric(spec: fmt.SampleArray) -> None:
        values = record.arrays.get(spec.name)
        if (spec.blob_only and record.storage != "blob") or (values is None and spec.optional):
            return
        if values is None:
            raise FormatError(f"a {record.storage} pack needs its {spec.name!r} array")
        data = np.asarray(values)
        if data.ndim <= 1:
            data = data.reshape(num + spec.extra_rows)
        data = np.ascontiguousarray(data.astype(np.dtype(spec.dtype)))
        handle.create_dataset(spec.name, data=data)
        digests[spec.name] = integrity.array_digest(data, spec.dtype)

    first, *rest = fmt.SAMPLE_ARRAYS  # labels, then classes and paths, then the others
    numeric(first)
    digests[fmt.CLASSES] = _write_strings(
        handle, fmt.CLASSES, record.classes, lambda c: c.encode("utf-8", "surrogateescape")
    )
    digests[fmt.PATHS] = _write_strings(handle, fmt.PATHS, record.paths, os.fsencode, True)
    for spec in rest:
        numeric(spec)
    rows = _field_rows(handle, record)
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
    for key, text in {**record.texts, fmt.FIELDS_KEY: fields_text(record.fields)}.items():
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


def _write_strings(
    handle: h5py.File,
    name: str,
    items: Sequence[str],
    encode: Callable[[str], bytes],
    chunked: bool = False,
) -> str:
    """Write ``items`` as fixed-length UTF-8 strings (gzip chunks if ``chunked``); digest them."""
    num = len(items)
    width = max([1, *(len(encode(s)) for s in items)])
    layout: dict[str, Any] = {}
    if chunked:
        rows = max(1, min(num, PATHS_CHUNK_BYTES // width))
        layout = {"chunks": (rows,), "compression": "gzip", "compression_opts": 4}
    dtype = h5py.string_dtype("utf-8", width)
    stored = handle.create_dataset(name, shape=(num,), dtype=dtype, **layout)
    crc = 0
    for lo in range(0, num, fmt.PATH_SLAB):
        encoded = [encode(s) for s in items[lo : lo + fmt.PATH_SLAB]]
        crc = integrity.strings_crc(encoded, crc)
        fmt.write_fixed_strings(stored, lo, np.array(encoded, dtype=f"S{width}"))
    return integrity.hex32(crc)


def skipped_text(skipped: Sequence[SkippedFile]) -> str:
    """Return the ``skipped`` attribute's text (JSON list of {path, reason})."""
    return json.dumps([{"path": s.path, "reason": s.reason} for s in skipped])
