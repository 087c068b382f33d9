"""A pack's metadata as a reader holds it: ``PackMeta`` and how its samples are stored.

Import these from ``core.format``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeAlias

import numpy as np

from h5pack.core.integrity import PackIdentity
from h5pack.core.names import SAMPLE_ARRAYS, STORAGES, Mode, Storage
from h5pack.errors import FormatError


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
