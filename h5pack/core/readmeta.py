"""Reading a pack's metadata and paths, checked against the digests recorded at conversion.

Import these from ``core.format``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from h5pack._types import StrPath, parse_choice
from h5pack.core import integrity
from h5pack.core import names as _names
from h5pack.core.description import PackIndex
from h5pack.core.names import (
    CHANNELS_KEY,
    CHECKSUMS,
    CHUNK_BYTES_KEY,
    CLASSES,
    CREATED_KEY,
    DAMAGED,
    DIGESTED_ARRAYS,
    FIELDS_KEY,
    FORMAT_MINOR_KEY,
    IMAGES,
    LABELS,
    METADATA_DIGESTS_KEY,
    MODE_KEY,
    MODES,
    NUM_SAMPLES_KEY,
    OFFSETS,
    OPTIONS_KEY,
    PATHS,
    PER_SAMPLE_DATASETS,
    SAMPLE_ARRAYS,
    SAMPLE_XXH3,
    SHAPES,
    SHARD_KEY,
    SIZES,
    SKIPPED_KEY,
    SOURCE_INDEX,
    STORAGE_KEY,
    STORAGES,
    TOOL_VERSION_KEY,
    decode_path,
)
from h5pack.core.opening import (
    as_text,
    attr_text,
    check_is_pack,
    described,
    identity_of,
    open_h5,
    reading,
)
from h5pack.core.packmeta import PackMeta, SkippedFile
from h5pack.errors import FormatError


def _digests(attrs: Any, path: str, minor: int) -> dict[str, str]:
    if METADATA_DIGESTS_KEY not in attrs:
        if minor >= 1:
            raise FormatError(
                f"{path}: pack attribute {METADATA_DIGESTS_KEY!r} is missing; {DAMAGED}"
            )
        return {}
    recorded = json.loads(attr_text(attrs, METADATA_DIGESTS_KEY, path))
    if not isinstance(recorded, dict):
        raise FormatError(f"{path}: {METADATA_DIGESTS_KEY!r} is not a JSON object; {DAMAGED}")
    return {str(k): str(v) for k, v in recorded.items()}


def _read_array(index: PackIndex, name: str, path: str) -> np.ndarray:
    with reading(path, f"dataset {name!r}"):
        return index.array(name)


def _class_names(stored: np.ndarray) -> tuple[str, ...]:
    return tuple(as_text(c) for c in stored)


def classes_digest(classes: tuple[str, ...]) -> str:
    """Return the digest ``metadata_crc32`` records for a class list."""
    return integrity.strings_digest(c.encode("utf-8", "surrogateescape") for c in classes)


def paths_digest(paths: list[str]) -> str:
    """Return the digest ``metadata_crc32`` records for a list of relative paths."""
    return integrity.strings_digest(os.fsencode(p) for p in paths)


def damaged_names(recorded: Mapping[str, str], found: Mapping[str, str]) -> tuple[str, ...]:
    """Return the names whose ``found`` digest differs from the ``recorded`` one."""
    return tuple(name for name, value in found.items() if recorded.get(name, value) != value)


def _damage_message(path: str, damaged: tuple[str, ...]) -> str:
    names = ", ".join(repr(n) for n in damaged)
    return (
        f"{path}: the pack's metadata is damaged: {names} no longer match the CRC32 "
        f"recorded at conversion; {DAMAGED}"
    )


def read_meta(
    handle: h5py.File | PackIndex, path: str | None = None, *, check_digests: bool = True
) -> PackMeta:
    """Read and validate a pack's metadata from an open file or its description.

    Args:
        handle: The open file, or its description (``open_index``).
        path: The pack's path, for messages (default: the handle's file name).
        check_digests: Raise when a dataset or attribute no longer matches its recorded
            digest (format 1.1). ``False`` records the names in ``PackMeta.damaged`` instead,
            for ``verify`` to report (damaged offsets or sizes still raise: no sample can
            be located without them).

    Raises:
        FormatError: the file is not a pack, is newer than supported, is malformed, or is
            damaged (HDF5 cannot read it, or a digest does not match).
    """
    index = described(handle, path)
    path = index.path
    version = check_is_pack(index, path)
    with reading(path, "the pack's root attributes"):
        attrs = index.attrs
        minor = int(attrs.get(FORMAT_MINOR_KEY, 0))
        mode_text = attr_text(attrs, MODE_KEY, path)
        storage_text = attr_text(attrs, STORAGE_KEY, path)
        num_samples = int(attrs.get(NUM_SAMPLES_KEY, -1))
        channels = int(attrs.get(CHANNELS_KEY, 3))
        blob_chunk_bytes = int(attrs.get(CHUNK_BYTES_KEY, 0))
        texts = {key: attrs.get(key) for key in (TOOL_VERSION_KEY, CREATED_KEY)}
        options_text = attr_text(attrs, OPTIONS_KEY, path) if OPTIONS_KEY in attrs else "{}"
        skipped_text = attr_text(attrs, SKIPPED_KEY, path) if SKIPPED_KEY in attrs else "[]"
        shard_text = attr_text(attrs, SHARD_KEY, path) if SHARD_KEY in attrs else None
        listing = attr_text(attrs, FIELDS_KEY, path) if FIELDS_KEY in attrs else None
        recorded = _digests(attrs, path, minor)
    mode = parse_choice(mode_text, MODES)
    storage = parse_choice(storage_text, STORAGES)
    if mode is None:
        raise FormatError(f"{path}: unknown mode {mode_text!r}")
    if storage is None:
        raise FormatError(f"{path}: unknown storage {storage_text!r}")
    with reading(path, "the pack's datasets"):
        present = set(index.names())
    for name in (IMAGES, CLASSES, *PER_SAMPLE_DATASETS):
        if name not in present:
            raise FormatError(f"{path}: dataset {name!r} is missing")
    with reading(path, "the pack's datasets"):
        rows = {name: index.shape(name)[0] for name in PER_SAMPLE_DATASETS}
    for name, count in rows.items():
        if count != num_samples:
            raise FormatError(
                f"{path}: dataset {name!r} has {count} rows, but the pack has {num_samples} samples"
            )
    with reading(path, f"dataset {IMAGES!r}"):
        images = index.images()
    images_shape, chunks = images.shape, images.chunks
    arrays: dict[str, np.ndarray] = {}
    for spec in SAMPLE_ARRAYS:  # NOTE [ Per-sample arrays ]
        if spec.name in present and (storage == "blob" or not spec.blob_only):
            arrays[spec.name] = _read_array(index, spec.name, path)
    classes = _class_names(_read_array(index, CLASSES, path))
    found = {name: integrity.array_digest(a, DIGESTED_ARRAYS[name]) for name, a in arrays.items()}
    found[CLASSES] = classes_digest(classes)
    found[OPTIONS_KEY] = integrity.text_digest(options_text)
    found[SKIPPED_KEY] = integrity.text_digest(skipped_text)
    if shard_text is not None:
        found[SHARD_KEY] = integrity.text_digest(shard_text)
    if listing is not None:
        found[FIELDS_KEY] = integrity.text_digest(listing)
    damaged = damaged_names(recorded, found)
    if damaged and (check_digests or {OFFSETS, SIZES} & set(damaged)):
        raise FormatError(_damage_message(path, damaged))
    offsets = sizes = None
    if storage == "array":
        if len(images_shape) != 4 or images_shape[0] != num_samples:
            raise FormatError(
                f"{path}: images should be (N, H, W, C) with N={num_samples}, "
                f"but got {images_shape}"
            )
    else:
        if OFFSETS not in arrays or SIZES not in arrays:
            raise FormatError(f"{path}: blob storage needs {OFFSETS!r} and {SIZES!r}")
        offsets = arrays[OFFSETS].astype(np.int64)
        sizes = arrays[SIZES].astype(np.int64)
        if offsets.shape != (num_samples + 1,) or sizes.shape != (num_samples,):
            raise FormatError(f"{path}: offsets/sizes do not match {num_samples} samples")
        if num_samples and (
            np.any(np.diff(offsets) < sizes) or offsets[-1] > images_shape[0] or offsets[0] < 0
        ):
            raise FormatError(f"{path}: offsets and sizes are inconsistent with the blob")
    labels = arrays[LABELS].astype(np.int64)
    label_damage = {LABELS, CLASSES} & set(damaged)
    if not label_damage and labels.size and (labels.max() >= len(classes) or labels.min() < -1):
        raise FormatError(f"{path}: labels fall outside the {len(classes)} stored classes")
    for key, value in texts.items():
        if value is None:
            raise FormatError(f"{path}: pack attribute {key!r} is missing")
    sample_xxh3 = arrays.get(SAMPLE_XXH3)
    if sample_xxh3 is not None and sample_xxh3.shape != (num_samples,):
        raise FormatError(f"{path}: {SAMPLE_XXH3!r} does not have {num_samples} rows")
    with reading(path, "the pack's options and skipped files"):
        options = json.loads(options_text)
        skipped = tuple(
            SkippedFile(path=str(s["path"]), reason=str(s["reason"]))
            for s in json.loads(skipped_text)
        )
        shard = json.loads(shard_text) if shard_text is not None else {}
    return PackMeta(
        path=path,
        format_version=version,
        mode=mode,
        storage=storage,
        num_samples=num_samples,
        channels=channels,
        labels=labels,
        classes=classes,
        shapes=arrays[SHAPES].astype(np.int32),
        checksums=arrays[CHECKSUMS].astype(np.uint32),
        source_index=arrays[SOURCE_INDEX].astype(np.int64),
        offsets=offsets,
        sizes=sizes,
        images_shape=images_shape,
        chunks=chunks,
        compression=images.compression,
        compression_opts=images.compression_opts,
        filter_ids=tuple(f for f, _ in images.filters),
        blob_chunk_bytes=blob_chunk_bytes,
        tool_version=as_text(texts[TOOL_VERSION_KEY]),
        created_utc=as_text(texts[CREATED_KEY]),
        options=options if isinstance(options, dict) else {},
        skipped=skipped,
        format_minor=minor,
        sample_xxh3=sample_xxh3.astype(np.uint64) if sample_xxh3 is not None else None,
        digests=recorded,
        damaged=damaged,
        identity=identity_of(index, path),
        shard=shard if isinstance(shard, dict) else {},
        field_listing=listing,
    )


def read_paths(
    handle: h5py.File | PackIndex, meta: PackMeta | None = None, *, check: bool = True
) -> list[str]:
    """Return every sample's relative source path, in pack order.

    Args:
        handle: The open pack, or its description.
        meta: Its metadata: with ``check``, the paths are checked against the digest it
            recorded (format 1.1).
        check: Raise when the paths do not match their digest.

    Raises:
        FormatError: the paths cannot be read, or do not match their digest (damage).
    """
    index = described(handle, meta.path if meta is not None else None)
    path = index.path
    paths: list[str] = []
    with reading(path, f"dataset {PATHS!r}"):
        stored = index.paths()
        for lo in range(0, len(stored), _names.PATH_SLAB):
            paths.extend(decode_path(p) for p in stored[lo : lo + _names.PATH_SLAB])
    if check and meta is not None and not paths_match(meta, paths):
        raise FormatError(_damage_message(path, (PATHS,)))
    return paths


def paths_match(meta: PackMeta, paths: list[str]) -> bool:
    """Return whether ``paths`` match the digest recorded for them (True when none was)."""
    recorded = meta.digests.get(PATHS)
    return recorded is None or recorded == paths_digest(paths)


def load_meta(
    path: StrPath, *, locking: bool | None = None, check_digests: bool = True
) -> PackMeta:
    """Open ``path``, read its metadata and close it.

    Raises:
        FileNotFoundError: the path does not exist.
        FormatError: the path is not a valid pack, or is damaged.
    """
    with open_h5(path, locking=locking) as handle:
        return read_meta(handle, os.fspath(path), check_digests=check_digests)
