"""The on-disk format of a pack (version 1.1): names, attributes, and opening a pack.

This module is the single place that spells a dataset name, an attribute key or the
format version. Writers and readers both import it.

Layout of a pack, version 1 (``[1.1]``: added in format 1.1, which readers of 1.0 ignore)::

    /                       attrs: FORMAT_MARKER_KEY = "h5pack", FORMAT_VERSION_KEY = 1,
                                   [1.1] FORMAT_MINOR_KEY = 1,
                                   mode ("raw" | "encoded"), storage ("array" | "blob"),
                                   num_samples, channels, tool_version, created_utc,
                                   options (JSON), skipped (JSON list of {path, reason}),
                                   chunk_bytes (blob storage: bytes per chunk, else 0),
                                   [1.1] pack_id (32 random hex digits, new at each
                                   conversion: which pack a reader holds),
                                   [1.1] metadata_crc32 (JSON {name: 8 hex digits}, below),
                                   [1.1, optional] shard (JSON, only in the shards of a
                                   pack set: which slice of which split the pack holds,
                                   ``core.packset.ShardIdentity``; readers that do not
                                   know it ignore it),
                                   [1.1, optional] virtual_sources (JSON list of {path,
                                   pack_id, file_bytes, num_samples, digest}, only in a
                                   virtual pack written by ``merge --virtual``: the source
                                   packs its virtual ``/images`` maps; covered by
                                   metadata_crc32; a reader checks every source before
                                   serving a sample)
                                   [1.1, optional] fields (JSON list of {name, kind[, dtype,
                                   shape]}: the sample's fields, ``core.fields``; covered
                                   by metadata_crc32; a pack without it holds ``image``,
                                   ``label`` and ``key``, the datasets below)
    /images                 storage "array": uint8 (N, H, W, C), contiguous or chunked
                            storage "blob":  uint8 (total_bytes,), chunked by bytes
    /offsets                storage "blob" only: int64 (N + 1,), sample i's slot is
                            [offsets[i], offsets[i + 1]); slots never straddle a chunk
                            boundary unless a sample is larger than a chunk (see
                            docs/ARCHITECTURE.md, "Aligned blobs")
    /sizes                  storage "blob" only: int64 (N,), bytes of sample i inside its slot
    /labels                 int64 (N,), -1 when unlabeled
    /classes                UTF-8 strings (K,); labels index into it
                            (1.0: variable-length; 1.1: fixed-length, NUL-padded)
    /paths                  bytes (N,): source path relative to the root, "/"-separated,
                            os.fsencode()d so names that are not UTF-8 round-trip
                            (1.0: variable-length uint8; 1.1: fixed-length strings,
                            NUL-padded, in gzip-compressed chunks)
    /shapes                 int32 (N, 3): decoded (H, W, C) of each sample
    /checksums              uint32 (N,): CRC32 of the stored (uncompressed) bytes of sample i
    /source_index           int64 (N,): position of sample i in the sorted scan order
    /sample_xxh3            [1.1] uint64 (N,): XXH3-64 of the stored (uncompressed) bytes of
                            sample i (written when the writer has the xxhash package)
/fields/NAME            [1.1, optional] every field besides image, label and key, as
                            ``core.fields`` stores its kind: (N, *shape) for a fixed-size
                            value; values back to back (total, *shape) with
                            /fields/NAME.offsets int64 (N + 1,) for a variable one; each
                            dataset's CRC32 in metadata_crc32

Text attributes are variable-length strings in 1.0 and fixed-length UTF-8 strings in 1.1;
readers accept both.

Integrity (format 1.1). HDF5 checksums its own metadata in the file format versions packs
are written with (``libver`` low bound ``v110``: superblock version 3, object header
version 2, chunk indexes as fixed/extensible arrays and version-2 B-trees, all carrying
Jenkins lookup3 checksums that HDF5 verifies on every read), and the root attributes are
kept compact, inside the root's checksummed object header. HDF5 does not checksum raw
data (contiguous datasets, chunks) nor the global heap that holds variable-length data;
damage there was served silently, and damage in the global heap made HDF5 loop forever. So
a 1.1 pack stores no variable-length data at all, and:

- ``metadata_crc32`` records a CRC32 of every dataset a reader trusts besides the images
  (labels, classes, paths, shapes, checksums, source_index, offsets, sizes, sample_xxh3)
  and of the text attributes ``options``, ``skipped`` and (when present) ``shard``. The
  bytes digested: numeric datasets as their elements in C order, little-endian, in the
  dtype listed above; string datasets as each element's bytes preceded by its length
  (uint32 little-endian); text attributes as their UTF-8 bytes. ``read_meta`` checks all
  but ``paths`` (read lazily, checked by ``read_paths``); ``h5pack verify`` checks all.
- ``sample_xxh3`` lets readers check every sample they serve at memory speed (readers
  without xxhash, and 1.0 packs, check ``checksums``).
- ``pack_id`` with the file's (device, inode, size, mtime) is a reader's
  ``PackIdentity``: a dataset refuses a file that is not the one it was created on.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

import h5py
import numpy as np

from h5pack._types import StrPath, parse_choice
from h5pack.core import integrity
from h5pack.core.description import HDF5Index, PackIndex
from h5pack.core.integrity import PackIdentity
from h5pack.core.vocabulary import MODES as MODES  # re-exported
from h5pack.core.vocabulary import STORAGES as STORAGES
from h5pack.core.vocabulary import Mode as Mode
from h5pack.core.vocabulary import Storage as Storage
from h5pack.errors import FormatError, H5PackError, PackNotFoundError, PackReplacedError

if TYPE_CHECKING:
    from h5pack.core.store import Store

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
# Optional (a pack set's shards only): the shard's place in its split (core.packset).
SHARD_KEY = "shard"
# Optional (virtual packs only, ``merge --virtual``): the source packs, see NOTE
# [ Virtual packs ] in write/merge.py.
VIRTUAL_SOURCES_KEY = "virtual_sources"
# Optional: the sample's fields (``core.fields``), JSON; absent: image, label and key.
FIELDS_KEY = "fields"

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
    """One numeric per-sample dataset of the format, as writer, reader, fold and merge see it.

    # NOTE [ Per-sample arrays ]
    # ``SAMPLE_ARRAYS`` is the one list of the numeric per-sample datasets: the writer
    # (``core.record.write_record``) writes and digests each, ``read_meta`` reads and checks
    # each, the pack-set fold (``read.packset``) and ``merge`` concatenate each. A new
    # per-sample field is one entry here, its ``PackMeta`` attribute, and the code that
    # computes it at conversion.

    Attributes:
        name: The dataset's name on disk.
        attribute: The ``PackMeta`` attribute that holds it.
        dtype: Its dtype on disk, in which ``metadata_crc32`` digests it.
        blob_only: Only blob storage has it (``offsets``, ``sizes``).
        optional: A pack may go without it (``sample_xxh3``: a writer without xxhash);
            ``PackMeta`` then holds None.
        extra_rows: Rows beyond N (``offsets``: N + 1 boundaries).
        joins: Whether the packs of a set or a merge concatenate it as it is (``offsets``
            are shifted instead, by each shard's base).
        in_set: Whether a pack set's combined ``PackMeta`` holds it (``offsets`` and
            ``sample_xxh3`` stay with each shard's reader).
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

# The numeric datasets ``metadata_crc32`` covers, with the dtype their digest is taken in.
DIGESTED_ARRAYS: dict[str, str] = {a.name: a.dtype for a in SAMPLE_ARRAYS}


UTF8_STR = h5py.string_dtype(encoding="utf-8")
PATH_BYTES = h5py.vlen_dtype(np.dtype("uint8"))

# Rows of /paths decoded at a time (bounded memory for fixed-length paths of huge packs).
PATH_SLAB = 65536

DAMAGED = "the pack is damaged: re-create it, or restore it from a copy"


def checksum(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """Return the checksum stored for a sample: CRC32 of its stored, uncompressed bytes."""
    return integrity.crc32(data)


def encode_path(relative: str) -> np.ndarray:
    """Return the stored form of a relative source path (its file-system bytes)."""
    return np.frombuffer(os.fsencode(relative), dtype=np.uint8)


def decode_path(stored: np.ndarray | bytes) -> str:
    """Return the relative source path from its stored bytes (undecodable bytes round-trip)."""
    return os.fsdecode(bytes(stored))


def fixed_strings(items: list[bytes]) -> tuple[np.ndarray, Any]:
    """Return ``items`` as a NUL-padded array and the HDF5 fixed-length UTF-8 type to store it.

    Write it with the returned type as the memory type too (numpy's ``S`` would otherwise
    be converted from ASCII, which HDF5 refuses): see ``write_fixed_strings``.
    """
    width = max([1, *(len(item) for item in items)])
    return np.array(items, dtype=f"S{width}"), h5py.string_dtype("utf-8", width)


def write_fixed_strings(dataset: h5py.Dataset, start: int, values: np.ndarray) -> None:
    """Write the ``S`` array ``values`` into rows ``start..`` of a fixed-length string dataset."""
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


@dataclass(frozen=True)
class SkippedFile:
    """A source file that was not packed, and why."""

    path: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class ArrayStorage:
    """Storage ``"array"``: the samples as one uint8 ``(N, H, W, C)`` array.

    One variant of ``SampleStorage`` (a tagged union, as zarr v3's metadata classes:
    frozen, with symmetric ``to_dict`` / ``from_dict``; ``kind`` is the tag).

    Attributes:
        image_shape: ``(H, W, C)`` of every sample.
        chunks: The images dataset's chunk shape, or None when contiguous.

    Example:
        >>> layout = ArrayStorage(image_shape=(32, 32, 3), chunks=(64, 32, 32, 3))
        >>> storage_from_dict(layout.to_dict()) == layout
        True
    """

    kind: ClassVar[Literal["array"]] = "array"
    image_shape: tuple[int, int, int]
    chunks: tuple[int, ...] | None = None

    def slot(self, index: int) -> tuple[int, int]:
        """Return the rows of sample ``index`` in the images dataset: ``(index, 1)``."""
        return index, 1

    def to_dict(self) -> dict[str, Any]:
        """Return this layout as JSON-ready data, tagged with ``kind``."""
        return {
            "kind": self.kind,
            "image_shape": list(self.image_shape),
            "chunks": None if self.chunks is None else list(self.chunks),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArrayStorage:
        """Return the layout ``to_dict`` gave."""
        h, w, c = (int(v) for v in data["image_shape"])
        chunks = data.get("chunks")
        return cls(image_shape=(h, w, c), chunks=None if chunks is None else tuple(chunks))


@dataclass(frozen=True, kw_only=True, eq=False)
class BlobStorage:
    """Storage ``"blob"``: the samples' bytes in one flat uint8 blob, located by offsets.

    Carries what locates every sample (see the module docstring, ``/offsets`` and
    ``/sizes``): sample i's bytes are ``blob[offsets[i] : offsets[i] + sizes[i]]``.

    Attributes:
        length: Bytes in the blob.
        chunks: The blob's chunk shape, or None when contiguous.
        chunk_bytes: Bytes per chunk as the pack records it (attribute ``chunk_bytes``).
        offsets: int64 ``(N + 1,)`` slot boundaries; None in a pack set's combined metadata
            (byte offsets are each shard's).
        sizes: int64 ``(N,)`` bytes of each sample.

    Example:
        >>> blob = BlobStorage(length=10, chunk_bytes=8, offsets=np.array([0, 4, 10]),
        ...                    sizes=np.array([3, 6]))
        >>> blob.slot(1), storage_from_dict(blob.to_dict()) == blob
        ((4, 6), True)
    """

    kind: ClassVar[Literal["blob"]] = "blob"
    length: int
    chunks: tuple[int, ...] | None = None
    chunk_bytes: int = 0
    offsets: np.ndarray | None = None
    sizes: np.ndarray | None = None

    def slot(self, index: int) -> tuple[int, int]:
        """Return ``(first byte, size)`` of sample ``index`` in the blob.

        Raises:
            FormatError: the offsets are not held here (a pack set's combined metadata).
        """
        if self.offsets is None or self.sizes is None:
            raise FormatError("a pack set's samples are located by each shard's offsets")
        return int(self.offsets[index]), int(self.sizes[index])

    def to_dict(self) -> dict[str, Any]:
        """Return this layout as JSON-ready data, tagged with ``kind``."""
        return {
            "kind": self.kind,
            "length": self.length,
            "chunks": None if self.chunks is None else list(self.chunks),
            "chunk_bytes": self.chunk_bytes,
            "offsets": None if self.offsets is None else self.offsets.tolist(),
            "sizes": None if self.sizes is None else self.sizes.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BlobStorage:
        """Return the layout ``to_dict`` gave."""
        chunks, offsets, sizes = data.get("chunks"), data.get("offsets"), data.get("sizes")
        return cls(
            length=int(data["length"]),
            chunks=None if chunks is None else tuple(chunks),
            chunk_bytes=int(data.get("chunk_bytes", 0)),
            offsets=None if offsets is None else np.asarray(offsets, dtype=np.int64),
            sizes=None if sizes is None else np.asarray(sizes, dtype=np.int64),
        )

    def __eq__(self, other: object) -> bool:  # by value (holds arrays; so, unhashable)
        return isinstance(other, BlobStorage) and self.to_dict() == other.to_dict()


SampleStorage: TypeAlias = "ArrayStorage | BlobStorage"


def storage_from_dict(data: Mapping[str, Any]) -> SampleStorage:
    """Return the ``ArrayStorage`` or ``BlobStorage`` that ``to_dict`` gave, by its ``kind``.

    Raises:
        FormatError: an unknown kind.
    """
    kind = data.get("kind")
    if kind == ArrayStorage.kind:
        return ArrayStorage.from_dict(data)
    if kind == BlobStorage.kind:
        return BlobStorage.from_dict(data)
    raise FormatError(f"unknown storage kind {kind!r}: expected one of {STORAGES}")


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
        format_minor: The minor format version (0 for packs written before 1.1).
        sample_xxh3: uint64 (N,) XXH3-64 of each sample's stored bytes, or None.
        digests: The recorded ``metadata_crc32`` (empty before format 1.1).
        damaged: Names whose digest did not match (only when read with
            ``check_digests=False``; otherwise ``read_meta`` raises).
        identity: Which file this was read from (None for a combined pack set).
        shard: A pack set's shard: its ``shard`` attribute (the split it belongs to, see
            ``core.packset.ShardIdentity``); empty for a pack that is no shard.
        field_listing: The ``fields`` attribute's text, or None (a pack of image, label
            and key); ``core.fields.fields_of`` reads it.
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
        """Return ``(offsets, sizes)``: where a blob pack's samples lie (``BlobStorage``).

        Raises:
            FormatError: the metadata locates no sample by byte offsets (array storage, or
                a pack set's combined metadata, whose offsets are each shard's).
        """
        if self.offsets is None or self.sizes is None:
            raise FormatError(
                f"{self.path}: its {self.storage} storage locates no sample by byte offsets "
                "(a pack set's are each shard's)"
            )
        return self.offsets, self.sizes

    def sample_arrays(self) -> dict[str, np.ndarray]:
        """Return the per-sample arrays this metadata holds, by dataset name (``SAMPLE_ARRAYS``)."""
        found = {a.name: getattr(self, a.attribute) for a in SAMPLE_ARRAYS}
        return {name: array for name, array in found.items() if array is not None}

    @property
    def sample_storage(self) -> SampleStorage:
        """How the images dataset holds the samples: an ``ArrayStorage`` or a ``BlobStorage``."""
        if self.storage == "array":
            h, w, c = self.images_shape[1:]
            return ArrayStorage(image_shape=(h, w, c), chunks=self.chunks)
        return BlobStorage(
            length=self.images_shape[0],
            chunks=self.chunks,
            chunk_bytes=self.blob_chunk_bytes,
            offsets=self.offsets,
            sizes=self.sizes,
        )


@contextmanager
def reading(path: str, what: str) -> Iterator[None]:
    """Turn any error HDF5 raises while reading ``what`` into a ``FormatError``.

    h5py reports damaged files as ``OSError``, ``KeyError``, ``RuntimeError`` or
    ``ValueError`` (a bad checksum, a bad signature, an object that cannot be opened); a
    damaged JSON text or string gives ``ValueError`` too. h5pack's own errors pass through.
    """
    try:
        yield
    except H5PackError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError) as err:
        raise FormatError(f"{path}: {what} cannot be read ({err}); {DAMAGED}") from err


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _attr_str(attrs: Any, key: str, path: str) -> str:
    if key not in attrs:
        raise FormatError(f"{path}: pack attribute {key!r} is missing")
    return _text(attrs[key])


def check_is_pack(handle: h5py.File | PackIndex, path: str) -> int:
    """Return the format version of an open file, or raise ``FormatError`` if it is no pack.

    Raises:
        FormatError: the file has no h5pack marker, a format version newer than this
            h5pack reads, or root attributes that cannot be read (damage).
    """
    with reading(path, "the pack's root attributes"):
        attrs = handle.attrs
        marker = attrs.get(FORMAT_MARKER_KEY)
        if isinstance(marker, bytes):
            marker = marker.decode("utf-8", "replace")
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


def _plain(err: OSError) -> str:
    """Return a sentence before HDF5's words for the failures a user can act on."""
    text = str(err)
    if "truncated file" in text:
        return (
            "the file is shorter than its header says: it was cut off (an interrupted copy "
            f"or download?); re-create it or copy it again ({text})"
        )
    if "signature" in text:
        return f"no HDF5 signature where one should be ({text})"
    return text


# A conversion's hidden temporary file (write.publish.temp_path): ".NAME.PID[TAG].tmp".
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)[^.]*\.tmp$")


