"""The names of a pack's datasets and attributes, and its versions (docs/format.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from h5pack.core import integrity
from h5pack.core.vocabulary import MODES as MODES  # re-exported
from h5pack.core.vocabulary import STORAGES as STORAGES
from h5pack.core.vocabulary import Mode as Mode
from h5pack.core.vocabulary import Storage as Storage

FORMAT_MARKER = "h5pack"
FORMAT_VERSION = 1
FORMAT_MINOR = 1

# Root attribute keys.
FORMAT_MARKER_KEY = "h5pack_format"
FORMAT_VERSION_KEY = "h5pack_format_version"
FORMAT_MINOR_KEY = "h5pack_format_minor"
MODE_KEY = "mode"
STORAGE_KEY = "storage"
NUM_SAMPLES_KEY = "num_samples"
CHANNELS_KEY = "channels"
TOOL_VERSION_KEY = "tool_version"
CREATED_KEY = "created_utc"
OPTIONS_KEY = "options"
SKIPPED_KEY = "skipped"
CHUNK_BYTES_KEY = "chunk_bytes"
PACK_ID_KEY = "pack_id"
METADATA_DIGESTS_KEY = "metadata_crc32"
SHARD_KEY = "shard"  # optional: a pack set's shard (core.packset)
VIRTUAL_SOURCES_KEY = "virtual_sources"  # retired virtual packs: refused (decision 0160)
FIELDS_KEY = "fields"  # optional: the sample's fields (core.fields)

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
SAMPLE_XXH3 = "sample_xxh3"

PER_SAMPLE_DATASETS = (LABELS, PATHS, SHAPES, CHECKSUMS, SOURCE_INDEX)

# The fields every pack holds (the root datasets above), and where the others live.
IMAGE_FIELD = "image"
LABEL_FIELD = "label"
KEY_FIELD = "key"
FIELDS_GROUP = "fields"
FIELD_OFFSETS = "offsets"


def field_dataset(name: str, part: str = "") -> str:
    """Return the dataset of field ``name`` (``/fields/NAME``), or of its ``part``."""
    return f"{FIELDS_GROUP}/{name}" + (f".{part}" if part else "")


@dataclass(frozen=True)
class SampleArray:
    """One numeric per-sample dataset of the format.

    NOTE [ Per-sample arrays ]: ``SAMPLE_ARRAYS`` is the one list: the writer writes and
    digests each, ``read_meta`` reads and checks each, a set's fold and ``merge`` concatenate
    each (``joins``; offsets are shifted). ``in_set``: held by a set's combined ``PackMeta``.
    """

    name: str
    attribute: str
    dtype: str
    blob_only: bool = False
    optional: bool = False
    extra_rows: int = 0
    joins: bool = True
    in_set: bool = True


# In the order the writer creates them (``labels`` first, then classes and paths).
SAMPLE_ARRAYS: tuple[SampleArray, ...] = (
    SampleArray(LABELS, "labels", "<i8"),
    SampleArray(SHAPES, "shapes", "<i4"),
    SampleArray(CHECKSUMS, "checksums", "<u4"),
    SampleArray(SOURCE_INDEX, "source_index", "<i8"),
    SampleArray(SAMPLE_XXH3, "sample_xxh3", "<u8", optional=True, in_set=False),
    SampleArray(OFFSETS, "offsets", "<i8", blob_only=True, extra_rows=1, joins=False, in_set=False),
    SampleArray(SIZES, "sizes", "<i8", blob_only=True),
)
DIGESTED_ARRAYS: dict[str, str] = {a.name: a.dtype for a in SAMPLE_ARRAYS}

# Rows of /paths decoded or written at a time (bounded memory for huge packs).
PATH_SLAB = 65536

DAMAGED = "the pack is damaged: re-create it, or restore it from a copy"


def checksum(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """Return the checksum stored for a sample: CRC32 of its stored, uncompressed bytes."""
    return integrity.crc32(data)


def decode_path(stored: np.ndarray | bytes) -> str:
    """Return the relative source path from its stored bytes (undecodable bytes round-trip)."""
    return os.fsdecode(bytes(stored))


def write_fixed_strings(dataset: h5py.Dataset, start: int, values: np.ndarray) -> None:
    """Write the ``S`` array ``values`` into rows ``start..`` of a fixed-length UTF-8 dataset."""
    if not values.size:
        return
    memory = h5py.h5s.create_simple((values.size,))
    space = dataset.id.get_space()
    space.select_hyperslab((start,), (values.size,))
    dataset.id.write(memory, space, values, mtype=dataset.id.get_type())


def set_text(attrs: Any, key: str, text: str) -> None:
    """Write a text attribute as a fixed-length UTF-8 string (format 1.1: no global heap)."""
    data = text.encode("utf-8", "surrogateescape")
    attrs.create(key, np.bytes_(data), dtype=h5py.string_dtype("utf-8", max(1, len(data))))
