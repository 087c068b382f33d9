"""Read a pack set (shard packs, see ``core.packset``) as if it were one pack.

Global sample indices run through the shards in manifest order; the groups (chunks) of
every shard form one chunk map, so the samplers plan epochs over all shards' chunks as one
pool and split chunks, not files, across ranks and workers. Shards are opened lazily and
at most ``max_open`` at once (least recently used first out), so a set of 10,000 shards
works under the default ``ulimit -n`` of 1,024; one window of ``window_chunks``
decompressed chunks is kept over all of them, as a single pack's reader keeps it.

Every shard is checked when the set is opened: a missing shard, one that is not a pack
(e.g. truncated), one whose metadata differs from the manifest's record, or a list of packs
whose classes or storage disagree is a ``FormatError`` naming the file, never a smaller
epoch or fill values. A shard replaced after that is refused when it is (re)opened: each
shard reader is opened with the identity (pack id, file status) recorded at that check.

What the check keeps of a shard is small (``ShardView``: its path, sample count, chunk
map, identity); its metadata arrays are folded into the set's one ``PackMeta`` and not kept
twice. ``describe`` returns that ``PackView``, and a reader built from it
(``open_reader(view=...)``, what a dataset does in each DataLoader worker) reads no
metadata again: each shard's is read when that shard is first opened, and must still be
the file the view checked.
"""

from __future__ import annotations

import errno
import os
import resource
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias, TypeVar, overload

import numpy as np

from h5pack.core import format as fmt
from h5pack.core.fields import field_difference, fields_of
from h5pack.core.format import PackMeta, load_meta, open_index, read_meta
from h5pack.core.integrity import PackIdentity
from h5pack.core.layout import ChunkMap, checked_indices, chunk_map_of, group_bytes, is_compressed
from h5pack.core.packset import (
    MANIFEST_NAME,
    PackSetManifest,
    check_members,
    check_shard,
    is_packset,
    pack_paths,
    parse_manifest,
)
from h5pack.core.store import Store, is_url, join_url
from h5pack.errors import FormatError, H5PackError, OptionsError
from h5pack.read.planned import ReadPlan
from h5pack.read.reader import PackReader, ReaderOptions

T = TypeVar("T")
R = TypeVar("R")

# Shards open at once: two file descriptors each (HDF5's and the direct path's).
DEFAULT_MAX_OPEN = 64
# Remote shards whose index is fetched at once when a set is opened.
OPEN_IN_FLIGHT = 32

PackSource: TypeAlias = "str | os.PathLike[str] | Sequence[str | os.PathLike[str]]"
"""A pack path, a pack set's directory or manifest, or a list of pack paths."""


@dataclass(frozen=True)
class ShardView:
    """What a pack set keeps of one shard once it is checked (no metadata arrays).

    Attributes:
        path: The shard (a URL for a remote set's).
        num_samples: Its samples.
        chunk_map: Its groups, in its own indices.
        group_bytes: Uncompressed bytes of one of its groups.
        compressed: Whether its images pass through a filter.
        identity: The file checked (pack id and status): a reader refuses any other.
    """

    path: Path | str
    num_samples: int
    chunk_map: ChunkMap
    group_bytes: int
    compressed: bool
    identity: PackIdentity | None


def _status_or_none(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size)


# The per-sample arrays a set's combined metadata holds (NOTE [ Per-sample arrays ]).
_FOLDED = tuple(spec for spec in fmt.SAMPLE_ARRAYS if spec.in_set)


class _Fold:
    """The shards' per-sample arrays, concatenated as they are read.

    With the total known (a manifest) each array is allocated once and filled shard by
    shard, so describing a large set holds its metadata once, not twice.
    """

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
    """Return one ``PackMeta`` for all shards (refusing shards that cannot be one set).

    ``metas`` are the shards' metadata less their per-sample arrays, which ``fold`` holds.
    """
    first = metas[0]
    for meta in metas[1:]:
        differences = [
            f"{what}: {getattr(meta, attr)!r} here, {getattr(first, attr)!r} in {first.path}"
            for what, attr in (
                ("mode", "mode"),
                ("storage", "storage"),
                ("channels", "channels"),
                ("classes", "classes"),
            )
            if getattr(meta, attr) != getattr(first, attr)
        ]
        fields = field_difference(fields_of(meta), fields_of(first), meta.path, first.path)
        differences.extend([fields] if fields else [])
        if first.storage == "array" and meta.images_shape[1:] != first.images_shape[1:]:
            differences.append(
                f"image shape {meta.images_shape[1:]} here, {first.images_shape[1:]} in "
                f"{first.path}"
            )
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
    """What a dataset or sampler needs to know of a pack or a pack set, before reading.

    Small enough to pickle into every DataLoader worker; ``open_reader(source, view=view)``
    opens a reader on exactly the files it describes without reading metadata again.

    Attributes:
        meta: The metadata (for a set: all shards', concatenated in order).
        chunk_map: The groups read together (for a set: every shard's, one after another).
        group_bytes: Uncompressed bytes of one group (for a set: the largest shard's).
        compressed: Whether any shard's images pass through a filter.
        shards: For a set, each shard as checked (``ShardView``); None for a single pack.
    """

    meta: PackMeta
    chunk_map: ChunkMap
    group_bytes: int
    compressed: bool
    shards: tuple[ShardView, ...] | None = None

    @property
    def is_set(self) -> bool:
        """Whether this is a pack set (or a list of packs) rather than one pack."""
        return self.shards is not None

    @property
    def num_shards(self) -> int:
        """Files read: the set's shards, or 1."""
        return 1 if self.shards is None else len(self.shards)


