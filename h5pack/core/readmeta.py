"""A pack's metadata (``PackMeta``) and paths, checked against their digests."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from h5pack._types import StrPath, parse_choice
from h5pack.core import integrity
from h5pack.core import names as _names
from h5pack.core.description import PackIndex
from h5pack.core.integrity import PackIdentity
from h5pack.core.names import Mode, Storage
from h5pack.core.opening import (
    as_text,
    attr_text,
    check_is_pack,
    described,
    identity_of,
    open_h5,
    reading,
)
from h5pack.errors import FormatError


@dataclass(frozen=True)
class SkippedFile:
    """A source file that was not packed, and why."""

    path: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class PackMeta:
    """Everything about a pack but the image bytes, read once at open (docs/format.md)."""

    path: str
    format_version: int
    mode: Mode
    storage: Storage
    num_samples: int
    channels: int
    labels: np.ndarray
    classes: tuple[str, ...]
    shapes: np.ndarray
    checksums: np.ndarray
    source_index: np.ndarray
    offsets: np.ndarray | None
    sizes: np.ndarray | None
    images_shape: tuple[int, ...]
    chunks: tuple[int, ...] | None
    compression: str | None
    compression_opts: Any
    filter_ids: tuple[int, ...]
    blob_chunk_bytes: int
    tool_version: str
    created_utc: str
    options: Mapping[str, Any] = field(default_factory=dict)
    skipped: tuple[SkippedFile, ...] = ()
    format_minor: int = 0
    sample_xxh3: np.ndarray | None = None
    digests: Mapping[str, str] = field(default_factory=dict)
    damaged: tuple[str, ...] = ()
    identity: PackIdentity | None = None
    shard: Mapping[str, Any] = field(default_factory=dict)
    field_listing: str | None = None

    @property
    def fixed_shape(self) -> tuple[int, int, int] | None:
        """(H, W, C) when every sample has the same stored shape (array storage), else None."""
        if self.storage == "array":
            h, w, c = self.images_shape[1:]
            return (h, w, c)
        return None

    @property
    def pack_id(self) -> str | None:
        """The pack's random id (format 1.1), or None."""
        return self.identity.pack_id if self.identity is not None else None

    def blob_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(offsets, sizes)`` of a blob pack's samples (``FormatError`` for others)."""
        if self.offsets is None or self.sizes is None:
            raise FormatError(
                f"{self.path}: its {self.storage} storage locates no sample by byte offsets "
                "(a pack set's are each shard's)"
            )
        return self.offsets, self.sizes

    def sample_arrays(self) -> dict[str, np.ndarray]:
        """Return the per-sample arrays this metadata holds, by dataset name."""
        found = {a.name: getattr(self, a.attribute) for a in _names.SAMPLE_ARRAYS}
        return {name: array for name, array in found.items() if array is not None}


def _digests(attrs: Any, path: str, minor: int) -> dict[str, str]:
    if _names.METADATA_DIGESTS_KEY not in attrs:
        if minor >= 1:
            raise FormatError(
                f"{path}: pack attribute {_names.METADATA_DIGESTS_KEY!r} is missing; "
                f"{_names.DAMAGED}"
            )
        return {}
    recorded = json.loads(attr_text(attrs, _names.METADATA_DIGESTS_KEY, path))
    if not isinstance(recorded, dict):
        raise FormatError(
            f"{path}: {_names.METADATA_DIGESTS_KEY!r} is not a JSON object; {_names.DAMAGED}"
        )
    return {str(k): str(v) for k, v in recorded.items()}


def classes_digest(classes: tuple[str, ...]) -> str:
    """Return the digest ``metadata_crc32`` records for a class list."""
    return integrity.strings_digest(c.encode("utf-8", "surrogateescape") for c in classes)


def damaged_names(recorded: Mapping[str, str], found: Mapping[str, str]) -> tuple[str, ...]:
    """Return the names whose ``found`` digest differs from the ``recorded`` one."""
    return tuple(name for name, value in found.items() if recorded.get(name, value) != value)