def _locked_message(path: Path) -> str:
    """Say what a user can do about a file that a writer holds, on the CLI and in Python."""
    temp = _TEMP_NAME.match(path.name)
    if temp is not None:
        return (
            f"{path} is the hidden temporary file of a conversion still running (process "
            f"{temp['pid']}): the pack appears as {path.parent / temp['name']} when it is "
            "complete; read that"
        )
    return (
        f"{path} is locked by a process writing it: wait for it to finish, or read anyway "
        "with file locking off (HDF5_USE_FILE_LOCKING=FALSE in the environment of the "
        "command, or locking=False in Python)"
    )


def open_h5(path: StrPath, *, locking: bool | None = None, **kwargs: Any) -> h5py.File:
    """Open ``path`` read-only with h5pack's plugins registered; clear errors for bad paths.

    Args:
        path: The file to open.
        locking: HDF5 file locking; ``False`` for network file systems or to read a file
            that a writer still holds. ``None`` keeps HDF5's default.
        **kwargs: Passed to ``h5py.File`` (e.g. ``rdcc_nbytes``).

    Raises:
        FileNotFoundError: the path does not exist.
        FormatError: the path is not an HDF5 file, or one too damaged to open.
    """
    import hdf5plugin  # noqa: F401  (registers the LZ4/Zstd/Blosc/Bitshuffle filters)

    text = os.fspath(path)
    if not Path(text).exists():
        raise PackNotFoundError(f"{text}: no such pack")
    if Path(text).is_dir():
        raise FormatError(f"{text} is a directory, not a pack")
    if not Path(text).is_file():  # HDF5 would wait forever on a FIFO nobody writes
        raise FormatError(
            f"{text} is not a regular file (a FIFO, a socket or a device): a pack is a file"
        )
    if locking is not None:
        kwargs["locking"] = locking
    try:
        return h5py.File(text, "r", **kwargs)
    except BlockingIOError as err:
        raise FormatError(_locked_message(Path(text))) from err
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        if isinstance(err, OSError) and "file signature not found" in str(err):
            raise FormatError(f"{text} is not a readable HDF5 file ({err})") from err
        detail = _plain(err) if isinstance(err, OSError) else str(err)
        raise FormatError(f"{text} is not a readable HDF5 file: {detail}") from err


