"""The sources of a merge: their packs found (downloaded from a store), read and checked."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import h5py
import numpy as np

from h5pack._types import StrPath
from h5pack.core import format as fmt
from h5pack.core.format import PackMeta
from h5pack.core.layout import FILTER_NAMES
from h5pack.core.packset import (
    MANIFEST_NAME,
    PackSetManifest,
    parse_manifest,
)
from h5pack.core.setmembers import check_shard, join_differences
from h5pack.core.store import Store, is_url, join_url, split_url
from h5pack.errors import FormatError, PackNotFoundError
from h5pack.write.leftovers import describe_removed
from h5pack.write.publish import sigterm_as_exit
from h5pack.write.remote import Emit, Room, Staging, publish_staged, set_prefix
from h5pack.write.report import ConvertEvent

R = TypeVar("R")


@dataclass(frozen=True)
class Shard:
    """One source pack of a merge: its metadata, paths and the filters of its images."""

    path: Path
    meta: PackMeta
    paths: list[str]
    filters: tuple[tuple[int, tuple[int, ...]], ...]
    dtype: np.dtype[Any]


def _filters(dataset: h5py.Dataset) -> tuple[tuple[int, tuple[int, ...]], ...]:
    plist = dataset.id.get_create_plist()
    filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
    return tuple((int(f[0]), tuple(int(v) for v in f[2])) for f in filters)


def _filters_text(filters: tuple[tuple[int, tuple[int, ...]], ...]) -> str:
    if not filters:
        return "no filters"
    return " + ".join(
        f"{FILTER_NAMES.get(fid, f'filter {fid}')}{list(values) if values else ''}"
        for fid, values in filters
    )


def _load(path: Path, manifest: PackSetManifest | None) -> Shard:
    text = os.fspath(path)
    with fmt.open_h5(text) as handle:
        meta = fmt.read_meta(handle, text)
        paths = fmt.read_paths(handle, meta)
        with fmt.reading(text, f"dataset {fmt.IMAGES!r}"):
            images = handle[fmt.IMAGES]
            filters, dtype = _filters(images), images.dtype
    if manifest is not None:
        entry = next(e for e in manifest.shards if manifest.root / e.path == path)
        check_shard(manifest, entry, meta)
    return Shard(path, meta, paths, filters, dtype)


def _differences(shard: Shard, first: Shard) -> list[str]:
    """Return what keeps ``shard`` from being merged with ``first`` (empty: nothing)."""
    a, b = shard.meta, first.meta
    found = join_differences(a, b)

    def differ(what: str, mine: object, theirs: object) -> None:
        if mine != theirs:
            found.append(f"{what} {mine} here, {theirs} in {first.path}")

    differ(
        "format version",
        f"{a.format_version}.{a.format_minor}",
        f"{b.format_version}.{b.format_minor}",
    )
    differ("dtype", shard.dtype, first.dtype)
    if a.storage != "blob" or (a.chunks is None) != (b.chunks is None):
        differ(
            "chunk shape",
            a.chunks if a.chunks is not None else "none (contiguous)",
            b.chunks if b.chunks is not None else "none (contiguous)",
        )
    differ("filters", _filters_text(shard.filters), _filters_text(first.filters))
    return found


def _check_distinct_paths(shards: Sequence[Shard]) -> None:
    """Refuse (FormatError naming both files and the path) packs holding the same path."""
    owner: dict[str, int] = {}
    for k, shard in enumerate(shards):
        for path in shard.paths:
            first = owner.setdefault(path, k)
            if first != k:
                raise FormatError(
                    f"{shard.path} cannot be merged with {shards[first].path}: both hold "
                    f"{path!r} (a pack holds each source file once; were they converted "
                    "from the same folder, or merged twice?)"
                )


def load_shards(paths: Sequence[Path], manifest: PackSetManifest | None = None) -> list[Shard]:
    """Read every pack's metadata and refuse (FormatError) packs that cannot be merged.

    The message names both files and what differs: format, mode, storage, sample shape,
    dtype, chunks, filters, classes, or a source path that both hold.
    """
    shards = [_load(path, manifest) for path in paths]
    first = shards[0]
    for shard in shards[1:]:
        differences = _differences(shard, first)
        if differences:
            raise FormatError(
                f"{shard.path} cannot be merged with {first.path}: "
                + "; ".join(differences)
                + "; convert them with the same options"
            )
    step = blob_step(shards)
    largest = next((s for s in shards if s.meta.chunks == (step,)), first)
    for shard in shards if step is not None else ():
        chunks = shard.meta.chunks
        # a blob shorter than its planned chunk gets a chunk of its own length
        one_chunk = chunks is not None and chunks[0] >= shard.meta.images_shape[0]
        if chunks is not None and chunks[0] != step and not one_chunk:
            raise FormatError(
                f"{shard.path} cannot be merged with {largest.path}: blob chunk {chunks[0]} "
                f"bytes here, {step} in {largest.path} (only a shard shorter than one chunk, "
                "whose chunk is cut to its length, can be laid out again); convert them with "
                "the same options"
            )
    _check_distinct_paths(shards)
    return shards


def blob_step(shards: Sequence[Shard]) -> int | None:
    """Return the chunk of the merged blob: the largest of the shards' (None: contiguous)."""
    if shards[0].meta.storage != "blob" or shards[0].meta.chunks is None:
        return None
    return max(s.meta.chunks[0] for s in shards if s.meta.chunks is not None)


