"""Describe a pack set (shard packs, see ``core.packset``) as if it were one pack.

Global indices run through the shards in manifest order, and their groups form one chunk
map: the samplers split chunks, not files. Every shard is checked when the set is described
(a missing, damaged or foreign shard is a ``FormatError`` naming it); its metadata arrays are
folded into the set's one ``PackMeta``, and a ``PackView`` keeps only each shard's path,
counts, chunk map and identity, so a worker's reader reads no metadata again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from h5pack.core import format as fmt
from h5pack.core.format import PackMeta, load_meta, open_index, read_meta
from h5pack.core.integrity import PackIdentity
from h5pack.core.layout import ChunkMap, chunk_map_of, group_bytes, is_compressed
from h5pack.core.packset import (
    MANIFEST_NAME,
    PackSetManifest,
    is_packset,
    pack_paths,
    parse_manifest,
)
from h5pack.core.setmembers import check_shard, join_differences, member_problems
from h5pack.core.store import Store, is_url, join_url
from h5pack.errors import FormatError, OptionsError

# Remote shards whose index is fetched at once when a set is opened.
OPEN_IN_FLIGHT = 32

PackSource: TypeAlias = "str | os.PathLike[str] | Sequence[str | os.PathLike[str]]"
"""A pack path, a pack set's directory or manifest, or a list of pack paths."""


@dataclass(frozen=True)
class ShardView:
    """What a pack set keeps of one shard once it is checked (no metadata arrays)."""

    path: Path | str
    num_samples: int
    chunk_map: ChunkMap
    group_bytes: int
    compressed: bool
    identity: PackIdentity | None


# The per-sample arrays a set's combined metadata holds (NOTE [ Per-sample arrays ]).
_FOLDED = tuple(spec for spec in fmt.SAMPLE_ARRAYS if spec.in_set)


class _Fold:
    """The shards' per-sample arrays, concatenated as they are read."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.at = 0
        self.parts: dict[str, list[np.ndarray]] = {spec.name: [] for spec in _FOLDED}
        self.filled: dict[str, np.ndarray] = {}

    def add(self, meta: PackMeta) -> PackMeta:
        """Take ``meta``'s per-sample arrays; return it without them (and without offsets)."""
        held = meta.sample_arrays()
        for spec in _FOLDED:
            key = spec.name
            array = held.get(key)
            if array is None:
                continue
            if self.total is None:
                self.parts[key].append(array)
                continue
            if key not in self.filled:
                self.filled[key] = np.zeros((self.total, *array.shape[1:]), dtype=array.dtype)
            self.filled[key][self.at : self.at + len(array)] = array
        self.at += meta.num_samples
        empty = np.zeros(0, dtype=np.int64)
        emptied: dict[str, Any] = {
            spec.attribute: None if spec.optional or spec.name not in held else empty
            for spec in fmt.SAMPLE_ARRAYS
        }
        emptied.update({spec.attribute: None for spec in fmt.SAMPLE_ARRAYS if not spec.in_set})
        return replace(meta, **emptied)

    def result(self, key: str) -> np.ndarray:
        """The concatenation of every shard's ``key`` (empty if no shard has it)."""
        if key in self.filled:
            return self.filled[key]
        parts = self.parts[key]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _combined_meta(name: str, metas: Sequence[PackMeta], fold: _Fold) -> PackMeta:
    """Return one ``PackMeta`` for all shards (refusing shards that cannot be one set)."""
    first = metas[0]
    for meta in metas[1:]:
        differences = join_differences(meta, first)
        if differences:
            raise FormatError(
                f"{meta.path} cannot join a pack set with {first.path}: " + "; ".join(differences)
            )
    num = sum(m.num_samples for m in metas)
    folded: dict[str, Any] = {spec.attribute: fold.result(spec.name) for spec in _FOLDED}
    if first.sizes is None:  # array storage: no sizes
        folded["sizes"] = None
    return PackMeta(
        path=name,
        format_version=min(m.format_version for m in metas),
        mode=first.mode,
        storage=first.storage,
        num_samples=num,
        channels=first.channels,
        classes=first.classes,
        offsets=None,  # byte offsets are per shard: read them through each shard's reader
        **folded,
        images_shape=(num, *first.images_shape[1:]),
        chunks=first.chunks,
        compression=first.compression,
        compression_opts=first.compression_opts,
        filter_ids=first.filter_ids,
        blob_chunk_bytes=first.blob_chunk_bytes,
        tool_version=first.tool_version,
        created_utc=first.created_utc,
        options=first.options,
        skipped=tuple(s for m in metas for s in m.skipped),
        field_listing=first.field_listing,
    )