def _concatenated_map(maps: Sequence[ChunkMap]) -> ChunkMap:
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


def remote_manifest(source: PackSource, store: Store) -> PackSetManifest | None:
    """Return a remote set's manifest (one GET), or None for a list of URLs."""
    return remote_members(source, store)[1]


def _describe_set(
    source: PackSource,
    locking: bool | None,
    store: Store | None = None,
) -> PackView:
    """Load and check every shard's metadata; fold them into one view.

    A remote set's shards are opened concurrently (NOTE [ Compact index ]: 1-2 GETs each).
    """
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
        shards.append(
            ShardView(
                path=path,
                num_samples=meta.num_samples,
                chunk_map=chunk_map_of(meta),
                group_bytes=group_bytes(meta),
                compressed=is_compressed(meta),
                identity=meta.identity,
            )
        )
        metas.append(fold.add(meta))  # each shard's arrays live once, in the fold
    check_members([Path(p) for p in paths], metas, manifest)
    combined = _combined_meta(name, metas, fold)
    return PackView(
        meta=combined,
        chunk_map=_concatenated_map([s.chunk_map for s in shards]),
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

    Opens no reader: each shard's file is opened, its metadata read and checked against the
    manifest, and closed. URLs (``s3://bucket/pack.h5``, a set's prefix ``s3://bucket/set/``
    or its ``packset.json``, a list of URLs) are read from their ``store``.

    Raises:
        FileNotFoundError: the pack, a shard or the manifest does not exist.
        FormatError: a file is not a pack, or a shard does not belong to the set.
    """
    if not is_packset(source):
        assert isinstance(source, str | os.PathLike)  # is_packset: a single path
        meta = load_pack_meta(source, locking=locking, store=store)
        return PackView(meta, chunk_map_of(meta), group_bytes(meta), is_compressed(meta))
    return _describe_set(source, locking, store)


def open_reader(
    source: PackSource, options: ReaderOptions | None = None, *, view: PackView | None = None
) -> PackReader | PackSetReader:
    """Return the reader of a pack (``PackReader``) or of a pack set (``PackSetReader``).

    Args:
        source: A pack path, a pack set's directory or manifest, or a list of pack paths.
        options: How to read.
        view: ``describe(source)`` from earlier: the reader reads the files it checked, or
            raises ``FormatError`` naming a file replaced since (a dataset's guarantee that
            its labels and its images come from the same files).
    """
    if view is not None and view.shards is not None:
        return PackSetReader(source, options, view=view)
    if is_packset(source):
        return PackSetReader(source, options)
    assert isinstance(source, str | os.PathLike)
    return PackReader(source, options, expected=None if view is None else view.meta.identity)


class _LazyPaths(Sequence[str]):
    """Every sample's source path, each shard's read from it on first use."""

    def __init__(self, owner: PackSetReader) -> None:
        self._owner = owner
        self._loaded: dict[int, list[str]] = {}

    def __len__(self) -> int:
        return self._owner.meta.num_samples

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        shard, local = self._owner.locate(index)
        if shard not in self._loaded:
            self._loaded[shard] = self._owner.shard_reader(shard).paths
        return self._loaded[shard][local]


class PackSetReader:
    """Read the samples of a pack set as one pack; a context manager, read-only.

    The same reading methods as ``PackReader`` (``read_stored``, ``read_into``,
    ``decode``, ``read_images``, ``map_threads``, ``paths``), over global indices.

    Args:
        source: A pack set's directory or manifest, or a list of pack paths.
        options: How each shard is read (``ReaderOptions``); ``window_chunks`` is the window
            kept over all shards together.
        max_open: Shards open at once (each holds two file descriptors).
        view: ``describe(source)``, made earlier (in another process, say).

    Raises:
        FileNotFoundError: the manifest or a shard does not exist.
        FormatError: a shard is not a pack, differs from the manifest's record, or does not
            match the other shards (mode, storage, channels, classes, image shape).
        OptionsError: ``max_open`` is below 1, or the list of packs is empty.

    A ``view`` from ``describe(source)`` skips reading every shard's metadata again; the
    shards are then checked against it as they are opened.
    """

    def __init__(
        self,
        source: PackSource,
        options: ReaderOptions | None = None,
        *,
        max_open: int = DEFAULT_MAX_OPEN,
        view: PackView | None = None,
    ) -> None:
        if max_open < 1:
            raise OptionsError(f"max_open should be >= 1, but got max_open={max_open}")
        self.options = options or ReaderOptions()
        self.max_open = max_open
        if view is None:
            view = _describe_set(source, self.options.locking, self.options.store_for(source))
        if view.shards is None:
            raise OptionsError(f"{view.meta.path} is a single pack: read it with PackReader")
        self.view = view
        self.path = view.meta.path
        self._remote = self.options.store_for(source).remote
        self._shards = view.shards
        self.meta = view.meta
        self.chunk_map = view.chunk_map
        self.group_bytes = view.group_bytes
        self.compressed = view.compressed
        self.verify_checksums = self.options.verify_checksums
        self._sample_starts = np.cumsum([0] + [s.num_samples for s in self._shards])
        # the files checked: their status then, or now for packs without an identity
        self._status = [
            (s.identity.device, s.identity.inode, s.identity.size)
            if s.identity is not None
            else _status_or_none(Path(s.path))
            for s in self._shards
        ]
        self._readers: OrderedDict[int, PackReader] = OrderedDict()
        self.window_chunks = self.options.window_chunks or 1
        if self.options.chunk_cache_bytes is not None:
            self.window_chunks = max(1, self.options.chunk_cache_bytes // self.group_bytes)
        self._window: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._threads = self.options.threads or 0
        self._pool: ThreadPoolExecutor | None = None
        self._paths = _LazyPaths(self)
        self._loads_closed = 0  # groups loaded by shard readers since closed
        self._decompress_ns_closed = 0  # and the time they spent decompressing
        self._plan: ReadPlan | None = None  # given to each shard's reader as it opens

    @property
    def plans_reads(self) -> bool:
        """Whether the shards fetch chunks ahead by a plan (remote, or ``read_ahead`` given)."""
        return self.options.read_ahead is not None or self._remote

    def plan_reads(self, plan: ReadPlan) -> None:
        """Fetch the chunks of ``plan`` ahead of use, shard by shard (as they open)."""
        self._plan = plan
        for shard, reader in self._readers.items():
            self._plan_shard(shard, reader)

    def _plan_shard(self, shard: int, reader: PackReader) -> None:
        if self._plan is not None and reader.plans_reads:
            low, high = int(self._sample_starts[shard]), int(self._sample_starts[shard + 1])
            reader.plan_reads(self._plan.restricted(low, high))

    # -- shards --------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        """Shards in the set."""
        return len(self._shards)

    @property
    def open_shards(self) -> int:
        """Shards open now (at most ``max_open``)."""
        return len(self._readers)

    @property
    def loads(self) -> int:
        """Groups decompressed so far, over every shard."""
        return self._loads_closed + sum(r.loads for r in self._readers.values())

    @property
    def decompress_ns(self) -> int:
        """Nanoseconds spent decompressing chunks, over every shard (``PackReader``'s)."""
        return self._decompress_ns_closed + sum(r.decompress_ns for r in self._readers.values())

    def locate(self, index: int) -> tuple[int, int]:
        """Return ``(shard, index within the shard)`` of global sample ``index``."""
        shard = int(np.searchsorted(self._sample_starts, index, side="right")) - 1
        return shard, int(index - self._sample_starts[shard])

    def shard_reader(self, shard: int) -> PackReader:
        """Return the open reader of shard ``shard``, opening it (and closing the oldest).

        Raises:
            FormatError: the shard was replaced since the set was opened.
        """
        reader = self._readers.get(shard)
        if reader is not None:
            self._readers.move_to_end(shard)
            return reader
        entry = self._shards[shard]
        local = not self._remote  # a remote shard's reader checks its ETag instead
        if local and (
            not Path(entry.path).exists()
            or _status_or_none(Path(entry.path)) != self._status[shard]
        ):
            raise FormatError(
                f"{entry.path}: the shard was removed or replaced since the pack set "
                f"{self.path} was opened; rebuild the loader"
            )
        options = replace(self.options, window_chunks=self.window_chunks, threads=0)
        # the file the set checked, or a FormatError naming it (also if replaced just now)
        try:
            reader = PackReader(entry.path, options, expected=entry.identity)
        except OSError as err:
            if err.errno != errno.EMFILE and "too many open files" not in str(err).lower():
                raise
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            raise H5PackError(
                f"{entry.path}: too many open files (this process may hold {soft}, `ulimit -n`); "
                f"the pack set keeps at most {self.max_open} shards open, two descriptors "
                "each, on top of the process's own files: raise `ulimit -n`, or open fewer "
                "files elsewhere in the process"
            ) from err
        self._readers[shard] = reader
        self._plan_shard(shard, reader)
        while len(self._readers) > self.max_open:
            oldest, closing = self._readers.popitem(last=False)
            self._loads_closed += closing.loads
            self._decompress_ns_closed += closing.decompress_ns
            closing.close()
            for key in [k for k in self._window if k[0] == oldest]:
                del self._window[key]
        return reader

    def _split(self, idx: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Yield ``(shard, positions in idx, local indices)`` in order of first appearance."""
        shards = np.searchsorted(self._sample_starts, idx, side="right") - 1
        _, first = np.unique(shards, return_index=True)
        for shard in shards[np.sort(first)].tolist():
            positions = np.flatnonzero(shards == shard)
            yield shard, positions, idx[positions] - self._sample_starts[shard]

    def _track(self, shard: int, reader: PackReader, local: np.ndarray) -> None:
        """Keep one first-in-first-out window of decompressed groups over all shards."""
        if not reader.compressed:
            return
        groups = reader.chunk_map.chunks_of(local)
        _, first = np.unique(groups, return_index=True)
        for group in groups[np.sort(first)].tolist():
            key = (shard, group)
            if key in self._window:
                continue
            self._window[key] = None
            while len(self._window) > self.window_chunks:
                (old_shard, old_group), _ = self._window.popitem(last=False)
                holder = self._readers.get(old_shard)
                if holder is not None:
                    holder.evict(old_group)

    # -- reading -----------------------------------------------------------------------
    def _check(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        return checked_indices(indices, self.meta.num_samples, "a pack set")

    def read_stored(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return the stored form of each sample in ``indices`` (see ``PackReader``)."""
        idx = self._check(indices)
        out: list[np.ndarray] = [np.empty(0, dtype=np.uint8)] * idx.size
        for shard, positions, local in self._split(idx):
            reader = self.shard_reader(shard)
            for position, sample in zip(positions, reader.read_stored(local), strict=True):
                out[int(position)] = sample
            self._track(shard, reader, local)
        return out

    def read_fields(
        self, indices: Sequence[int] | np.ndarray, names: Sequence[str], *, packed: bool = False
    ) -> dict[str, list[Any]]:
        """Return the values of the stored fields ``names`` (see ``PackReader``)."""
        idx = self._check(indices)
        out: dict[str, list[Any]] = {}
        for shard, positions, local in self._split(idx):
            for name, values in (
                self.shard_reader(shard).read_fields(local, names, packed=packed).items()
            ):
                found = out.setdefault(name, [None] * idx.size)
                for position, value in zip(positions.tolist(), values, strict=True):
                    found[position] = value
        return out

    def read_into(self, indices: Sequence[int] | np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (B, H, W, C) with the samples ``indices`` of an array set."""
        idx = self._check(indices)
        if self.meta.storage != "array" or out.shape[0] != idx.size:
            raise ValueError("read_into needs an array pack set and one row of out per index")
        for shard, positions, local in self._split(idx):
            reader = self.shard_reader(shard)
            if positions.size == idx.size:
                reader.read_into(local, out)
            else:
                part = np.empty((positions.size, *out.shape[1:]), dtype=np.uint8)
                reader.read_into(local, part)
                out[positions] = part
            self._track(shard, reader, local)

    def decode(self, index: int, stored: np.ndarray) -> np.ndarray:
        """Return global sample ``index`` as an HWC uint8 array from its stored form."""
        shard, local = self.locate(index)
        return self.shard_reader(shard).decode(local, stored)

    def read_images(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return each sample in ``indices`` as an HWC uint8 array."""
        idx = self._check(indices)
        stored = self.read_stored(idx)
        return [self.decode(int(i), s) for i, s in zip(idx.tolist(), stored, strict=True)]

    def map_threads(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Return ``[function(item) for item in items]``, on ``threads`` threads if > 1."""
        if self._threads <= 1 or len(items) < 2:
            return [function(item) for item in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="h5pack")
        return list(self._pool.map(function, items))

    @property
    def paths(self) -> Sequence[str]:
        """Every sample's source path (each shard's read on first use)."""
        return self._paths

    def __len__(self) -> int:
        return self.meta.num_samples

    # -- context manager -------------------------------------------------------------
    def close(self) -> None:
        """Close every open shard."""
        for reader in self._readers.values():
            self._loads_closed += reader.loads
            self._decompress_ns_closed += reader.decompress_ns
            reader.close()
        self._readers.clear()
        self._window.clear()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> PackSetReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