def merge_with_urls(
    sources: StrPath | Sequence[StrPath],
    target: str,
    store: Store,
    merge: Callable[[StrPath | list[StrPath], Path], R],
    *,
    staging_dir: StrPath | None,
    overwrite: bool,
    emit: Emit,
) -> tuple[R, list[str]]:
    """Merge packs of which some are in a store, or into one, with the local ``merge``.

    Remote sources (packs, or a set's prefix or manifest) are downloaded whole into a
    staging directory and merged there; a remote target is published once complete
    (NOTE [ Publishing in a bucket ]). Returns what ``merge`` returned, and each source's
    shard URLs or path.
    """
    single = isinstance(sources, str | os.PathLike)
    listed: Sequence[StrPath] = [sources] if isinstance(sources, str | os.PathLike) else sources
    items = [os.fspath(s) for s in listed]
    said: list[str] = []

    def merged(local_target: Path, room: Room, staging: Path) -> R:
        fetched: list[StrPath] = []
        for k, item in enumerate(items):
            if is_url(item):
                path, urls = _fetch_source(item, store, staging / f"source-{k:05d}", room, emit)
                fetched.append(path)
                said.extend(urls)
            else:
                fetched.append(Path(item))
                said.append(item)
        return merge(fetched[0] if single else fetched, local_target)

    if is_url(target):
        return publish_staged(
            store,
            target,
            lambda local, room: merged(local, room, local.parent),
            overwrite=overwrite,
            staging_dir=staging_dir,
            emit=emit,
        ), said
    what = f"the merge into {target}"
    with sigterm_as_exit(), Staging(staging_dir, what=what) as staging:
        if staging.removed:
            emit(ConvertEvent("note", describe_removed(staging.removed)))
        room = functools.partial(staging.check_room, what=what)
        return merged(Path(target), room, staging.path), said


def _fetch_source(
    url: str, store: Store, folder: Path, room: Room, emit: Emit
) -> tuple[Path, list[str]]:
    """Download a remote pack, or a set's manifest and shards, into ``folder``.

    Returns the local pack (or set's folder) and the URLs it came from; PackNotFoundError
    when there is no such object (or no manifest under a set's prefix).
    """
    folder.mkdir()
    _, _, key = split_url(url)
    if not (key.endswith(("/", ".json")) or not key):
        found = store.stat(url)
        if found is None:
            raise PackNotFoundError(
                f"{url}: no such object (a pack set: give its prefix, ending in /)"
            )
        room(2 * found.size)
        local = folder / PurePosixPath(key).name
        emit(ConvertEvent("note", f"downloading {url} ({found.size / 2**20:.1f} MiB)"))
        store.download(url, local)
        return local, [url]
    prefix_url = set_prefix(url)
    data = store.get(prefix_url + MANIFEST_NAME)
    if data is None:
        raise PackNotFoundError(
            f"{prefix_url} has no {MANIFEST_NAME}: no pack set manifest (a conversion with "
            "--shards writes it last; was it interrupted?)"
        )
    text = data.decode("utf-8", "replace")
    manifest = parse_manifest(text, where=prefix_url + MANIFEST_NAME, root=folder)
    total = sum(e.file_bytes for e in manifest.shards)
    room(2 * total)
    count, mib = len(manifest.shards), total / 2**20
    emit(ConvertEvent("note", f"downloading {count} shards of {prefix_url} ({mib:.1f} MiB)"))
    (folder / MANIFEST_NAME).write_text(text, encoding="utf-8")
    for entry in manifest.shards:
        store.download(join_url(prefix_url, entry.path), folder / entry.path)
    return folder, [join_url(prefix_url, e.path) for e in manifest.shards]
