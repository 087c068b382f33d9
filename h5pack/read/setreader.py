"""Read a pack set as if it were one pack (``PackSetReader``), or a pack (``open_reader``).

Shards open lazily, at most ``max_open`` at once (least recently used out: 10,000 shards
fit ``ulimit -n`` 1,024), one window kept over all; a shard replaced since ``describe``
checked it is refused when it is (re)opened.
"""

from __future__ import annotations

import errno
import os
import resource
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from h5pack.core.layout import checked_indices
from h5pack.core.packset import is_packset
from h5pack.errors import FormatError, H5PackError, OptionsError
from h5pack.read.packset import PackSource, PackView, describe_set
from h5pack.read.planned import ReadPlan
from h5pack.read.pool import ReadPool
from h5pack.read.reader import PackReader, ReaderOptions

T = TypeVar("T")
R = TypeVar("R")


# Shards open at once: two file descriptors each (HDF5's and the direct path's).
DEFAULT_MAX_OPEN = 64


def _status_or_none(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size)


def open_reader(
    source: PackSource, options: ReaderOptions | None = None, *, view: PackView | None = None
) -> PackReader | PackSetReader:
    """Return the reader of a pack (``PackReader``) or of a pack set (``PackSetReader``).

    ``view``: ``describe(source)`` from earlier: the reader reads the files it checked, or
    raises ``FormatError`` naming one replaced since.
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

    ``PackReader``'s reading methods over global indices. ``options.window_chunks`` is the
    window over all shards; ``max_open`` shards are open at once (two descriptors each);
    ``view`` (``describe(source)``, made earlier) spares reading every shard's metadata again.
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
            view = describe_set(source, self.options.locking, self.options.store_for(source))
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
        self.window_chunks = self.options.window_for(self.group_bytes)
        self._window: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._pool = ReadPool(max(1, self.options.threads or 0))
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
        """Return the open reader of shard ``shard``, opening it (and closing the oldest)."""
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
        return self._pool.map(function, items)

    @property
    def paths(self) -> Sequence[str]:
        """Every sample's source path (each shard's read on first use)."""
        return self._paths

    def __len__(self) -> int:
        return self.meta.num_samples

    def close(self) -> None:
        """Close every open shard."""
        for reader in self._readers.values():
            self._loads_closed += reader.loads
            self._decompress_ns_closed += reader.decompress_ns
            reader.close()
        self._readers.clear()
        self._window.clear()
        self._pool.close()

    def __enter__(self) -> PackSetReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
