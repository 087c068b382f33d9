"""What is inside a pack (``pack_info``) or a pack set (``packset_info``): ``h5pack info``."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.check.probe import probe_pack, probe_packs
from h5pack.core import format as fmt
from h5pack.core.fields import fields_of, stored_fields
from h5pack.core.layout import PLUGIN_FILTERS, chunk_map_of, describe_codec
from h5pack.core.packset import pack_paths
from h5pack.core.store import Store, open_store
from h5pack.read.packset import PackSource, PackView, describe, remote_members


@dataclass(frozen=True, kw_only=True)
class PackInfo:
    """A summary of a pack, for people (``h5pack info``) and machines (``--json``).

    ``format_minor`` 1 adds ``pack_id`` and digests; ``sample_shape`` is None when samples
    differ; ``layout`` is ``"chunked"`` or ``"contiguous"``; ``samples_per_chunk`` is per
    chunk group; ``plugins``: what reading needs beyond
    HDF5; ``stored_bytes`` are uncompressed, ``disk_bytes`` in the file; ``shard``: its place
    in a split; ``fields``: name, kind and, for numbers, dtype and shape.
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
    shard: dict[str, Any] = field(default_factory=dict)
    fields: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return _json_ready(self)


def pack_info(
    path: StrPath,
    *,
    timeout_s: float | None = None,
    store: Store | None = None,
) -> PackInfo:
    """Return a summary of the pack at ``path`` (``check.entry.pack_info``)."""
    text = os.fspath(path)
    store = store or open_store(text)
    remote = store.remote
    if timeout_s is not None and not remote:
        probe_pack(text, timeout_s=timeout_s)
    with fmt.open_index(text, store=store) as index:
        meta = fmt.read_meta(index, text)
        with fmt.reading(text, "the images' chunk index"):
            images = index.images()
            dtype = str(images.dtype)
            chunks = index.chunk_index() if images.chunks else None
        num_chunks = 0 if chunks is None else len(chunks.sizes)
        disk_bytes = int(chunks.sizes.sum()) if chunks is not None else 0
        if chunks is None and images.offset is not None:  # contiguous, allocated
            disk_bytes = math.prod(images.shape) * images.dtype.itemsize
        with fmt.reading(text, "the fields' filters"):
            fields_filters = _field_filters(index, meta)
    counts = Counter(int(label) for label in meta.labels)
    if meta.storage == "array":
        stored_bytes = meta.num_samples * math.prod(meta.images_shape[1:])
    else:
        assert meta.sizes is not None  # blob storage
        stored_bytes = int(meta.sizes.sum())
    chunk_map = chunk_map_of(meta)
    shuffled = meta.options.get("shuffle_samples")
    codec, filter_ids = describe_codec(meta), meta.filter_ids
    return PackInfo(
        path=text,
        file_bytes=meta.identity.size if remote and meta.identity else Path(text).stat().st_size,
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
        codec=codec,
        filter_ids=filter_ids,
        plugins=tuple(
            dict.fromkeys(
                PLUGIN_FILTERS[i] for i in (*filter_ids, *fields_filters) if i in PLUGIN_FILTERS
            )
        ),
        stored_bytes=stored_bytes,
        disk_bytes=disk_bytes,
        compression_ratio=stored_bytes / disk_bytes if disk_bytes else 0.0,
        shuffled=bool(shuffled) if shuffled is not None else None,
        skipped=meta.skipped,
        options=dict(meta.options),
        shard=dict(meta.shard),
        fields=tuple(f.to_dict() for f in fields_of(meta)),
    )


def _json_ready(info: PackInfo | PackSetInfo) -> dict[str, Any]:
    """Return ``info`` as JSON: tuples as lists, classes as ``{name, samples}``."""
    data: dict[str, Any] = json.loads(json.dumps(asdict(info)))
    data["classes"] = [{"name": name, "samples": count} for name, count in info.classes]
    return data


@dataclass(frozen=True)
class ShardRow:
    """One shard of a pack set in ``PackSetInfo``: its file, samples, size, files left out."""

    path: str
    num_samples: int
    file_bytes: int
    skipped: int


