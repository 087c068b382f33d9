"""A pack's metadata as a reader holds it: ``PackMeta``.

Import these from ``core.format``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from h5pack.core.integrity import PackIdentity
from h5pack.core.names import SAMPLE_ARRAYS, Mode, Storage
from h5pack.errors import FormatError


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