@dataclass(frozen=True)
class PackView:
    """What a dataset or sampler needs to know of a pack or a pack set, before reading."""

    meta: PackMeta
    chunk_map: ChunkMap
    group_bytes: int
    compressed: bool
    shards: tuple[ShardView, ...] | None = None

    @classmethod
    def of(cls, meta: PackMeta) -> PackView:
        """Return the view of one pack."""
        return cls(meta, chunk_map_of(meta), group_bytes(meta), is_compressed(meta))

    @property
    def is_set(self) -> bool:
        """Whether this is a pack set (or a list of packs) rather than one pack."""
        return self.shards is not None

    @property
    def num_shards(self) -> int:
        """Files read: the set's shards, or 1."""
        return 1 if self.shards is None else len(self.shards)


def concatenated_map(maps: Sequence[ChunkMap]) -> ChunkMap:
    """Return the chunk maps one after another, over global indices."""
    starts = [np.zeros(1, dtype=np.int64)]
    offset = 0
    for chunk_map in maps:
        starts.append(chunk_map.starts[1:] + offset)
        offset += chunk_map.num_samples
    return ChunkMap(np.concatenate(starts))


def load_pack_meta(
    path: str | os.PathLike[str],
    *,
    locking: bool | None = None,
    store: Store | None = None,
) -> PackMeta:
    """Return a pack's metadata: ``format.load_meta``, or a remote one's from its index."""
    if store is None or not store.remote:
        return load_meta(path, locking=locking)
    with open_index(path, store=store) as index:
        return read_meta(index)


def remote_members(
    source: PackSource, store: Store
) -> tuple[list[str], PackSetManifest | None, str | None]:
    """Return a remote set's shard URLs, its manifest and the manifest's URL (one GET)."""
    if not isinstance(source, str | os.PathLike):
        urls = [os.fspath(p) for p in source]
        local = [u for u in urls if not is_url(u)]
        if local:
            raise OptionsError(f"a list of packs mixes URLs and local paths ({local[0]})")
        return urls, None, None
    text = os.fspath(source)
    where = text if text.endswith(".json") else join_url(text, MANIFEST_NAME)
    with closing(store.source(where)) as manifest_source:
        try:
            body = manifest_source.read_all().decode("utf-8")
        except UnicodeDecodeError as err:
            raise FormatError(f"{where}: the pack set manifest cannot be read ({err})") from err
    manifest = parse_manifest(body, where=where, root=Path("."))
    prefix = where.rsplit("/", 1)[0]
    return [join_url(prefix, e.path) for e in manifest.shards], manifest, where


def describe_set(
    source: PackSource,
    locking: bool | None,
    store: Store | None = None,
) -> PackView:
    """Load and check every shard's metadata; fold them into one view."""
    remote = store is not None and store.remote
    paths: list[Path | str]
    if store is not None and store.remote:
        urls, manifest, manifest_url = remote_members(source, store)
        paths, name = list(urls), manifest_url or urls[0]
        with ThreadPoolExecutor(max(1, min(OPEN_IN_FLIGHT, len(paths)))) as pool:
            found = list(pool.map(lambda u: load_pack_meta(u, store=store), paths))
    else:
        local, manifest = pack_paths(source)
        paths = list(local)
        name = os.fspath(manifest.manifest_path) if manifest is not None else os.fspath(local[0])
        found = []
    metas: list[PackMeta] = []
    shards: list[ShardView] = []
    # the entries' sum, which check_shard holds every shard to (the total is checked after)
    listed = sum(e.num_samples for e in manifest.shards) if manifest is not None else None
    fold = _Fold(listed)
    for index, path in enumerate(paths):
        meta = found[index] if remote else load_meta(path, locking=locking)
        if manifest is not None:
            at = (os.fspath(path), name) if remote else None
            check_shard(manifest, manifest.shards[index], meta, remote=at)
        counts = (meta.num_samples, chunk_map_of(meta), group_bytes(meta), is_compressed(meta))
        shards.append(ShardView(path, *counts, meta.identity))
        metas.append(fold.add(meta))  # each shard's arrays live once, in the fold
    problems = member_problems([Path(p) for p in paths], metas, manifest)
    if problems:
        raise FormatError(problems[0][1])
    combined = _combined_meta(name, metas, fold)
    return PackView(
        meta=combined,
        chunk_map=concatenated_map([s.chunk_map for s in shards]),
        group_bytes=max(s.group_bytes for s in shards),
        compressed=any(s.compressed for s in shards),
        shards=tuple(shards),
    )


def describe(
    source: PackSource,
    *,
    locking: bool | None = None,
    store: Store | None = None,
) -> PackView:
    """Return the metadata and chunk map of a pack or a pack set (checking every shard).

    Opens no reader. URLs (a pack, a set's prefix or ``packset.json``, a list) are read from
    ``store``.
    """
    if not is_packset(source):
        assert isinstance(source, str | os.PathLike)  # is_packset: a single path
        return PackView.of(load_pack_meta(source, locking=locking, store=store))
    return describe_set(source, locking, store)