def _damage_message(path: str, damaged: tuple[str, ...]) -> str:
    names = ", ".join(repr(n) for n in damaged)
    return (
        f"{path}: the pack's metadata is damaged: {names} no longer match the CRC32 "
        f"recorded at conversion; {_names.DAMAGED}"
    )


def read_meta(
    handle: h5py.File | PackIndex, path: str | None = None, *, check_digests: bool = True
) -> PackMeta:
    """Read and validate a pack's metadata from an open file or its description.

    ``check_digests=False`` lists the names that fail their digest in ``damaged`` (for
    ``verify``) instead of raising.
    """
    index = described(handle, path)
    path = index.path
    version = check_is_pack(index, path)
    texts = {_names.OPTIONS_KEY: "{}", _names.SKIPPED_KEY: "[]"}
    with reading(path, "the pack's root attributes"):
        attrs = index.attrs
        minor = int(attrs.get(_names.FORMAT_MINOR_KEY, 0))
        mode_text = attr_text(attrs, _names.MODE_KEY, path)
        storage_text = attr_text(attrs, _names.STORAGE_KEY, path)
        num_samples = int(attrs.get(_names.NUM_SAMPLES_KEY, -1))
        channels = int(attrs.get(_names.CHANNELS_KEY, 3))
        blob_chunk_bytes = int(attrs.get(_names.CHUNK_BYTES_KEY, 0))
        written = {key: attrs.get(key) for key in (_names.TOOL_VERSION_KEY, _names.CREATED_KEY)}
        for key in (_names.OPTIONS_KEY, _names.SKIPPED_KEY, _names.SHARD_KEY, _names.FIELDS_KEY):
            if key in attrs:
                texts[key] = attr_text(attrs, key, path)
        recorded = _digests(attrs, path, minor)
    mode = parse_choice(mode_text, _names.MODES)
    storage = parse_choice(storage_text, _names.STORAGES)
    if mode is None:
        raise FormatError(f"{path}: unknown mode {mode_text!r}")
    if storage is None:
        raise FormatError(f"{path}: unknown storage {storage_text!r}")
    with reading(path, "the pack's datasets"):
        present = set(index.names())
        for name in (_names.IMAGES, _names.CLASSES, *_names.PER_SAMPLE_DATASETS):
            if name not in present:
                raise FormatError(f"{path}: dataset {name!r} is missing")
        for name in _names.PER_SAMPLE_DATASETS:
            if (count := index.shape(name)[0]) != num_samples:
                raise FormatError(
                    f"{path}: dataset {name!r} has {count} rows, but the pack has "
                    f"{num_samples} samples"
                )
    with reading(path, f"dataset {_names.IMAGES!r}"):
        images = index.images()
    arrays: dict[str, np.ndarray] = {}
    for spec in _names.SAMPLE_ARRAYS:  # NOTE [ Per-sample arrays ]
        if spec.name in present and (storage == "blob" or not spec.blob_only):
            with reading(path, f"dataset {spec.name!r}"):
                arrays[spec.name] = index.array(spec.name)
    with reading(path, f"dataset {_names.CLASSES!r}"):
        classes = tuple(as_text(c) for c in index.array(_names.CLASSES))
    found = {
        name: integrity.array_digest(a, _names.DIGESTED_ARRAYS[name]) for name, a in arrays.items()
    }
    found[_names.CLASSES] = classes_digest(classes)
    found.update({key: integrity.text_digest(text) for key, text in texts.items()})
    damaged = damaged_names(recorded, found)
    if damaged and (check_digests or {_names.OFFSETS, _names.SIZES} & set(damaged)):
        raise FormatError(_damage_message(path, damaged))
    offsets = sizes = None
    if storage == "array":
        if len(images.shape) != 4 or images.shape[0] != num_samples:
            raise FormatError(
                f"{path}: images should be (N, H, W, C) with N={num_samples}, "
                f"but got {images.shape}"
            )
    else:
        if _names.OFFSETS not in arrays or _names.SIZES not in arrays:
            raise FormatError(f"{path}: blob storage needs {_names.OFFSETS!r} and {_names.SIZES!r}")
        offsets = arrays[_names.OFFSETS].astype(np.int64)
        sizes = arrays[_names.SIZES].astype(np.int64)
        if offsets.shape != (num_samples + 1,) or sizes.shape != (num_samples,):
            raise FormatError(f"{path}: offsets/sizes do not match {num_samples} samples")
        if num_samples and (
            np.any(np.diff(offsets) < sizes) or offsets[-1] > images.shape[0] or offsets[0] < 0
        ):
            raise FormatError(f"{path}: offsets and sizes are inconsistent with the blob")
    labels = arrays[_names.LABELS].astype(np.int64)
    label_damage = {_names.LABELS, _names.CLASSES} & set(damaged)
    if not label_damage and labels.size and (labels.max() >= len(classes) or labels.min() < -1):
        raise FormatError(f"{path}: labels fall outside the {len(classes)} stored classes")
    for key, value in written.items():
        if value is None:
            raise FormatError(f"{path}: pack attribute {key!r} is missing")
    xxh3 = arrays.get(_names.SAMPLE_XXH3)
    if xxh3 is not None and xxh3.shape != (num_samples,):
        raise FormatError(f"{path}: {_names.SAMPLE_XXH3!r} does not have {num_samples} rows")
    with reading(path, "the pack's options and skipped files"):
        options = json.loads(texts[_names.OPTIONS_KEY])
        skipped = tuple(
            SkippedFile(path=str(s["path"]), reason=str(s["reason"]))
            for s in json.loads(texts[_names.SKIPPED_KEY])
        )
        shard = json.loads(texts.get(_names.SHARD_KEY, "{}"))
    return PackMeta(
        path=path,
        format_version=version,
        mode=mode,
        storage=storage,
        num_samples=num_samples,
        channels=channels,
        labels=labels,
        classes=classes,
        shapes=arrays[_names.SHAPES].astype(np.int32),
        checksums=arrays[_names.CHECKSUMS].astype(np.uint32),
        source_index=arrays[_names.SOURCE_INDEX].astype(np.int64),
        offsets=offsets,
        sizes=sizes,
        images_shape=images.shape,
        chunks=images.chunks,
        compression=images.compression,
        compression_opts=images.compression_opts,
        filter_ids=tuple(f for f, _ in images.filters),
        blob_chunk_bytes=blob_chunk_bytes,
        tool_version=as_text(written[_names.TOOL_VERSION_KEY]),
        created_utc=as_text(written[_names.CREATED_KEY]),
        options=options if isinstance(options, dict) else {},
        skipped=skipped,
        format_minor=minor,
        sample_xxh3=xxh3.astype(np.uint64) if xxh3 is not None else None,
        digests=recorded,
        damaged=damaged,
        identity=identity_of(index, path),
        shard=shard if isinstance(shard, dict) else {},
        field_listing=texts.get(_names.FIELDS_KEY),
    )