def _common(values: list[str]) -> str:
    """Return the one value of ``values``, or say that the shards differ and how."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) == 1:
        return distinct[0]
    return "differs by shard: " + ", ".join(distinct)


@dataclass(frozen=True, kw_only=True)
class PackSetInfo:
    """A summary of a pack set (or a list of packs), for ``h5pack info SET``.

    ``PackInfo``'s attributes over every shard: summed, or the value they share (``layout``
    and ``codec`` say how shards differ; ``sample_shape`` and ``shuffled`` None when they
    do). ``path`` is the manifest (or the first pack); ``seed`` the split's, or None.
    """

    path: str
    has_manifest: bool
    num_shards: int
    seed: int | None
    created_utc: str
    tool_version: str
    num_samples: int
    classes: tuple[tuple[str, int], ...]
    unlabelled: int
    mode: str
    storage: str
    sample_shape: tuple[int, int, int] | None
    channels: int
    layout: str
    num_chunks: int
    samples_per_chunk: float
    codec: str
    plugins: tuple[str, ...]
    stored_bytes: int
    disk_bytes: int
    compression_ratio: float
    file_bytes: int
    shuffled: bool | None
    skipped: tuple[fmt.SkippedFile, ...]
    shards: tuple[ShardRow, ...]
    fields: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return _json_ready(self)


def packset_info(source: PackSource, *, timeout_s: float | None = None) -> PackSetInfo:
    """Return a summary of the pack set at ``source`` (see ``packset_summary``)."""
    return packset_summary(source, timeout_s=timeout_s)[0]


def packset_summary(
    source: PackSource,
    *,
    timeout_s: float | None = None,
    store: Store | None = None,
) -> tuple[PackSetInfo, PackView]:
    """Return a summary of the pack set at ``source``, and the readers' view of it.

    Every shard is checked as a reader checks it when the set is opened (``describe``);
    ``timeout_s`` probes each shard first (``probe_packs``); ``store``: None is local.
    """
    if store is not None and store.remote:
        view = describe(source, store=store)
        assert view.shards is not None  # a set
        members = [s.path for s in view.shards]
        manifest = remote_members(source, store)[1]
        where = view.meta.path
        infos = [pack_info(path, store=store) for path in members]
    else:
        paths, manifest = pack_paths(source)
        if timeout_s is not None:
            for error in probe_packs(paths, timeout_s=timeout_s):
                if error is not None:
                    raise error
        view = describe(source)  # the readers' checks: changed shards, shards that cannot join
        infos = [pack_info(path) for path in paths]
        where = os.fspath(manifest.manifest_path) if manifest is not None else infos[0].path
    first = infos[0]
    counts = Counter(int(label) for label in view.meta.labels)
    num_chunks = sum(i.num_chunks for i in infos)
    stored = sum(i.stored_bytes for i in infos)
    disk = sum(i.disk_bytes for i in infos)
    shapes = {i.sample_shape for i in infos}
    shuffled = {i.shuffled for i in infos}

    summary = PackSetInfo(
        path=where,
        has_manifest=manifest is not None,
        num_shards=len(infos),
        seed=manifest.seed if manifest is not None else None,
        created_utc=manifest.created_utc if manifest is not None else "",
        tool_version=(manifest.tool_version if manifest is not None else "") or first.tool_version,
        num_samples=view.meta.num_samples,
        classes=tuple((name, counts.get(i, 0)) for i, name in enumerate(view.meta.classes)),
        unlabelled=counts.get(-1, 0),
        mode=view.meta.mode,
        storage=view.meta.storage,
        sample_shape=shapes.pop() if len(shapes) == 1 else None,
        channels=view.meta.channels,
        layout=_common(
            [f"chunked {i.chunk_shape}" if i.chunk_shape else "contiguous" for i in infos]
        ),
        num_chunks=num_chunks,
        samples_per_chunk=view.meta.num_samples / max(1, view.chunk_map.num_chunks),
        codec=_common([i.codec for i in infos]),
        plugins=tuple(dict.fromkeys(p for i in infos for p in i.plugins)),
        stored_bytes=stored,
        disk_bytes=disk,
        compression_ratio=stored / disk if disk else 0.0,
        file_bytes=sum(i.file_bytes for i in infos),
        shuffled=shuffled.pop() if len(shuffled) == 1 else (False if False in shuffled else None),
        skipped=tuple(s for i in infos for s in i.skipped),
        shards=tuple(ShardRow(i.path, i.num_samples, i.file_bytes, len(i.skipped)) for i in infos),
        fields=tuple(f.to_dict() for f in fields_of(view.meta)),
    )
    return summary, view


def _field_filters(index: Any, meta: fmt.PackMeta) -> tuple[int, ...]:
    """Return the HDF5 filter ids of the stored fields' datasets (masks: Zstandard)."""
    names = [name for f in stored_fields(fields_of(meta)) for name in f.datasets()]
    if not names:
        return ()
    handle = index.hdf5()
    plists = [handle[name].id.get_create_plist() for name in names]
    return tuple(p.get_filter(k)[0] for p in plists for k in range(p.get_nfilters()))
