"""The on-disk format of a pack (version 1): names, attributes, and opening a pack.

This module is the single place that spells a dataset name, an attribute key or the
format version. Writers and readers both import it.

Layout of a pack, version 1::

    /                       attrs: FORMAT_MARKER_KEY = "h5pack", FORMAT_VERSION_KEY = 1,
                                   mode ("raw" | "encoded"), storage ("array" | "blob"),
                                   num_samples, channels, tool_version, created_utc,
                                   options (JSON), skipped (JSON list of {path, reason}),
                                   chunk_bytes (blob storage: bytes per chunk, else 0)
    /images                 storage "array": uint8 (N, H, W, C), contiguous or chunked
                            storage "blob":  uint8 (total_bytes,), chunked by bytes
    /offsets                storage "blob" only: int64 (N + 1,), sample i's slot is
                            [offsets[i], offsets[i + 1]); slots never straddle a chunk
                            boundary unless a sample is larger than a chunk (see
                            docs/ARCHITECTURE.md, "Aligned blobs")
    /sizes                  storage "blob" only: int64 (N,), bytes of sample i inside its slot
    /labels                 int64 (N,), -1 when unlabeled
    /classes                UTF-8 strings (K,); labels index into it
    /paths                  bytes (N,): source path relative to the root, "/"-separated,
                            os.fsencode()d so names that are not UTF-8 round-trip
    /shapes                 int32 (N, 3): decoded (H, W, C) of each sample
    /checksums              uint32 (N,): CRC32 of the stored (uncompressed) bytes of sample i
    /source_index           int64 (N,): position of sample i in the sorted scan order
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import h5py
import numpy as np

from h5pack._types import StrPath, parse_choice
from h5pack.errors import FormatError, PackNotFoundError

FORMAT_MARKER = "h5pack"
FORMAT_VERSION = 1

# Root attribute keys.
FORMAT_MARKER_KEY = "h5pack_format"
FORMAT_VERSION_KEY = "h5pack_format_version"
MODE_KEY = "mode"
STORAGE_KEY = "storage"
NUM_SAMPLES_KEY = "num_samples"
CHANNELS_KEY = "channels"
TOOL_VERSION_KEY = "tool_version"
CREATED_KEY = "created_utc"
OPTIONS_KEY = "options"
SKIPPED_KEY = "skipped"
CHUNK_BYTES_KEY = "chunk_bytes"

# Dataset names.
IMAGES = "images"
OFFSETS = "offsets"
SIZES = "sizes"
LABELS = "labels"
CLASSES = "classes"
PATHS = "paths"
SHAPES = "shapes"
CHECKSUMS = "checksums"
SOURCE_INDEX = "source_index"

PER_SAMPLE_DATASETS = (LABELS, PATHS, SHAPES, CHECKSUMS, SOURCE_INDEX)

# What a pack stores: decoded pixels or the image files' bytes.
Mode = Literal["raw", "encoded"]
# How the images dataset holds them: one (N, H, W, C) array, or a flat byte blob + offsets.
Storage = Literal["array", "blob"]
MODES: tuple[Mode, ...] = get_args(Mode)
STORAGES: tuple[Storage, ...] = get_args(Storage)

UTF8_STR = h5py.string_dtype(encoding="utf-8")
PATH_BYTES = h5py.vlen_dtype(np.dtype("uint8"))


def checksum(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """Return the checksum stored for a sample: CRC32 of its stored, uncompressed bytes."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).data
    return zlib.crc32(data)


def encode_path(relative: str) -> np.ndarray:
    """Return the stored form of a relative source path (its file-system bytes)."""
    return np.frombuffer(os.fsencode(relative), dtype=np.uint8)


def decode_path(stored: np.ndarray | bytes) -> str:
    """Return the relative source path from its stored bytes (undecodable bytes round-trip)."""
    return os.fsdecode(bytes(stored))


