"""Read samples from a pack, one read per chunk (or contiguous run), never one per sample.

Compressed chunks are decompressed once into a FIFO window (``read.groups``) through the one
byte path (``read.stored``); uncompressed samples go straight into their destination.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from h5pack._types import StrPath
from h5pack.core import format as fmt
from h5pack.core.fields import FieldBlocks, read_values
from h5pack.core.integrity import PackIdentity
from h5pack.core.layout import checked_indices, group_bytes
from h5pack.core.store import Store
from h5pack.errors import FormatError, H5PackError, RemoteError
from h5pack.read.checks import SampleChecks
from h5pack.read.groups import GroupLoad, GroupWindow, first_appearance
from h5pack.read.opened import open_pack
from h5pack.read.options import ReaderOptions
from h5pack.read.planned import PlannedSource, ReadPlan
from h5pack.read.pool import ReadPool
from h5pack.read.stored import Plan

__all__ = ["PackReader", "ReaderOptions"]

T = TypeVar("T")
R = TypeVar("R")


class PackReader:
    """Read samples of a pack grouped by chunk; a context manager, read-only.

    Args:
        path: The pack.
        options: How to read it (default ``ReaderOptions()``).
        expected: The identity of the file the caller's metadata came from: another file at
            ``path`` is refused (``FormatError``).
        meta: Metadata the caller read and checked from this file (``verify``'s).
        store: Where the pack is kept (default: ``options.store_for(path)``).
    """

    def __init__(
        self,
        path: StrPath,
        options: ReaderOptions | None = None,
        *,
        expected: PackIdentity | None = None,
        meta: fmt.PackMeta | None = None,
        store: Store | None = None,
    ) -> None:
        options = options or ReaderOptions()
        self.options, self.path = options, os.fspath(path)
        self.verify_checksums = options.verify_checksums
        store = store or options.store_for(self.path)
        self.remote = store.remote
        self._paths: list[str] | None = None
        self._pack = open_pack(self.path, options, store, expected=expected, meta=meta)
        self.meta, self.stored = self._pack.meta, self._pack.stored
        self.compressed = self._pack.compressed
        self.direct = self.stored.direct  # whether the direct chunk path is in use
        self.chunk_map = self.stored.chunk_map
        self.group_bytes = group_bytes(self.meta)
        self.checks = SampleChecks(self.meta, self._name)
        threads = options.threads or 0
        self._window = GroupWindow(self.stored, options.window_for(self.group_bytes), threads)
        # (indices, checked, groups, first appearance) found by ``pending_loads`` (``_locate``)
        self._prepared: tuple[Any, np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def window_chunks(self) -> int:
        """Decompressed groups kept (``ReaderOptions.window_chunks``)."""
        return self._window.window_chunks

    @property
    def loads(self) -> int:
        """Groups decompressed so far (a chunk-aware epoch: once each)."""
        return self._window.loads

    @property
    def decompress_ns(self) -> int:
        """Nanoseconds spent decompressing chunks (a statistic: racing updates may be lost)."""
        return self.stored.decompress_ns

    @property
    def plans_reads(self) -> bool:
        """Whether this reader fetches chunks ahead by a plan (``plan_reads``)."""
        return isinstance(self.source, PlannedSource)

    def plan_reads(self, plan: ReadPlan) -> None:
        """Fetch the chunks of ``plan`` ahead of use (a no-op unless ``plans_reads``)."""
        source = self.source
        if isinstance(source, PlannedSource) and self._pack.pieces is not None:
            held = list(self._window.window)
            source.plan_samples(plan, self.chunk_map, self._pack.pieces, held=held)

    def close(self) -> None:
        """Close the file (a shared pool, ``use_pool``'s, stays up for its other readers)."""
        self._window.close()
        self._pack.close()

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.meta.num_samples

    @property
    def paths(self) -> list[str]:
        """Every sample's relative source path, in pack order (read on first use)."""
        if self._paths is None:
            self._paths = fmt.read_paths(self._pack.index, self.meta)
        return self._paths

    def _name(self, index: int) -> str:
        """Return sample ``index``'s path for a message (or why it cannot be given)."""
        try:
            return self.paths[index]
        except FormatError:
            return "path unknown: the paths are damaged too"

    def _check(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        return checked_indices(indices, self.meta.num_samples)

    def _locate(
        self, indices: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Return ``(checked indices, their groups, the groups in first appearance or None)``."""
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] is indices:
            return prepared[1], prepared[2], prepared[3]
        idx = self._check(indices)
        return idx, self.chunk_map.chunks_of(idx), None

    def read_stored(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return the stored form of each sample in ``indices``, in that order."""
        idx, groups, wanted = self._locate(indices)
        with self._damage("samples"):
            stored = self._read_stored(idx, groups, wanted)
        if self.verify_checksums and not self.compressed:  # compressed: checked at load
            self.checks.many(idx, stored)
        return stored

    @contextmanager
    def _damage(self, what: str) -> Iterator[None]:
        """Turn HDF5's and the direct path's read errors into a ``FormatError``."""
        try:
            yield
        except H5PackError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError) as err:
            raise FormatError(
                f"{self.path}: {what} cannot be read ({err}); the pack is damaged, run "
                f"`h5pack verify {self.path}`"
            ) from err

    def _read_stored(
        self, idx: np.ndarray, groups: np.ndarray, wanted: np.ndarray | None
    ) -> list[np.ndarray]:
        if self.compressed:
            data = self._groups(first_appearance(groups) if wanted is None else wanted)
            pairs = zip(idx.tolist(), groups.tolist(), strict=True)
            return [self.stored.sample_of(g, data[g], i).copy() for i, g in pairs]
        return self.stored.read_uncompressed(idx, groups)

    def read_into(self, indices: Sequence[int] | np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (B, H, W, C) uint8 with the samples ``indices`` of an array pack."""
        idx, groups, wanted = self._locate(indices)
        shape = (idx.size, *self.meta.images_shape[1:])
        if self.meta.storage != "array" or out.shape != shape or out.dtype != np.uint8:
            raise ValueError(f"read_into needs an array pack and a uint8 {shape} buffer")
        with self._damage("samples"):
            self._read_into(idx, out, groups, wanted)

    def stored_views(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray] | None:
        """Views of the stored samples ``indices`` in a read-only mapping of the file, unchecked."""
        if self.compressed:
            return None
        idx = self._check(indices)
        with self._damage("samples"):
            return self.stored.mapped_views(idx)

    def sample_checks(
        self, indices: Sequence[int] | np.ndarray
    ) -> tuple[Callable[[Any], int], list[int]] | None:
        """``(digest, recorded)`` to check C-contiguous stored samples of ``indices`` inline."""
        return self.checks.inline(indices) if self.verify_checksums else None

    def verify_sample(self, index: int, sample: np.ndarray) -> None:
        """Check ``sample`` (stored form) against its recorded digest, with ``verify_checksums``."""
        if self.verify_checksums:
            self.checks.one(index, sample)

    def _read_into(
        self, idx: np.ndarray, out: np.ndarray, groups: np.ndarray, wanted: np.ndarray | None
    ) -> None:
        if self.compressed:  # checked when decompressed (_load_group)
            data = self._groups(first_appearance(groups) if wanted is None else wanted)
            for g, block in data.items():
                where = np.flatnonzero(groups == g)
                out[where] = block[idx[where] - int(self.chunk_map.starts[g])]
            return
        check = self.checks if self.verify_checksums else None
        self.stored.read_uncompressed_into(idx, out, check)

    def map_threads(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Return ``[function(item) for item in items]``, on ``threads`` threads if > 1."""
        return self._window.map(function, items)

    def use_pool(self, pool: ReadPool | None) -> None:
        """Run this reader's threaded work on ``pool`` (None: its own): NOTE [ One pool ... ]."""
        self._window.use_pool(pool)

    def pending_loads(self, indices: Sequence[int] | np.ndarray) -> list[GroupLoad]:
        """Return the groups that reading ``indices`` next would decompress, ready to run."""
        self._prepared = None
        if not self.compressed:
            return []
        idx = self._check(indices)
        groups = self.chunk_map.chunks_of(idx)
        order = first_appearance(groups)
        self._prepared = (indices, idx, groups, order)  # for the read of these indices
        threaded = self.stored.table is not None
        return [GroupLoad(self, *job, threaded) for job in self._window.pending(order)]

    def hold(self, load: GroupLoad, block: np.ndarray) -> None:
        """Keep ``load``'s decompressed ``block`` for the next read (``pending_loads``)."""
        self._window.hold(load.group, block, load.buffer)

    def _groups(self, wanted: np.ndarray) -> dict[int, np.ndarray]:
        """Return the decompressed data of groups ``wanted`` (``GroupWindow.groups``)."""
        return self._window.groups(wanted, self._load_group)

    def evict(self, group: int) -> None:
        """Drop group ``group`` from the window of decompressed chunks, if it is there."""
        self._window.evict(group)

    def _load_group(self, group: int, plan: Plan, buffer: np.ndarray) -> np.ndarray:
        """Read and decompress group ``group`` whole into ``buffer``, checked."""
        lo, hi = self.stored.bounds(group)
        try:
            checks = self.checks if self.verify_checksums else None
            return self.stored.load_checked(group, plan, buffer, checks)
        except RemoteError as err:  # the network, not the pack: named with the chunk group
            raise RemoteError(f"chunk group {group} (samples {lo}..{hi - 1}): {err}") from err
        except H5PackError:
            raise
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            raise FormatError(
                f"{self.path}: chunk group {group} (samples {lo}..{hi - 1}) cannot be read: "
                f"{err}; the pack is damaged, run `h5pack verify {self.path}`"
            ) from err

    @property
    def source(self) -> Any:
        """The pack's byte source (``core.source.ByteSource``)."""
        return self.stored.source

    @property
    def chunk_index(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(offsets, sizes)`` of the images' stored chunks, or None off the direct path."""
        table = self.stored.table
        return None if table is None else (table.offsets, table.sizes)

    def read_chunk(self, chunk: int) -> list[np.ndarray]:
        """Return the stored form of every sample in group ``chunk``."""
        indices = self.chunk_map.samples(chunk)
        return self.read_stored(np.arange(indices.start, indices.stop))

    def decode(self, index: int, stored: np.ndarray) -> np.ndarray:
        """Return sample ``index`` as an HWC uint8 array from its stored form."""
        if self.meta.storage == "array":
            return stored
        if self.meta.mode == "raw":
            h, w, c = (int(s) for s in self.meta.shapes[index])
            return stored.reshape(h, w, c)
        from h5pack.core.decode import decode_image

        return decode_image(
            stored.tobytes(),
            name=f"{self.path}[{index}] ({self.paths[index]})",
            backend=self.options.backend,
            channels=self.meta.channels,
        )

    def read_fields(
        self, indices: Sequence[int] | np.ndarray, names: Sequence[str], *, packed: bool = False
    ) -> dict[str, list[Any]]:
        """Return the values of the stored fields ``names`` of samples ``indices`` (by name)."""
        blocks = self.__dict__.setdefault("_field_blocks", FieldBlocks(self._pack.index.hdf5()))
        return read_values(blocks, self.meta, self._check(indices), names, packed=packed)

    def read_images(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return each sample in ``indices`` as an HWC uint8 array."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return [self.decode(int(i), s) for i, s in zip(idx, self.read_stored(idx), strict=True)]

    def iter_chunks(self) -> Iterator[tuple[range, list[np.ndarray]]]:
        """Yield ``(indices, stored samples)`` for every group, in pack order."""
        for chunk in range(self.chunk_map.num_chunks):
            yield self.chunk_map.samples(chunk), self.read_chunk(chunk)