def read_paths(
    handle: h5py.File | PackIndex, meta: PackMeta | None = None, *, check: bool = True
) -> list[str]:
    """Return every sample's relative source path, in order, checked against ``meta``'s digest."""
    index = described(handle, meta.path if meta is not None else None)
    paths: list[str] = []
    with reading(index.path, f"dataset {_names.PATHS!r}"):
        stored = index.paths()
        for lo in range(0, len(stored), _names.PATH_SLAB):
            paths.extend(_names.decode_path(p) for p in stored[lo : lo + _names.PATH_SLAB])
    if check and meta is not None and not paths_match(meta, paths):
        raise FormatError(_damage_message(index.path, (_names.PATHS,)))
    return paths


def paths_match(meta: PackMeta, paths: list[str]) -> bool:
    """Return whether ``paths`` match the digest recorded for them (True when none was)."""
    recorded = meta.digests.get(_names.PATHS)
    return recorded is None or recorded == integrity.strings_digest(os.fsencode(p) for p in paths)


def load_meta(
    path: StrPath, *, locking: bool | None = None, check_digests: bool = True
) -> PackMeta:
    """Open ``path``, read its metadata and close it."""
    with open_h5(path, locking=locking) as handle:
        return read_meta(handle, os.fspath(path), check_digests=check_digests)