@dataclass(frozen=True)
class SkippedFile:
    """A source file that was not packed, and why."""

    path: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class PackMeta:
    """Everything about a pack except the image bytes, read once at open.

    Attributes:
        path: The pack's path.
        format_version: The pack's format version.
        mode: ``"raw"`` (decoded pixels) or ``"encoded"`` (image file bytes).
        storage: ``"array"`` (one (N, H, W, C) array) or ``"blob"`` (bytes + offsets).
        num_samples: N.
        channels: 1 or 3.
        labels: int64 (N,).
        classes: Class names; ``labels`` index into them.
        shapes: int32 (N, 3) decoded shapes.
        checksums: uint32 (N,).
        source_index: int64 (N,).
        offsets: int64 (N + 1,) for blob storage, else None.
        sizes: int64 (N,) for blob storage, else None.
        images_shape: Shape of the images dataset.
        chunks: Chunk shape of the images dataset, or None when contiguous.
        compression: h5py's name of the compression filter, or the plugin's id, or None.
        compression_opts: The filter's options as stored.
        blob_chunk_bytes: Bytes per chunk of a blob (0 for array storage).
        tool_version: Version of h5pack that wrote the pack.
        created_utc: ISO time of writing.
        options: The conversion options used, as a dict.
        skipped: Files left out at conversion.
    """

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

    @property
    def fixed_shape(self) -> tuple[int, int, int] | None:
        """(H, W, C) when every sample has the same stored shape (array storage), else None."""
        if self.storage == "array":
            h, w, c = self.images_shape[1:]
            return (h, w, c)
        return None


def _attr_str(attrs: Any, key: str, path: str) -> str:
    if key not in attrs:
        raise FormatError(f"{path}: pack attribute {key!r} is missing")
    value = attrs[key]
    return value.decode() if isinstance(value, bytes) else str(value)


def check_is_pack(handle: h5py.File, path: str) -> int:
    """Return the format version of an open file, or raise ``FormatError`` if it is no pack.

    Raises:
        FormatError: the file has no h5pack marker, or a format version newer than this
            h5pack reads.
    """
    attrs = handle.attrs
    marker = attrs.get(FORMAT_MARKER_KEY)
    if isinstance(marker, bytes):
        marker = marker.decode()
    if marker != FORMAT_MARKER:
        raise FormatError(
            f"{path} is an HDF5 file but not an h5pack pack (no {FORMAT_MARKER_KEY!r} "
            f"attribute); create one with `h5pack convert IMAGES {path}`"
        )
    version = int(attrs.get(FORMAT_VERSION_KEY, -1))
    if version > FORMAT_VERSION:
        raise FormatError(
            f"{path} is a pack of format version {version}, but this h5pack reads up to "
            f"version {FORMAT_VERSION}; upgrade h5pack"
        )
    if version < 1:
        raise FormatError(f"{path}: invalid pack format version {version}")
    return version


def open_h5(path: StrPath, *, locking: bool | None = None, **kwargs: Any) -> h5py.File:
    """Open ``path`` read-only with h5pack's plugins registered; clear errors for bad paths.

    Args:
        path: The file to open.
        locking: HDF5 file locking; ``False`` for network file systems or to read a file
            that a writer still holds. ``None`` keeps HDF5's default.
        **kwargs: Passed to ``h5py.File`` (e.g. ``rdcc_nbytes``).

    Raises:
        FileNotFoundError: the path does not exist.
        FormatError: the path is not an HDF5 file.
    """
    import hdf5plugin  # noqa: F401  (registers the LZ4/Zstd/Blosc/Bitshuffle filters)

    text = os.fspath(path)
    if not Path(text).exists():
        raise PackNotFoundError(f"{text}: no such pack")
    if Path(text).is_dir():
        raise FormatError(f"{text} is a directory, not a pack")
    if locking is not None:
        kwargs["locking"] = locking
    try:
        return h5py.File(text, "r", **kwargs)
    except BlockingIOError as err:
        raise FormatError(
            f"{text} is locked by a process writing it; wait for it, or pass locking=False "
            "to read anyway"
        ) from err
    except OSError as err:
        raise FormatError(f"{text} is not a readable HDF5 file ({err})") from err


