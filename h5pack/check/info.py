"""What is inside a pack: ``pack_info`` (``h5pack info``)."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.check.probe import probe_pack
from h5pack.core import format as fmt
from h5pack.core.layout import FILTER_NAMES, PLUGIN_FILTERS, Compression, chunk_map_of
from h5pack.errors import OptionsError


@dataclass(frozen=True, kw_only=True)
class PackInfo:
    """A summary of a pack, for people (``h5pack info``) and machines (``--json``).

    Attributes:
        path: The pack.
        file_bytes: Size of the file.
        format_version: Format version of the pack.
        format_minor: Minor format version (1.1 adds the pack id and digests).
        pack_id: The pack's random id (format 1.1), or None.
        tool_version: h5pack version that wrote it.
        created_utc: When it was written.
        num_samples: Samples in the pack.
        classes: ``(name, samples)`` for each class, in label order.
        unlabelled: Samples with label -1.
        mode: ``"raw"`` or ``"encoded"``.
        storage: ``"array"`` or ``"blob"``.
        dtype: Element type of the images dataset.
        images_shape: Shape of the images dataset.
        sample_shape: (H, W, C) when every sample has it, else None.
        channels: 1 or 3.
        layout: ``"chunked"`` or ``"contiguous"``.
        chunk_shape: Chunk shape of the images dataset, or None.
        chunk_bytes: Uncompressed bytes of one chunk (0 when contiguous).
        num_chunks: Chunks stored.
        samples_per_chunk: Mean samples per chunk group (see ``layout.ChunkMap``).
        codec: Human description of the compression, ``"none"`` without.
        filter_ids: HDF5 filter ids on the images dataset.
        plugins: What reading the pack needs beyond HDF5 (``hdf5plugin`` filters).
        stored_bytes: Uncompressed bytes of every sample (padding excluded).
        disk_bytes: Bytes the images dataset takes in the file.
        compression_ratio: ``stored_bytes / disk_bytes``.
        shuffled: Whether samples were written in a shuffled order.
        skipped: Files left out at conversion.
        options: The conversion options recorded in the pack.
    """

    path: str
    file_bytes: int
    format_version: int
    format_minor: int
    pack_id: str | None
    tool_version: str
    created_utc: str
    num_samples: int
    classes: tuple[tuple[str, int], ...]
    unlabelled: int
    mode: str
    storage: str
    dtype: str
    images_shape: tuple[int, ...]
    sample_shape: tuple[int, int, int] | None
    channels: int
    layout: str
    chunk_shape: tuple[int, ...] | None
    chunk_bytes: int
    num_chunks: int
    samples_per_chunk: float
    codec: str
    filter_ids: tuple[int, ...]
    plugins: tuple[str, ...]
    stored_bytes: int
    disk_bytes: int
    compression_ratio: float
    shuffled: bool | None
    skipped: tuple[fmt.SkippedFile, ...]
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        data = asdict(self)
        data["classes"] = [{"name": name, "samples": count} for name, count in self.classes]
        data["skipped"] = [{"path": s.path, "reason": s.reason} for s in self.skipped]
        for key in ("images_shape", "sample_shape", "chunk_shape", "filter_ids", "plugins"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data


def _codec(meta: fmt.PackMeta) -> str:
    recorded = meta.options.get("compression")
    if isinstance(recorded, dict):
        try:
            compression = Compression(**recorded)
        except (OptionsError, TypeError):
            pass
        else:
            if compression.codec != "none" or not meta.filter_ids:
                return compression.describe()
    if not meta.filter_ids:
        return "none"
    return " + ".join(FILTER_NAMES.get(i, f"filter {i}") for i in meta.filter_ids)


def pack_info(path: StrPath, *, timeout_s: float | None = None) -> PackInfo:
    """Return a summary of the pack at ``path``.

    Args:
        path: The pack.
        timeout_s: Read the metadata in a child process first, under this time limit
            (``probe_pack``): a pack whose damaged metadata would make HDF5 loop is then
            reported as damaged instead of hanging this process. ``None`` reads it here.

    Raises:
        FileNotFoundError: the path does not exist.
        FormatError: the file is not a valid pack, or is damaged.
    """
    text = os.fspath(path)
    if timeout_s is not None:
        probe_pack(text, timeout_s=timeout_s)
    with fmt.open_h5(text) as handle:
        meta = fmt.read_meta(handle, text)
        with fmt.reading(text, "the images' chunk index"):
            images = handle[fmt.IMAGES]
            disk_bytes = int(images.id.get_storage_size())
            num_chunks = int(images.id.get_num_chunks()) if images.chunks else 0
            dtype = str(images.dtype)
    counts = Counter(int(label) for label in meta.labels)
    if meta.storage == "array":
        stored_bytes = meta.num_samples * math.prod(meta.images_shape[1:])
    else:
        assert meta.sizes is not None  # blob storage
        stored_bytes = int(meta.sizes.sum())
    chunk_map = chunk_map_of(meta)
    shuffled = meta.options.get("shuffle_samples")
    return PackInfo(
        path=text,
        file_bytes=Path(text).stat().st_size,
        format_version=meta.format_version,
        format_minor=meta.format_minor,
        pack_id=meta.pack_id,
        tool_version=meta.tool_version,
        created_utc=meta.created_utc,
        num_samples=meta.num_samples,
        classes=tuple((name, counts.get(i, 0)) for i, name in enumerate(meta.classes)),
        unlabelled=counts.get(-1, 0),
        mode=meta.mode,
        storage=meta.storage,
        dtype=dtype,
        images_shape=meta.images_shape,
        sample_shape=meta.fixed_shape,
        channels=meta.channels,
        layout="chunked" if meta.chunks else "contiguous",
        chunk_shape=meta.chunks,
        chunk_bytes=math.prod(meta.chunks) if meta.chunks else 0,
        num_chunks=num_chunks,
        samples_per_chunk=meta.num_samples / max(1, chunk_map.num_chunks),
        codec=_codec(meta),
        filter_ids=meta.filter_ids,
        plugins=tuple(PLUGIN_FILTERS[i] for i in meta.filter_ids if i in PLUGIN_FILTERS),
        stored_bytes=stored_bytes,
        disk_bytes=disk_bytes,
        compression_ratio=stored_bytes / disk_bytes if disk_bytes else 0.0,
        shuffled=bool(shuffled) if shuffled is not None else None,
        skipped=meta.skipped,
        options=dict(meta.options),
    )