def open_index(
    path: StrPath, *, store: Store | None = None, locking: bool | None = None, **kwargs: Any
) -> PackIndex:
    """Describe the pack at ``path`` (NOTE [ Compact index ]); close the description after.

    Args:
        path: A local path, or a URL of a remote ``store`` (its compact index: 1-2 requests).
        store: The store ``path`` is in (``core.store.open_store``); None: a local path.
        locking: HDF5 file locking of a local pack (see ``open_h5``).
        **kwargs: Passed to ``h5py.File`` where HDF5 opens the pack (the chunk cache).

    Raises:
        FileNotFoundError: the path or object does not exist.
        FormatError: the path is not an HDF5 file, or one too damaged to open.
    """
    text = os.fspath(path)
    if store is not None and store.remote:
        from h5pack.core.remote import open_remote

        return open_remote(store.source(text), **kwargs)
    return HDF5Index(open_h5(text, locking=locking, **kwargs), text)


def _described(handle: h5py.File | PackIndex, path: str | None) -> PackIndex:
    """Return ``handle``'s description (an open HDF5 file's, read as asked)."""
    if isinstance(handle, PackIndex):
        return handle
    return HDF5Index(handle, path or handle.filename)


def identity_of(handle: h5py.File | PackIndex, path: str) -> PackIdentity:
    """Return the identity of the file ``handle`` has open (its pack id and status).

    The status is taken from the open descriptor, so it names the file actually read even
    if the path was replaced meanwhile (a URL's: the size and ETag its first answer told).

    Raises:
        FormatError: the pack id cannot be read (damage).
    """
    index = _described(handle, path)
    with reading(path, f"the pack attribute {PACK_ID_KEY!r}"):
        raw = index.attrs.get(PACK_ID_KEY)
    pack_id = _text(raw) if raw is not None else None
    found = index.identity(pack_id)
    if found is not None:
        return found
    try:
        stat = os.fstat(int(index.hdf5().id.get_vfd_handle()))
    except (OSError, ValueError, TypeError, RuntimeError):
        stat = os.stat(path)  # a driver without a descriptor
    return PackIdentity.of(stat, pack_id)