def read_meta(handle: h5py.File, path: str | None = None) -> PackMeta:
    """Read and validate a pack's metadata from an open file.

    Raises:
        FormatError: the file is not a pack, is newer than supported, or is malformed.
    """
    path = path or handle.filename
    version = check_is_pack(handle, path)
    attrs = handle.attrs
    mode_text = _attr_str(attrs, MODE_KEY, path)
    storage_text = _attr_str(attrs, STORAGE_KEY, path)
    mode = parse_choice(mode_text, MODES)
    storage = parse_choice(storage_text, STORAGES)
    if mode is None:
        raise FormatError(f"{path}: unknown mode {mode_text!r}")
    if storage is None:
        raise FormatError(f"{path}: unknown storage {storage_text!r}")
    for name in (IMAGES, CLASSES, *PER_SAMPLE_DATASETS):
        if name not in handle:
            raise FormatError(f"{path}: dataset {name!r} is missing")
    num_samples = int(attrs.get(NUM_SAMPLES_KEY, -1))
    for name in PER_SAMPLE_DATASETS:
        if handle[name].shape[0] != num_samples:
            raise FormatError(
                f"{path}: dataset {name!r} has {handle[name].shape[0]} rows, "
                f"but the pack has {num_samples} samples"
            )
    images = handle[IMAGES]
    offsets = sizes = None
    if storage == "array":
        if images.ndim != 4 or images.shape[0] != num_samples:
            raise FormatError(
                f"{path}: images should be (N, H, W, C) with N={num_samples}, "
                f"but got {images.shape}"
            )
    else:
        if OFFSETS not in handle or SIZES not in handle:
            raise FormatError(f"{path}: blob storage needs {OFFSETS!r} and {SIZES!r}")
        offsets = handle[OFFSETS][()].astype(np.int64)
        sizes = handle[SIZES][()].astype(np.int64)
        if offsets.shape != (num_samples + 1,) or sizes.shape != (num_samples,):
            raise FormatError(f"{path}: offsets/sizes do not match {num_samples} samples")
        if num_samples and (
            np.any(np.diff(offsets) < sizes) or offsets[-1] > images.shape[0] or offsets[0] < 0
        ):
            raise FormatError(f"{path}: offsets and sizes are inconsistent with the blob")
    labels = handle[LABELS][()].astype(np.int64)
    classes = tuple(
        c.decode() if isinstance(c, bytes) else str(c) for c in handle[CLASSES][()]
    )
    if labels.size and (labels.max() >= len(classes) or labels.min() < -1):
        raise FormatError(f"{path}: labels fall outside the {len(classes)} stored classes")
    filter_ids = tuple(_filter_ids(images))
    options = json.loads(_attr_str(attrs, OPTIONS_KEY, path)) if OPTIONS_KEY in attrs else {}
    skipped_raw = json.loads(_attr_str(attrs, SKIPPED_KEY, path)) if SKIPPED_KEY in attrs else []
    return PackMeta(
        path=path,
        format_version=version,
        mode=mode,
        storage=storage,
        num_samples=num_samples,
        channels=int(attrs.get(CHANNELS_KEY, 3)),
        labels=labels,
        classes=classes,
        shapes=handle[SHAPES][()].astype(np.int32),
        checksums=handle[CHECKSUMS][()].astype(np.uint32),
        source_index=handle[SOURCE_INDEX][()].astype(np.int64),
        offsets=offsets,
        sizes=sizes,
        images_shape=tuple(int(s) for s in images.shape),
        chunks=tuple(int(c) for c in images.chunks) if images.chunks else None,
        compression=images.compression,
        compression_opts=images.compression_opts,
        filter_ids=filter_ids,
        blob_chunk_bytes=int(attrs.get(CHUNK_BYTES_KEY, 0)),
        tool_version=_attr_str(attrs, TOOL_VERSION_KEY, path),
        created_utc=_attr_str(attrs, CREATED_KEY, path),
        options=options,
        skipped=tuple(SkippedFile(path=s["path"], reason=s["reason"]) for s in skipped_raw),
    )


def read_paths(handle: h5py.File) -> list[str]:
    """Return every sample's relative source path, in pack order."""
    return [decode_path(p) for p in handle[PATHS][()]]


def _filter_ids(dataset: h5py.Dataset) -> list[int]:
    plist = dataset.id.get_create_plist()
    return [int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters())]


def load_meta(path: StrPath, *, locking: bool | None = None) -> PackMeta:
    """Open ``path``, read its metadata and close it.

    Raises:
        FileNotFoundError: the path does not exist.
        FormatError: the path is not a valid pack.
    """
    with open_h5(path, locking=locking) as handle:
        return read_meta(handle, os.fspath(path))
