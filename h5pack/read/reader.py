"""Read samples from a pack, one read per chunk (or contiguous run), never one per sample.

Compressed chunks are decompressed once and kept in a first-in-first-out window of
decompressed chunks (``read.groups``, sized from the sampler's window), read by the one byte
path of ``read.stored``: the direct chunk path (``read.direct``) where the codec allows, h5py
where it needs HDF5. Uncompressed samples are read straight from the file into their
destination, without a window.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

import h5py
import numpy as np

from h5pack._types import StrPath
from h5pack.core import format as fmt
from h5pack.core.fields import FieldBlocks, read_values
from h5pack.core.integrity import PackIdentity
from h5pack.core.layout import (
    cache_settings,
    checked_indices,
    chunk_map_of,
    group_bytes,
    is_compressed,
)
from h5pack.core.source import LocalSource
from h5pack.core.store import Store
from h5pack.errors import FormatError, H5PackError, RemoteError
from h5pack.read.checks import SampleChecks
from h5pack.read.direct import ChunkTable, DirectFile, chunk_table, contiguous_offset
from h5pack.read.groups import GroupLoad, GroupWindow, first_appearance
from h5pack.read.options import ReaderOptions
from h5pack.read.planned import PlannedSource, ReadPlan, group_chunks, group_pieces, planned_source
from h5pack.read.pool import ReadPool
from h5pack.read.stored import Plan, StoredImages
from h5pack.read.virtual import check_virtual_sources, open_virtual

__all__ = ["PackReader", "ReaderOptions"]

T = TypeVar("T")
_NOTHING = np.empty(0, dtype=np.uint8)  # a placeholder in lists about to be filled
R = TypeVar("R")


class PackReader:
    """Read samples of a pack grouped by chunk; a context manager, read-only.

    Args:
        path: The pack.
        options: How to read it (default ``ReaderOptions()``).
        expected: The identity of the file the caller's metadata came from (a dataset's):
            the reader refuses any other file at ``path``.
        meta: Metadata the caller has read and checked itself from this file (``verify``
            reads damaged metadata to report it); its identity must match the file opened.
        store: Where the pack is kept (default: ``options.store_for(path)``).

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, is of a newer format version, is damaged, or
            is not the file ``expected`` (or ``meta``) describes, or is a virtual pack
            (``h5pack merge --virtual``) one of whose sources is missing or changed
            (``check_virtual_sources``; a virtual pack is read through h5py, ``virtual``).
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
        self.options = options
        locking = options.locking
        self.path = os.fspath(path)
        self.verify_checksums = options.verify_checksums
        # NOTE [ Compact index ]: a URL's pack is opened once (its index: 1-2 requests)
        store = store or options.store_for(self.path)
        self.remote = store.remote
        opened: Any = None
        if self.remote:
            opened = fmt.open_h5(self.path, store=store)
            try:
                found = fmt.read_meta(opened, self.path)
            except BaseException:
                opened.close()
                raise
            fmt.check_identity(self.path, meta.identity if meta else None, found.identity)
            meta = meta or found
        elif meta is None:
            with fmt.open_h5(self.path, locking=locking) as probe:
                meta = fmt.read_meta(probe, self.path)
        fmt.check_identity(self.path, expected, meta.identity)
        self.meta = meta
        self.checks = SampleChecks(meta, self._name)
        self.chunk_map = chunk_map_of(meta)
        self.group_bytes = group_bytes(meta)
        self.compressed = is_compressed(meta)
        if options.chunk_cache_bytes is not None:
            window_chunks = max(1, options.chunk_cache_bytes // max(1, self.group_bytes))
        else:
            window_chunks = options.window_chunks or 1
        # Our window holds decompressed chunks, so HDF5's own cache needs one chunk at most
        # (none for uncompressed data, see layout.cache_settings).
        settings: dict[str, Any] = cache_settings(
            compressed=self.compressed, window_chunks=1, chunk_bytes=self.group_bytes
        )
        self._file: h5py.File = opened or fmt.open_h5(self.path, locking=locking, **settings)
        try:
            self._paths: list[str] | None = None
            table, contiguous = self._open_images(options.direct)
        except BaseException:
            self._file.close()
            raise
        identity = meta.identity
        raw_file = DirectFile(
            self.path,
            identity=(identity.device, identity.inode) if identity else None,
            source=getattr(self._file, "source", None),  # a URL's (core.remote)
        )
        if table is not None or contiguous is not None:  # now: a later descriptor could
            raw_file.pin()  # name a replacing file
        self._pieces: tuple[np.ndarray, np.ndarray] | None = None  # group -> pieces
        # Groups read whole (compressed, or any remote pack) go through the plan; a local
        # uncompressed pack reads runs of samples, which no plan describes.
        if self.compressed and (table is not None or contiguous is not None):
            if table is not None:
                offsets, sizes = table.offsets, table.sizes
                self._pieces = group_chunks(self.chunk_map, meta, table.chunk_nbytes)
            else:
                assert contiguous is not None
                offsets, sizes, self._pieces = group_pieces(
                    self.chunk_map, meta, contiguous, int(np.prod(meta.images_shape[1:]))
                )
            raw_file.source = planned_source(
                raw_file.source,
                offsets,
                sizes,
                pack_id=meta.pack_id,
                read_ahead=options.read_ahead,
                disk_cache=options.disk_cache,
            )
        self.stored = StoredImages(
            meta,
            self.chunk_map,
            table=table,
            contiguous=contiguous,
            file=raw_file,
            images=lambda: self._images,
        )
        self._window = GroupWindow(self.stored, window_chunks)
        self._threads = 0
        self._set_threads(options.threads or 0)
        self._pool: ThreadPoolExecutor | None = None
        self._shared: ReadPool | None = None  # threads shared with other readers (use_pool)
        # (indices, checked, groups, first appearance) found by ``pending_loads`` (``_locate``)
        self._prepared: tuple[Any, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _open_images(self, direct: bool) -> tuple[ChunkTable | None, int | None]:
        """Open the images' dataset; return its chunk table and contiguous offset (direct).

        A virtual pack's sources are checked here, and it is read through h5py only.
        """
        meta = self.meta
        # the same file as the metadata's (the path may have been replaced meanwhile)
        fmt.check_identity(self.path, meta.identity, fmt.identity_of(self._file, self.path))
        with fmt.reading(self.path, "the images' dataset and chunk index"):
            self._images: h5py.Dataset = self._file[fmt.IMAGES]
            self.virtual = bool(self._images.is_virtual)
        if self.virtual and self.remote:
            raise FormatError(
                f"{self.path} is a virtual pack (h5pack merge --virtual), whose sources "
                "HDF5 opens by local path; merge without --virtual to read it from a bucket"
            )
        if self.virtual:  # NOTE [ Virtual packs ] (write/merge.py): sources checked
            num_sources, chunk_bytes = check_virtual_sources(
                self._file, self._images, self.path, meta
            )
            with fmt.reading(self.path, "the images' virtual dataset"):
                self._images = open_virtual(self._file, num_sources, chunk_bytes)
            self.compressed = True  # groups read whole into the window
            return None, None
        if self.remote:  # whole chunks, one request each, never one per sample
            self.compressed = True
        if not direct:
            return None, None
        with fmt.reading(self.path, "the images' dataset and chunk index"):
            return chunk_table(self._images), contiguous_offset(self._images)

    def _set_threads(self, threads: int) -> None:
        self._threads = self._window.threads = threads

    @property
    def direct(self) -> bool:
        """Whether the direct chunk path is in use."""
        return self.stored.direct

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
        if isinstance(source, PlannedSource) and self._pieces is not None:
            held = list(self._window.window)
            source.plan_samples(plan, self.chunk_map, self._pieces, held=held)

    # -- context manager -------------------------------------------------------------
    def close(self) -> None:
        """Close the file (a shared pool, ``use_pool``'s, stays up for its other readers)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.stored.file.close()
        self._window.clear()
        if self._file.id.valid:
            self._file.close()

    def __enter__(self) -> PackReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __len__(self) -> int:
        return self.meta.num_samples

    @property
    def paths(self) -> list[str]:
        """Every sample's relative source path, in pack order (read on first use).

        Raises:
            FormatError: the paths are damaged (they do not match their digest).
        """
        if self._paths is None:
            self._paths = fmt.read_paths(self._file, self.meta)
        return self._paths

    def _name(self, index: int) -> str:
        """Return sample ``index``'s path for a message (or why it cannot be given)."""
        try:
            return self.paths[index]
        except FormatError:
            return "path unknown: the paths are damaged too"

    # -- reading ---------------------------------------------------------------------
    def _check(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        return checked_indices(indices, self.meta.num_samples)

    def _locate(
        self, indices: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Return ``(checked indices, their groups, the groups in first appearance or None)``.

        What ``pending_loads`` found for these very ``indices`` (the same array) is taken,
        not computed again: a mix's batch finds them once per source.
        """
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] is indices:
            return prepared[1], prepared[2], prepared[3]
        idx = self._check(indices)
        return idx, self.chunk_map.chunks_of(idx), None

    def read_stored(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return the stored form of each sample in ``indices``, in that order.

        Array storage gives HWC uint8 arrays; blob storage gives the 1-D uint8 bytes of
        the sample (flat pixels, or the encoded file). Indices are grouped by chunk; each
        compressed chunk is decompressed once while it stays in the window, uncompressed
        samples are read as runs of consecutive indices.

        Raises:
            IndexError: an index is out of range.
            FormatError: the pack is damaged (with ``verify_checksums``, also a sample whose
                bytes do not match their digest).
        """
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
        out: list[np.ndarray] = [_NOTHING] * idx.size  # every slot is filled below
        if self.compressed:
            data = self._groups(first_appearance(groups) if wanted is None else wanted)
            for pos, (i, g) in enumerate(zip(idx.tolist(), groups.tolist(), strict=True)):
                out[pos] = self.stored.sample_of(g, data[g], i).copy()
            return out
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        boundaries = np.flatnonzero(np.diff(groups[order])) + 1
        for positions, wanted in zip(
            np.split(order, boundaries), np.split(sorted_idx, boundaries), strict=True
        ):
            for pos, sample in zip(positions, self.stored.read_uncompressed(wanted), strict=True):
                out[int(pos)] = sample
        return out

    def read_into(self, indices: Sequence[int] | np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (B, H, W, C) uint8 with the samples ``indices`` of an array pack.

        The batch path: no per-sample arrays; a compressed chunk is copied from the window
        with one gather per chunk, uncompressed samples are read from the file into ``out``.

        Raises:
            IndexError: an index is out of range.
            ValueError: the pack is not array storage, or ``out`` has the wrong shape.
            FormatError: the pack is damaged (with ``verify_checksums``, also a sample whose
                bytes do not match their digest).
        """
        idx, groups, wanted = self._locate(indices)
        shape = (idx.size, *self.meta.images_shape[1:])
        if self.meta.storage != "array" or out.shape != shape or out.dtype != np.uint8:
            raise ValueError(f"read_into needs an array pack and a uint8 {shape} buffer")
        with self._damage("samples"):
            self._read_into(idx, out, groups, wanted)

    def stored_views(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray] | None:
        """Views of the stored samples ``indices`` in a read-only mapping of the file, unchecked.

        The stored form of ``read_stored`` (HWC images of an array pack, each sample's bytes
        of a blob pack), for a local, uncompressed pack read by the direct path, blobs only
        when their dataset is contiguous (``NOTE [ Mapped raw reads ]`` in core.source); None
        for any other pack (read it with ``read_into`` or ``read_stored``). The views are
        valid for the batch at hand only; the caller checks each one with
        :meth:`verify_sample` before using it.

        Raises:
            IndexError: an index is out of range.
            FormatError: the file is shorter than the pack's samples (truncated).
        """
        source = self.source
        array = self.meta.storage == "array"
        usable = (
            self.direct and self.stored.all_allocated
            if array
            else self.stored.contiguous is not None
        )
        if self.compressed or not (usable and isinstance(source, LocalSource)):
            return None
        idx = self._check(indices)
        if idx.size == 0:
            return []
        if array:
            starts = self.stored.sample_offsets(idx)
            ends = starts + self.stored.sample_bytes
        else:  # a contiguous blob dataset: each sample's bytes in one piece of the file
            offsets, sizes = self.meta.blob_slots()
            assert self.stored.contiguous is not None  # usable
            starts = self.stored.contiguous + offsets[idx].astype(np.int64)
            ends = starts + sizes[idx]
        with self._damage("samples"):
            mapped = source.mapped(int(ends.max()))
        views = [mapped[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        if array:
            shape = self.meta.images_shape[1:]
            return [view.reshape(shape) for view in views]
        return views

    def sample_checks(
        self, indices: Sequence[int] | np.ndarray
    ) -> tuple[Callable[[Any], int], list[int]] | None:
        """``(digest, recorded)`` to check C-contiguous stored samples of ``indices`` inline.

        ``digest(sample) == recorded[k]`` is what :meth:`verify_sample` checks for sample
        ``indices[k]``, without its Python calls per sample (``NOTE [ Checked as copied ]``);
        on a mismatch call :meth:`verify_sample`, which raises with the message. None
        without ``verify_checksums``. ``indices`` are checked already (``stored_views``).
        """
        return self.checks.inline(indices) if self.verify_checksums else None

    def verify_sample(self, index: int, sample: np.ndarray) -> None:
        """Check ``sample`` (stored form) against its recorded digest, with ``verify_checksums``.

        Raises:
            FormatError: the bytes do not match their digest.
        """
        if self.verify_checksums:
            self.checks.one(index, sample)

    def _verify_group(self, group: int, block: np.ndarray) -> None:
        """Check every sample of a freshly decompressed group (see ``_load_group``)."""
        lo, hi = self.stored.bounds(group)
        samples = [self.stored.sample_of(group, block, i) for i in range(lo, hi)]
        self.checks.many(range(lo, hi), samples, group)

    def _read_into(
        self, idx: np.ndarray, out: np.ndarray, groups: np.ndarray, wanted: np.ndarray | None
    ) -> None:
        if self.compressed:  # checked when decompressed (_load_group)
            data = self._groups(first_appearance(groups) if wanted is None else wanted)
            for g, block in data.items():
                where = np.flatnonzero(groups == g)
                out[where] = block[idx[where] - int(self.chunk_map.starts[g])]
            return
        if self.direct and self.stored.all_allocated:  # mapped: NOTE [ Mapped raw reads ]
            offsets = self.stored.sample_offsets(idx)
            if not offsets.size:
                return
            # in file order (measured ~15% faster than batch order), each to its place
            order = np.argsort(offsets, kind="stable")
            mapped = self.source.mapped(int(offsets.max()) + self.stored.sample_bytes)
            into = out if out.flags.c_contiguous else np.empty_like(out, order="C")
            self.checks.copy_mapped(
                idx, order, offsets[order], mapped, into, check=self.verify_checksums
            )
            if into is not out:
                out[...] = into
            return
        for pos, i in enumerate(idx.tolist()):
            self._images.read_direct(out, np.s_[i : i + 1], np.s_[pos : pos + 1])
        if self.verify_checksums:
            self.checks.many(idx, out)

    def map_threads(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Return ``[function(item) for item in items]``, on ``threads`` threads if > 1.

        For work that releases the GIL (decompressing, decoding images).
        """
        if self._threads <= 1 or len(items) < 2:
            return [function(item) for item in items]
        return list(self._executor().map(function, items))

    def _executor(self) -> ThreadPoolExecutor:
        """The threads this reader's work runs on: the shared pool's, else its own."""
        if self._shared is not None:
            return self._shared.executor()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="h5pack")
        return self._pool

    def use_pool(self, pool: ReadPool | None) -> None:
        """Run this reader's threaded work on ``pool``, shared with other readers (None: its own).

        See NOTE [ One pool for a mix's sources ] (read/pool.py); the pool's threads replace
        this reader's ``threads``, and ``close`` leaves them to the pool's owner.
        """
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._shared = pool
        if pool is not None:
            self._set_threads(pool.threads)

    def pending_loads(self, indices: Sequence[int] | np.ndarray) -> list[GroupLoad]:
        """Return the groups that reading ``indices`` next would decompress, ready to run.

        The groups ``read_into`` / ``read_stored`` of ``indices`` would load, in the order
        they would load them (their stored chunks fetched, their buffers taken): run each
        (on any thread when ``threaded``) and give the result to ``hold``; the next read of
        this very ``indices`` array (left unchanged) then decompresses nothing and locates
        nothing again (NOTE [ One pool for a mix's sources ]).
        """
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
        executor = self._executor() if self._threads > 1 else None
        return self._window.groups(wanted, self._load_group, executor)

    def evict(self, group: int) -> None:
        """Drop group ``group`` from the window of decompressed chunks, if it is there.

        For a pack set's reader, which keeps one window over all its shards.
        """
        self._window.evict(group)

    def _load_group(self, group: int, plan: Plan, buffer: np.ndarray) -> np.ndarray:
        """Read and decompress group ``group`` whole into ``buffer``, checked.

        Raises:
            FormatError: the group's chunks cannot be read or decompressed (a damaged
                pack); the message names the pack, the chunk group and its samples.
        """
        lo, hi = self.stored.bounds(group)
        try:
            block = self.stored.load(group, plan, buffer)
        except RemoteError as err:  # the network, not the pack: named with the chunk group
            raise RemoteError(f"chunk group {group} (samples {lo}..{hi - 1}): {err}") from err
        except H5PackError:
            raise
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            raise FormatError(
                f"{self.path}: chunk group {group} (samples {lo}..{hi - 1}) cannot be read: "
                f"{err}; the pack is damaged, run `h5pack verify {self.path}`"
            ) from err
        if self.verify_checksums:
            self._verify_group(group, block)
        return block

    @property
    def source(self) -> Any:
        """The pack's byte source (``core.source.ByteSource``)."""
        return self.stored.file.source

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
        """Return sample ``index`` as an HWC uint8 array from its stored form.

        Raises:
            DecodeError: an encoded sample does not decode.
        """
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
        self, indices: Sequence[int] | np.ndarray, names: Sequence[str]
    ) -> dict[str, list[Any]]:
        """Return the values of the stored fields ``names`` of samples ``indices`` (by name).

        Raises:
            IndexError: an index is out of range.
            FormatError: a field cannot be read (damage).
        """
        blocks = self.__dict__.setdefault("_field_blocks", FieldBlocks(self._file))
        return read_values(blocks, self.meta, self._check(indices), names)

    def read_images(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return each sample in ``indices`` as an HWC uint8 array."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        stored = self.read_stored(idx)
        return [self.decode(int(i), s) for i, s in zip(idx, stored, strict=True)]

    def iter_chunks(self) -> Iterator[tuple[range, list[np.ndarray]]]:
        """Yield ``(indices, stored samples)`` for every group, in pack order."""
        for chunk in range(self.chunk_map.num_chunks):
            indices = self.chunk_map.samples(chunk)
            yield indices, self.read_stored(np.arange(indices.start, indices.stop))