def check_identity(path: str, expected: PackIdentity | None, found: PackIdentity | None) -> None:
    """Raise ``FormatError`` unless ``found`` is the file ``expected`` describes.

    Raises:
        FormatError: the path names another file than the one a dataset was created on.
    """
    if expected is None or found is None:
        return
    changes = expected.changes(found)
    if changes:
        raise PackReplacedError(
            f"{path} was replaced since the dataset was created ({'; '.join(changes)}); "
            "rebuild the loader (a dataset never mixes the labels of one file with the "
            "images of another)"
        )


def _digests(attrs: Any, path: str, minor: int) -> dict[str, str]:
    if METADATA_DIGESTS_KEY not in attrs:
        if minor >= 1:
            raise FormatError(
                f"{path}: pack attribute {METADATA_DIGESTS_KEY!r} is missing; {DAMAGED}"
            )
        return {}
    recorded = json.loads(_attr_str(attrs, METADATA_DIGESTS_KEY, path))
    if not isinstance(recorded, dict):
        raise FormatError(f"{path}: {METADATA_DIGESTS_KEY!r} is not a JSON object; {DAMAGED}")
    return {str(k): str(v) for k, v in recorded.items()}


def _read_array(index: PackIndex, name: str, path: str) -> np.ndarray:
    with reading(path, f"dataset {name!r}"):
        return index.array(name)


def _class_names(stored: np.ndarray) -> tuple[str, ...]:
    return tuple(_text(c) for c in stored)


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
    index = _described(handle, path)
    path = index.path
    version = check_is_pack(index, path)
    with reading(path, "the pack's root attributes"):
        attrs = index.attrs
        minor = int(attrs.get(FORMAT_MINOR_KEY, 0))
        mode_text = _attr_str(attrs, MODE_KEY, path)
        storage_text = _attr_str(attrs, STORAGE_KEY, path)
        num_samples = int(attrs.get(NUM_SAMPLES_KEY, -1))
        channels = int(attrs.get(CHANNELS_KEY, 3))
        blob_chunk_bytes = int(attrs.get(CHUNK_BYTES_KEY, 0))
        texts = {key: attrs.get(key) for key in (TOOL_VERSION_KEY, CREATED_KEY)}
        options_text = _attr_str(attrs, OPTIONS_KEY, path) if OPTIONS_KEY in attrs else "{}"
        skipped_text = _attr_str(attrs, SKIPPED_KEY, path) if SKIPPED_KEY in attrs else "[]"
        shard_text = _attr_str(attrs, SHARD_KEY, path) if SHARD_KEY in attrs else None
        listing = _attr_str(attrs, FIELDS_KEY, path) if FIELDS_KEY in attrs else None
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
        tool_version=_text(texts[TOOL_VERSION_KEY]),
        created_utc=_text(texts[CREATED_KEY]),
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
    index = _described(handle, meta.path if meta is not None else None)
    path = index.path
    paths: list[str] = []
    with reading(path, f"dataset {PATHS!r}"):
        stored = index.paths()
        for lo in range(0, len(stored), PATH_SLAB):
            paths.extend(decode_path(p) for p in stored[lo : lo + PATH_SLAB])
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
