"""Read samples from a pack, one read per chunk (or contiguous run), never one per sample.

Compressed chunks are decompressed once and kept in a first-in-first-out window of
decompressed chunks (sized from the sampler's window), read through the direct chunk path
(``h5pack.read.direct``) when it applies and through h5py otherwise. Uncompressed samples are
read straight from the file into their destination, without a cache.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import h5py
import numpy as np

from h5pack._types import StrPath
from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.decode import BACKENDS, Backend
from h5pack.core.integrity import PackIdentity
from h5pack.core.layout import (
    cache_settings,
    checked_indices,
    chunk_map_of,
    group_bytes,
    is_compressed,
    next_prime,
)
from h5pack.core.packset import meta_digest
from h5pack.core.source import LocalSource, is_url
from h5pack.errors import FormatError, H5PackError, OptionsError, RemoteError
from h5pack.read.chunkcache import ChunkCacheOptions
from h5pack.read.direct import ChunkTable, DirectFile, chunk_table, contiguous_offset
from h5pack.read.eviction import EvictionPolicy
from h5pack.read.planned import (
    PlannedSource,
    ReadPlan,
    group_chunks,
    group_pieces,
    planned_source,
)
from h5pack.read.pool import ReadPool
from h5pack.read.readahead import ReadAheadOptions

T = TypeVar("T")
_NOTHING = np.empty(0, dtype=np.uint8)  # a placeholder in lists about to be filled
R = TypeVar("R")


def _first_appearance(values: np.ndarray) -> np.ndarray:
    """Return the distinct ``values`` in order of first appearance."""
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)]


class GroupLoad:
    """A group a reader is about to decompress (``PackReader.pending_loads``).

    Attributes:
        reader: The reader whose group it is (``reader.hold`` takes the result).
        group: The group (chunk group) to load.
        plan: ``PackReader._plan_group``'s ``(direct, buffer bytes)``.
        buffer: Where it is decompressed to, taken from the reader's free buffers.
        threaded: Whether ``run`` may run on another thread (the direct path; h5py's path
            runs in the reader's thread).
    """

    __slots__ = ("buffer", "group", "plan", "reader", "threaded")

    def __init__(
        self,
        reader: PackReader,
        group: int,
        plan: tuple[bool, int],
        buffer: np.ndarray,
        threaded: bool,
    ) -> None:
        self.reader = reader
        self.group = group
        self.plan = plan
        self.buffer = buffer
        self.threaded = threaded

    def run(self) -> np.ndarray:
        """Read and decompress the group (and check it, with ``verify_checksums``)."""
        return self.reader._load_group(self.group, self.plan, self.buffer)


@dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """How a process reads a pack: window of decompressed chunks, threads, checks, decoder.

    Attributes:
        window_chunks: Decompressed chunks kept, first in, first out: the sampler's window,
            so that a chunk-aware epoch decompresses every chunk once. None: 1 for a bare
            ``PackReader``; a dataset takes the sampler's (``make_loader`` sets it).
        chunk_cache_bytes: Bytes of decompressed chunks kept instead (overrides
            ``window_chunks``; at least one chunk is kept).
        locking: HDF5 file locking; ``False`` for network file systems that do not support
            it, or to read a pack that a writer still holds. None keeps HDF5's default.
        backend: Decoder of encoded packs, ``"pillow"`` or ``"opencv"``.
        direct: Use the direct chunk path where it applies (``h5pack.read.direct``);
            ``False`` reads everything through h5py.
        threads: Threads that decompress the chunks one request misses and decode encoded
            samples (codecs and decoders that release the GIL); 0 or 1 works in the calling
            thread. None: 0 for a bare reader; ``make_loader`` chooses (see "Loader defaults").
        storage_options: Settings of the remote client for a URL beyond what the environment
            says (``core.s3.S3Options``: endpoint, credentials, retries...); ignored for
            local paths.
        verify_checksums: Check every sample read against its recorded digest and raise
            ``FormatError`` on a mismatch: damage that still decompresses (codecs without
            their own checksum, uncompressed packs) is then never served. On by default.
            Format 1.1 packs are checked with their XXH3-64 (``sample_xxh3``), which runs at
            memory speed (~4 us per 256x256 image); 1.0 packs, or a process without the
            xxhash package, with the CRC32 every pack has (~50 us per 256x256 image).
            Compressed samples are checked once per decompression of their chunk,
            uncompressed ones at every read.
        read_ahead: How a remote pack's chunks are fetched ahead of use (NOTE [ Planned
            read-ahead ]); None: ``ReadAheadOptions()`` for remote packs, none for local
            ones (given: local packs read ahead too).
        cache_dir: The machine's disk cache of remote chunks, shared by every worker, rank
            and job on the machine (NOTE [ One disk cache per machine ]); None:
            ``h5pack-chunks`` in the temporary directory.
        cache_disk_bytes: Its budget in bytes, never exceeded; 0: no disk cache; None:
            ``DEFAULT_CACHE_DISK_FRACTION`` (half) of the free space of its file system when
            the directory is created (recorded there).
        cache_eviction: ``"belady"`` (the chunk needed farthest in the future goes: the
            default) or ``"lru"`` (least recently used, for comparison).

    Raises:
        OptionsError: a window, cache size or thread count is out of range.
    """

    window_chunks: int | None = None
    chunk_cache_bytes: int | None = None
    locking: bool | None = None
    backend: Backend = "pillow"
    direct: bool = True
    threads: int | None = None
    verify_checksums: bool = True
    storage_options: Mapping[str, Any] | None = None
    read_ahead: ReadAheadOptions | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_disk_bytes: int | None = None
    cache_eviction: EvictionPolicy = "belady"

    def __post_init__(self) -> None:
        self.disk_cache  # noqa: B018  (validates the budget and the eviction policy)
        if self.window_chunks is not None and self.window_chunks < 1:
            raise OptionsError(
                f"window_chunks should be >= 1, but got window_chunks={self.window_chunks}"
            )
        if self.chunk_cache_bytes is not None and self.chunk_cache_bytes < 0:
            raise OptionsError(
                "chunk_cache_bytes should be >= 0, but got "
                f"chunk_cache_bytes={self.chunk_cache_bytes}"
            )
        if self.threads is not None and self.threads < 0:
            raise OptionsError(f"threads should be >= 0, but got threads={self.threads}")
        if self.backend not in BACKENDS:
            raise OptionsError(
                f"backend should be one of {', '.join(BACKENDS)}, but got backend={self.backend!r}"
            )

    @property
    def disk_cache(self) -> ChunkCacheOptions | None:
        """The disk cache of remote chunks these options ask for (None: none)."""
        if self.cache_disk_bytes == 0:
            return None
        return ChunkCacheOptions(
            cache_dir=self.cache_dir,
            cache_disk_bytes=self.cache_disk_bytes,
            eviction=self.cache_eviction,
        )


VIRTUAL_SOURCES_KEY = fmt.VIRTUAL_SOURCES_KEY


# Decompressed source chunks that a virtual pack's sources may keep in HDF5's chunk
# caches, over all sources (each source keeps its own cache).
VIRTUAL_CACHE_BYTES = 2 * 2**30


def check_virtual_sources(
    handle: h5py.File, images: h5py.Dataset, path: str, meta: fmt.PackMeta
) -> tuple[int, int]:
    """Raise ``FormatError`` unless every source of a virtual pack is there and unchanged.

    HDF5 serves the fill value, silently, for the samples of a source file it cannot open
    (a moved or deleted shard, too many open files); so before a virtual pack serves a
    sample, every source HDF5 would read must be one that ``h5pack merge --virtual``
    recorded, exist, and be the same pack (its pack id, size and sample count).

    Returns:
        The number of sources, and the largest decompressed chunk of a compressed source's
        images (0 when no source is compressed).

    Raises:
        FormatError: the record is missing or damaged, or a source is missing or changed
            (the message names the source file).
    """
    with fmt.reading(path, f"the pack attribute {VIRTUAL_SOURCES_KEY!r}"):
        raw = handle.attrs.get(VIRTUAL_SOURCES_KEY)
        mapped = {os.fsdecode(source.file_name) for source in images.virtual_sources()}
    if raw is None:
        raise FormatError(
            f"{path}: its images are an HDF5 virtual dataset without h5pack's record of its "
            "sources (not written by `h5pack merge --virtual`); h5pack does not read a "
            "virtual pack whose sources it cannot check"
        )
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)
    recorded = meta.digests.get(VIRTUAL_SOURCES_KEY)
    if recorded is not None and recorded != integrity.text_digest(text):
        raise FormatError(
            f"{path}: the record of its virtual sources no longer matches its CRC32; {fmt.DAMAGED}"
        )
    try:
        entries = [
            (
                str(e["path"]),
                e.get("pack_id"),
                int(e["file_bytes"]),
                int(e["num_samples"]),
                e.get("digest"),
            )
            for e in json.loads(text)
        ]
    except (ValueError, TypeError, KeyError) as err:
        raise FormatError(
            f"{path}: the record of its virtual sources is malformed ({err})"
        ) from err
    unchecked = sorted(mapped - {relative for relative, *_ in entries})
    if unchecked:
        raise FormatError(
            f"{path}: its virtual images read {unchecked[0]!r}, which is not among its "
            "recorded sources; the pack was altered: merge its sources again"
        )
    base = os.path.dirname(os.path.abspath(path))
    largest = 0
    for relative, pack_id, file_bytes, num_samples, digest in entries:
        source = os.path.normpath(os.path.join(base, relative))
        problem, chunk_bytes = _source_problem(source, pack_id, file_bytes, num_samples, digest)
        largest = max(largest, chunk_bytes)
        if problem:
            raise FormatError(
                f"{path} is a virtual pack (h5pack merge --virtual) and its source {source} "
                f"{problem}; its {num_samples} samples would not be the ones recorded (HDF5 "
                "serves zeros for a source it cannot open). Put the source back unchanged, "
                "or merge again (without --virtual, the merged pack needs no source)"
            )
    return len(entries), largest


def _source_problem(
    source: str, pack_id: Any, file_bytes: int, num_samples: int, digest: Any
) -> tuple[str, int]:
    """Return what is wrong with one source of a virtual pack ("" when nothing).

    And the decompressed bytes of one chunk of its images, when they are compressed (else 0).
    A source is the same pack when its pack id (random at each conversion), size and
    sample count are the recorded ones; a format 1.0 source has no pack id, and its
    metadata digest (``core.packset.meta_digest``) is compared instead.
    """
    try:
        size = os.stat(source).st_size
    except FileNotFoundError:
        return "is missing (moved, renamed or deleted?)", 0
    except OSError as err:
        return f"cannot be read ({err.strerror or err})", 0
    if size != file_bytes:
        return f"changed ({size} bytes, {file_bytes} when the virtual pack was written)", 0
    try:
        with fmt.open_h5(source) as handle:
            found = handle.attrs.get(fmt.PACK_ID_KEY)
            count = int(handle.attrs.get(fmt.NUM_SAMPLES_KEY, -1))
            images = handle[fmt.IMAGES]
            compressed = images.chunks is not None and images.id.get_create_plist().get_nfilters()
            chunk_bytes = int(np.prod(images.chunks)) if compressed else 0
    except (H5PackError, OSError, KeyError) as err:
        return f"cannot be opened ({err})", 0
    found_id = found.decode("utf-8", "replace") if isinstance(found, bytes) else found
    if pack_id is not None and found_id != pack_id:
        return (
            f"is another pack (pack id {found_id}, {pack_id} when the virtual pack was written)",
            0,
        )
    if count != num_samples:
        return f"changed ({count} samples, {num_samples} when the virtual pack was written)", 0
    if pack_id is None and digest is not None:
        try:
            found_digest = meta_digest(fmt.load_meta(source))
        except (H5PackError, OSError) as err:
            return f"cannot be read ({err})", 0
        if found_digest != digest:
            return "changed (its metadata differs from when the virtual pack was written)", 0
    return "", chunk_bytes


def _open_virtual(handle: h5py.File, num_sources: int, chunk_bytes: int) -> h5py.Dataset:
    """Open a virtual pack's images with a chunk cache for its compressed sources.

    Each source dataset HDF5 opens takes its chunk cache from this dataset's access list.
    The reader loads a virtual pack's groups whole into its own window, so a source needs
    room for the chunks one group read spans at its ends: two chunks (at most
    ``VIRTUAL_CACHE_BYTES`` over all sources, at least one chunk each). With HDF5's default
    (1 MiB), a chunk larger than that was decompressed again for every read touching it.
    """
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    if chunk_bytes:
        nbytes = max(chunk_bytes, min(2 * chunk_bytes, VIRTUAL_CACHE_BYTES // num_sources))
        dapl.set_chunk_cache(next_prime(200), int(nbytes * 1.05) + 2**20, 1.0)
    return h5py.Dataset(h5py.h5d.open(handle.id, fmt.IMAGES.encode(), dapl=dapl))


class PackReader:
    """Read samples of a pack grouped by chunk; a context manager, read-only.

    Args:
        path: The pack.
        options: How to read it (default ``ReaderOptions()``).
        expected: The identity of the file the caller's metadata came from (a dataset's):
            the reader refuses any other file at ``path``.
        meta: Metadata the caller has read and checked itself from this file (``verify``
            reads damaged metadata to report it); its identity must match the file opened.

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
    ) -> None:
        options = options or ReaderOptions()
        self.options = options
        locking = options.locking
        self.path = os.fspath(path)
        self.verify_checksums = options.verify_checksums
        # NOTE [ Compact index ]: a URL's pack is opened once (its index: 1-2 requests)
        self.remote = is_url(self.path)
        opened: Any = None
        if self.remote:
            opened = fmt.open_h5(self.path, storage_options=options.storage_options)
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
        if meta.sample_xxh3 is not None and integrity.has_sample_digest():
            self._recorded, self._digest_name = meta.sample_xxh3, "XXH3-64"
            self._digest: Callable[[Any], int] = integrity.sample_digest
            fast = integrity.contiguous_sample_digest()
        else:
            self._recorded, self._digest_name = meta.checksums, "CRC32"
            self._digest = integrity.crc32
            fast = zlib.crc32
        # the same digest for C-contiguous samples, called inline (``sample_checks``)
        self._contiguous_digest: Callable[[Any], int] = fast or self._digest
        self.chunk_map = chunk_map_of(self.meta)
        self.group_bytes = group_bytes(self.meta)
        self.compressed = is_compressed(self.meta)
        if options.chunk_cache_bytes is not None:
            self.window_chunks = max(1, options.chunk_cache_bytes // max(1, self.group_bytes))
        else:
            self.window_chunks = options.window_chunks or 1
        # Our window holds decompressed chunks, so HDF5's own cache needs one chunk at most
        # (none for uncompressed data, see layout.cache_settings).
        settings: dict[str, Any] = cache_settings(
            compressed=self.compressed, window_chunks=1, chunk_bytes=self.group_bytes
        )
        self._file: h5py.File = opened or fmt.open_h5(self.path, locking=locking, **settings)
        try:
            # the same file as the metadata's (the path may have been replaced meanwhile)
            fmt.check_identity(self.path, meta.identity, fmt.identity_of(self._file, self.path))
            self._paths: list[str] | None = None
            self._table: ChunkTable | None = None
            self._contiguous: int | None = None
            with fmt.reading(self.path, "the images' dataset and chunk index"):
                self._images: h5py.Dataset = self._file[fmt.IMAGES]
                self.virtual = bool(self._images.is_virtual)
            if self.virtual and self.remote:
                raise FormatError(
                    f"{self.path} is a virtual pack (h5pack merge --virtual), whose sources "
                    "HDF5 opens by local path; merge without --virtual to read it from a bucket"
                )
            if self.virtual:  # NOTE [ Virtual packs ]: no direct path, sources checked
                num_sources, chunk_bytes = check_virtual_sources(
                    self._file, self._images, self.path, meta
                )
                with fmt.reading(self.path, "the images' virtual dataset"):
                    self._images = _open_virtual(self._file, num_sources, chunk_bytes)
                # NOTE [ Virtual packs ]: one HDF5 read per sample of a virtual dataset costs
                # ~1 ms (its mappings are intersected at every read), so groups are read
                # whole into the window, as compressed chunks are
                self.compressed = True
            with fmt.reading(self.path, "the images' dataset and chunk index"):
                if options.direct and not self.virtual:
                    self._table = chunk_table(self._images)
                    self._contiguous = contiguous_offset(self._images)
            if self.remote:  # whole chunks, one request each, never one per sample
                self.compressed = True
        except BaseException:
            self._file.close()
            raise
        identity = meta.identity
        self._raw_file = DirectFile(
            self.path,
            identity=(identity.device, identity.inode) if identity else None,
            source=getattr(self._file, "source", None),  # a URL's (core.remote)
        )
        if self.direct:  # now: a descriptor opened later could name a replacing file
            self._raw_file.pin()
        self._pieces: tuple[np.ndarray, np.ndarray] | None = None  # group -> pieces
        sample_bytes = int(np.prod(self.meta.images_shape[1:]))
        # Groups read whole (compressed, or any remote pack) go through the plan; a local
        # uncompressed pack reads runs of samples, which no plan describes.
        if self.compressed and (self._table is not None or self._contiguous is not None):
            if self._table is not None:
                offsets, sizes = self._table.offsets, self._table.sizes
                self._pieces = group_chunks(self.chunk_map, meta, self._table.chunk_nbytes)
            else:
                assert self._contiguous is not None
                offsets, sizes, self._pieces = group_pieces(
                    self.chunk_map, meta, self._contiguous, sample_bytes
                )
            self._raw_file.source = planned_source(
                self._raw_file.source,
                offsets,
                sizes,
                pack_id=meta.pack_id,
                read_ahead=options.read_ahead,
                disk_cache=options.disk_cache,
            )
        self._sample_bytes = int(np.prod(self.meta.images_shape[1:]))
        self._step = self.meta.chunks[0] if self.meta.chunks is not None else 1
        self._all_allocated = self._table is None or bool(np.all(self._table.offsets >= 0))
        # group -> (its data, the buffer it lives in); buffers of groups that left it
        self._window: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._free: list[np.ndarray] = []
        self._threads = options.threads or 0
        self._pool: ThreadPoolExecutor | None = None
        self._shared: ReadPool | None = None  # threads shared with other readers (use_pool)
        # groups decompressed ahead for the next read, not yet in the window (``hold``)
        self._held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # (indices, checked, groups, first appearance) found by ``pending_loads`` (``_locate``)
        self._prepared: tuple[Any, np.ndarray, np.ndarray, np.ndarray] | None = None
        self.loads = 0  # groups decompressed so far (a chunk-aware epoch: once each)
        # nanoseconds spent decompressing chunks (the loader's stall report reads it; an
        # update racing another thread's may be lost: a statistic, not a count)
        self.decompress_ns = 0
        # stored chunks fetched for the groups being loaded (see ``_fetch_stored``)
        self._fetched: dict[int, Any] = {}

    @property
    def direct(self) -> bool:
        """Whether the direct chunk path is in use."""
        return self._table is not None or self._contiguous is not None

    @property
    def plans_reads(self) -> bool:
        """Whether this reader fetches chunks ahead by a plan (``plan_reads``)."""
        return isinstance(self._raw_file.source, PlannedSource)

    def plan_reads(self, plan: ReadPlan) -> None:
        """Fetch the chunks of ``plan`` ahead of use (a no-op unless ``plans_reads``)."""
        source = self._raw_file.source
        if isinstance(source, PlannedSource) and self._pieces is not None:
            source.plan_samples(plan, self.chunk_map, self._pieces, held=list(self._window))

    # -- context manager -------------------------------------------------------------
    def close(self) -> None:
        """Close the file (a shared pool, ``use_pool``'s, stays up for its other readers)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._raw_file.close()
        self._window.clear()
        self._held.clear()
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
            self._verify(idx, stored)
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
            data = self._groups(_first_appearance(groups) if wanted is None else wanted)
            for pos, (i, g) in enumerate(zip(idx.tolist(), groups.tolist(), strict=True)):
                out[pos] = self._sample_of(g, data[g], i).copy()
            return out
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        boundaries = np.flatnonzero(np.diff(groups[order])) + 1
        for positions, wanted in zip(
            np.split(order, boundaries), np.split(sorted_idx, boundaries), strict=True
        ):
            for pos, sample in zip(positions, self._read_uncompressed(wanted), strict=True):
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
        source = self._raw_file.source
        array = self.meta.storage == "array"
        usable = self.direct and self._all_allocated if array else self._contiguous is not None
        if self.compressed or not (usable and isinstance(source, LocalSource)):
            return None
        idx = self._check(indices)
        if idx.size == 0:
            return []
        if array:
            starts = self._sample_offsets(idx)
            ends = starts + self._sample_bytes
        else:  # a contiguous blob dataset: each sample's bytes in one piece of the file
            offsets, sizes = self.meta.blob_slots()
            assert self._contiguous is not None  # usable
            starts = self._contiguous + offsets[idx].astype(np.int64)
            ends = starts + sizes[idx]
        with self._damage("samples"):
            mapped = source.mapped(int(ends.max()))
        views = [mapped[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        if array:
            shape = self.meta.images_shape[1:]
            return [view.reshape(shape) for view in views]
        return views

    # NOTE [ Checked as copied ]
    # A mapped raw sample (NOTE [ Mapped raw reads ] in core.source) is checked where its
    # bytes are first touched: its digest computed on the mapping by the xxhash package (the
    # cold read), then the sample copied out of the CPU's cache with a memoryview slice
    # assignment (cheaper in Python than np.copyto's dispatch). The crop path checks its
    # views inline too (sample_checks: the digest on the mapping, then the box cut from the
    # cache). A one-pass copy-and-hash in C was measured and retired
    # (docs/decisions/0001-checked-copy-retired.md); the costs are in BENCHMARKS.md.

    def sample_checks(
        self, indices: Sequence[int] | np.ndarray
    ) -> tuple[Callable[[Any], int], list[int]] | None:
        """``(digest, recorded)`` to check C-contiguous stored samples of ``indices`` inline.

        ``digest(sample) == recorded[k]`` is what :meth:`verify_sample` checks for sample
        ``indices[k]``, without its Python calls per sample (``NOTE [ Checked as copied ]``);
        on a mismatch call :meth:`verify_sample`, which raises with the message. None
        without ``verify_checksums``. ``indices`` are checked already (``stored_views``).
        """
        if not self.verify_checksums:
            return None
        recorded: list[int] = self._recorded[np.asarray(indices, dtype=np.int64)].tolist()
        return self._contiguous_digest, recorded

    def verify_sample(self, index: int, sample: np.ndarray) -> None:
        """Check ``sample`` (stored form) against its recorded digest, with ``verify_checksums``.

        Raises:
            FormatError: the bytes do not match their digest.
        """
        if self.verify_checksums:
            self._verify_one(index, sample)

    def _verify(
        self,
        idx: np.ndarray | Sequence[int],
        samples: Sequence[np.ndarray] | np.ndarray,
        group: int | None = None,
    ) -> None:
        """Raise ``FormatError`` naming the first sample whose digest is not the recorded one."""
        for i, sample in zip(idx, samples, strict=True):
            self._verify_one(int(i), sample, group)

    def _verify_one(self, index: int, sample: np.ndarray, group: int | None = None) -> None:
        got, recorded = self._digest(sample), int(self._recorded[index])
        if got == recorded:
            return
        width = 16 if self._digest_name == "XXH3-64" else 8
        where = f" in chunk group {group}" if group is not None else ""
        raise FormatError(
            f"{self.path}: sample {index} ({self._name(index)}){where} does not match its "
            f"checksum ({self._digest_name} {got:0{width}x}, recorded {recorded:0{width}x}); "
            f"the pack is damaged, run `h5pack verify {self.path}`"
        )

    def _verify_group(self, group: int, block: np.ndarray) -> None:
        """Check every sample of a freshly decompressed group (see ``_load_group``)."""
        lo, hi = int(self.chunk_map.starts[group]), int(self.chunk_map.starts[group + 1])
        if self.meta.storage == "array":
            self._verify(range(lo, hi), block[: hi - lo], group)
            return
        for i in range(lo, hi):
            self._verify_one(i, self._sample_of(group, block, i), group)

    def _read_into(
        self, idx: np.ndarray, out: np.ndarray, groups: np.ndarray, wanted: np.ndarray | None
    ) -> None:
        if self.compressed:  # checked when decompressed (_load_group)
            data = self._groups(_first_appearance(groups) if wanted is None else wanted)
            for g, block in data.items():
                where = np.flatnonzero(groups == g)
                out[where] = block[idx[where] - int(self.chunk_map.starts[g])]
            return
        if self.direct and self._all_allocated:
            offsets = self._sample_offsets(idx)
            # in file order (measured ~15% faster than batch order), each to its place
            order = np.argsort(offsets, kind="stable")
            source = self._raw_file.source
            if offsets.size and isinstance(source, LocalSource):
                mapped = source.mapped(int(offsets.max()) + self._sample_bytes)
                into = out if out.flags.c_contiguous else np.empty_like(out, order="C")
                self._copy_mapped(idx, order, offsets[order], mapped, into)
                if into is not out:
                    out[...] = into
                return
            jobs = list(zip(order.tolist(), offsets[order].tolist(), strict=True))
            raw_read = self._raw_file.read_into
            indices = idx.tolist()

            def read(row: np.ndarray, offset: int, pos: int) -> None:
                raw_read(row, offset)
                if self.verify_checksums:  # while the sample is still in the CPU's cache
                    self._verify_one(indices[pos], row)

            parts = self._threads if self._threads > 1 and idx.size >= 2 * self._threads else 1
            if parts == 1:
                for pos, offset in jobs:
                    read(out[pos], offset, pos)
                return
            # os.preadv releases the GIL: copies from the page cache run in parallel
            bounds = np.linspace(0, idx.size, parts + 1).astype(int).tolist()

            def read_part(part: int) -> None:
                for pos, offset in jobs[bounds[part] : bounds[part + 1]]:
                    read(out[pos], offset, pos)

            list(self._executor().map(read_part, range(parts)))
            return
        for pos, i in enumerate(idx.tolist()):
            self._images.read_direct(out, np.s_[i : i + 1], np.s_[pos : pos + 1])
        if self.verify_checksums:
            self._verify(idx, out)

    def _copy_mapped(
        self,
        idx: np.ndarray,
        order: np.ndarray,
        starts: np.ndarray,
        mapped: np.ndarray,
        out: np.ndarray,
    ) -> None:
        """Copy samples ``idx[order]`` (at ``starts`` in ``mapped``) into ``out``, checked.

        See ``NOTE [ Checked as copied ]`` (and ``NOTE [ Mapped raw reads ]``): in this
        thread, each sample's digest computed on the mapping, then the sample copied.

        Raises:
            FormatError: a sample does not match its digest (named).
        """
        size = self._sample_bytes
        rows, source = out.reshape(-1).data, mapped.data  # memoryviews: cheap slices
        positions, offsets = order.tolist(), starts.tolist()
        checks = self.sample_checks(idx)
        if checks is None:
            for pos, at in zip(positions, offsets, strict=True):
                rows[pos * size : (pos + 1) * size] = source[at : at + size]
            return
        digest, recorded_list = checks
        for pos, at in zip(positions, offsets, strict=True):
            sample = source[at : at + size]
            if digest(sample) != recorded_list[pos]:  # the first touch of its bytes
                self._verify_one(int(idx[pos]), np.frombuffer(sample, dtype=np.uint8))
            rows[pos * size : (pos + 1) * size] = sample  # out of the CPU's cache

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
            self._threads = pool.threads

    def pending_loads(self, indices: Sequence[int] | np.ndarray) -> list[GroupLoad]:
        """Return the groups that reading ``indices`` next would decompress, ready to run.

        The groups ``read_into`` / ``read_stored`` of ``indices`` would load, in the order
        they would load them (their stored chunks fetched, their buffers taken): run each
        (on any thread when ``threaded``) and give the result to ``hold``; the next read of
        this very ``indices`` array (left unchanged) then decompresses nothing and locates
        nothing again (NOTE [ One pool for a mix's sources ]).
        """
        for _, buffer in self._held.values():  # a read that never came (an error)
            if len(self._free) < max(2, self._threads):
                self._free.append(buffer)
        self._held.clear()
        self._prepared = None
        if not self.compressed:
            return []
        idx = self._check(indices)
        groups = self.chunk_map.chunks_of(idx)
        order = _first_appearance(groups)
        self._prepared = (indices, idx, groups, order)  # for the read of these indices
        missing = [g for g in order.tolist() if g not in self._window]
        plans = [self._plan_group(g) for g in missing]
        self._fetch_stored(missing, plans)
        threaded = self._table is not None
        return [
            GroupLoad(self, g, plan, self._take_buffer(plan[1]), threaded)
            for g, plan in zip(missing, plans, strict=True)
        ]

    def hold(self, load: GroupLoad, block: np.ndarray) -> None:
        """Keep ``load``'s decompressed ``block`` for the next read (``pending_loads``)."""
        self._held[load.group] = (block, load.buffer)
        self.loads += 1

    def _groups(self, wanted: np.ndarray) -> dict[int, np.ndarray]:
        """Return the decompressed data of groups ``wanted``, loading those not in the window.

        Loaded groups enter the window in the order given (the order they first appear in
        the request), and the oldest leave first: see sampler's note "Chunk-aware epoch
        order" for why this reads every chunk once per chunk-aware epoch. Output buffers
        are taken here, in the calling thread, and recycled when their group leaves the
        window (see direct's note "Direct chunk path").
        """
        found: dict[int, np.ndarray] = {}
        fresh: list[int] = []  # groups entering the window, in the order wanted
        missing: list[int] = []  # those not held already (``hold``): loaded here
        for g in wanted.tolist():
            if g in self._window:
                found[g] = self._window[g][0]
            else:
                fresh.append(g)
                if g not in self._held:
                    missing.append(g)
        if missing:
            plans = [self._plan_group(g) for g in missing]
            self._fetch_stored(missing, plans)
            buffers = [self._take_buffer(nbytes) for _, nbytes in plans]
            if len(missing) > 1 and self._threads > 1 and self._table is not None:
                # one wait for all, not one per result (Executor.map's): each wake-up of this
                # thread took a core from a decompressing one (2 cores: ~10% per batch)
                submit = self._executor().submit
                futures = [
                    submit(self._load_group, *each)
                    for each in zip(missing, plans, buffers, strict=True)
                ]
                wait(futures)
                loaded = [future.result() for future in futures]
            else:
                args = zip(missing, plans, buffers, strict=True)
                loaded = [self._load_group(*each) for each in args]
            self.loads += len(missing)
            for g, block, buffer in zip(missing, loaded, buffers, strict=True):
                self._held[g] = (block, buffer)
        for g in fresh:
            found[g] = self._held[g][0]
            self._window[g] = self._held.pop(g)
        while len(self._window) > self.window_chunks:
            _, (_, buffer) = self._window.popitem(last=False)
            if len(self._free) < max(2, self._threads):
                self._free.append(buffer)
        return found

    def evict(self, group: int) -> None:
        """Drop group ``group`` from the window of decompressed chunks, if it is there.

        For a pack set's reader, which keeps one window over all its shards.
        """
        entry = self._window.pop(group, None)
        if entry is not None and len(self._free) < max(2, self._threads):
            self._free.append(entry[1])

    def _take_buffer(self, nbytes: int) -> np.ndarray:
        for i, buffer in enumerate(self._free):
            if buffer.size == nbytes:
                return self._free.pop(i)
        return np.empty(nbytes, dtype=np.uint8)

    def _plan_group(self, group: int) -> tuple[bool, int]:
        """Return ``(direct, buffer bytes)`` for loading group ``group`` whole."""
        lo, hi = int(self.chunk_map.starts[group]), int(self.chunk_map.starts[group + 1])
        table = self._table
        if self.meta.storage == "array":
            if table is not None and table.offsets[group] >= 0:
                return True, table.chunk_nbytes
            return self._contiguous is not None, (hi - lo) * self._sample_bytes
        begin, end = self._blob_span(lo, hi)
        if self._contiguous is not None:
            return True, end - begin
        if table is not None:
            first, last = begin // table.chunk_nbytes, (end - 1) // table.chunk_nbytes
            if bool(np.all(table.offsets[first : last + 1] >= 0)):
                return True, (last - first + 1) * table.chunk_nbytes
        return False, end - begin

    def _load_group(self, group: int, plan: tuple[bool, int], buffer: np.ndarray) -> np.ndarray:
        """Read and decompress group ``group`` whole into ``buffer`` (see ``_plan_group``).

        Array storage: (n, H, W, C) samples of the group. Blob storage: the 1-D bytes from
        the group's first slot to the end of its last sample.

        Raises:
            FormatError: the group's chunks cannot be read or decompressed (a damaged
                pack); the message names the pack, the chunk group and its samples.
        """
        try:
            block = self._load_group_unchecked(group, plan, buffer)
        except RemoteError as err:  # the network, not the pack: named with the chunk group
            lo, hi = int(self.chunk_map.starts[group]), int(self.chunk_map.starts[group + 1])
            raise RemoteError(f"chunk group {group} (samples {lo}..{hi - 1}): {err}") from err
        except H5PackError:
            raise
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            lo, hi = int(self.chunk_map.starts[group]), int(self.chunk_map.starts[group + 1])
            raise FormatError(
                f"{self.path}: chunk group {group} (samples {lo}..{hi - 1}) cannot be read: "
                f"{err}; the pack is damaged, run `h5pack verify {self.path}`"
            ) from err
        if self.verify_checksums:
            self._verify_group(group, block)
        return block

    def _load_group_unchecked(
        self, group: int, plan: tuple[bool, int], buffer: np.ndarray
    ) -> np.ndarray:
        direct, _ = plan
        lo, hi = int(self.chunk_map.starts[group]), int(self.chunk_map.starts[group + 1])
        table = self._table
        if direct and table is None:  # contiguous (a remote pack): the group's bytes at once
            assert self._contiguous is not None  # planned direct
            if self.meta.storage == "array":
                view = buffer.reshape(hi - lo, *self.meta.images_shape[1:])
                self._raw_file.read_into(view, self._contiguous + lo * self._sample_bytes)
                return view
            self._raw_file.read_into(buffer, self._contiguous + self._blob_span(lo, hi)[0])
            return buffer
        if self.meta.storage == "array":
            if direct:
                assert table is not None  # planned direct
                self._read_chunk_into(table, group, buffer)
                return buffer.reshape(-1, *self.meta.images_shape[1:])[: hi - lo]
            view = buffer.reshape(hi - lo, *self.meta.images_shape[1:])
            self._images.read_direct(view, np.s_[lo:hi], np.s_[0 : hi - lo])
            return view
        begin, end = self._blob_span(lo, hi)
        if direct:
            assert table is not None  # planned direct
            step = table.chunk_nbytes
            first = begin // step
            for k in range(buffer.size // step):
                self._read_chunk_into(table, first + k, buffer[k * step : (k + 1) * step])
            return buffer[begin - first * step : end - first * step]
        self._images.read_direct(buffer, np.s_[begin:end], np.s_[0 : end - begin])
        return buffer

    def _read_chunk_into(self, table: ChunkTable, chunk: int, out: np.ndarray) -> None:
        fetched = self._fetched.pop(chunk, None)
        if fetched is not None:
            stored = np.frombuffer(fetched, dtype=np.uint8)
            if stored.size != int(table.sizes[chunk]):
                raise OSError(
                    f"chunk {chunk}: {stored.size} bytes read, {table.sizes[chunk]} stored"
                )
        else:
            stored = self._raw_file.read_scratch(int(table.sizes[chunk]), int(table.offsets[chunk]))
        start = time.perf_counter_ns()
        table.decompress_into(chunk, stored, out)
        self.decompress_ns += time.perf_counter_ns() - start

    # NOTE [ One request per chunk ]: a remote pack's groups are read whole (never one
    # request per sample), and the stored chunks of every group one call misses are fetched
    # together by ``source.read_ranges`` (one ranged GET each, exactly the chunk's bytes,
    # concurrently), before any is decompressed. ``use_source`` puts a wrapper there (the
    # planned read-ahead and the disk cache, ``read.planned.PlannedSource``).

    @property
    def source(self) -> Any:
        """The pack's byte source (``core.source.ByteSource``)."""
        return self._raw_file.source

    @property
    def chunk_index(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(offsets, sizes)`` of the images' stored chunks, or None off the direct path."""
        if self._table is None:
            return None
        return self._table.offsets, self._table.sizes

    def use_source(self, source: Any) -> None:
        """Read the pack's bytes through ``source`` (a ``ByteSource`` wrapping ``self.source``)."""
        self._raw_file.source = source
        self._fetched.clear()

    def _fetch_stored(self, groups: list[int], plans: list[tuple[bool, int]]) -> None:
        """Fetch the stored chunks of ``groups`` in one ``read_ranges`` (a remote pack)."""
        table = self._table
        if not self.remote or table is None:
            return
        chunks: list[int] = []
        for group, (direct, nbytes) in zip(groups, plans, strict=True):
            if not direct:
                continue
            lo = int(self.chunk_map.starts[group])
            if self.meta.storage == "array":
                chunks.append(group)
                continue
            first = self._blob_span(lo, int(self.chunk_map.starts[group + 1]))[0]
            first //= table.chunk_nbytes
            chunks.extend(range(first, first + nbytes // table.chunk_nbytes))
        chunks = [c for c in dict.fromkeys(chunks) if c not in self._fetched]
        if not chunks:
            return
        ranges = [(int(table.offsets[c]), int(table.offsets[c] + table.sizes[c])) for c in chunks]
        try:
            fetched = self.source.read_ranges(ranges)
        except RemoteError as err:
            named = ", ".join(str(c) for c in chunks[:8]) + (", ..." if len(chunks) > 8 else "")
            raise RemoteError(f"reading chunk(s) {named}: {err}") from err
        self._fetched.update(zip(chunks, fetched, strict=True))

    def _blob_span(self, lo: int, hi: int) -> tuple[int, int]:
        offsets, sizes = self.meta.blob_slots()
        return int(offsets[lo]), int(offsets[hi - 1]) + int(sizes[hi - 1])

    def _sample_of(self, group: int, block: np.ndarray, index: int) -> np.ndarray:
        """Return sample ``index`` (a view) from its group's decompressed data."""
        if self.meta.storage == "array":
            sample: np.ndarray = block[index - int(self.chunk_map.starts[group])]
            return sample
        offsets, sizes = self.meta.blob_slots()
        start = int(offsets[index]) - int(offsets[self.chunk_map.starts[group]])
        return block[start : start + int(sizes[index])]

    def _sample_offset(self, index: int) -> int:
        """Return the file offset of uncompressed array sample ``index`` (direct path)."""
        return int(self._sample_offsets(np.array([index]))[0])

    def _sample_offsets(self, indices: np.ndarray) -> np.ndarray:
        """Return the file offsets of uncompressed array samples ``indices`` (direct path)."""
        within = indices * self._sample_bytes
        if self._contiguous is not None:
            return np.asarray(self._contiguous + within, dtype=np.int64)
        assert self._table is not None  # direct is true
        step = self._step
        base = self._table.offsets[indices // step] - (indices // step) * step * self._sample_bytes
        return np.asarray(base + within, dtype=np.int64)

    def _runs(self, wanted: np.ndarray) -> list[tuple[int, int]]:
        """Return the [lo, hi) runs of consecutive indices among sorted ``wanted``."""
        unique = np.unique(wanted)
        breaks = np.flatnonzero(np.diff(unique) > 1) + 1
        return [(int(run[0]), int(run[-1]) + 1) for run in np.split(unique, breaks)]

    def _read_uncompressed(self, wanted: np.ndarray) -> list[np.ndarray]:
        """Read sorted uncompressed indices of one group, run by run."""
        result: list[np.ndarray] = []
        for lo, hi in self._runs(wanted):
            inside = wanted[(wanted >= lo) & (wanted < hi)]
            if self.meta.storage == "array":
                block = self._read_array_run(lo, hi)
                result.extend(block[int(i) - lo] for i in inside)
                continue
            begin, end = self._blob_span(lo, hi)
            data = self._read_blob_bytes(begin, end)
            offsets, sizes = self.meta.blob_slots()
            for i in inside.tolist():
                start = int(offsets[i]) - begin
                result.append(data[start : start + int(sizes[i])])
        return result

    def _read_array_run(self, lo: int, hi: int) -> np.ndarray:
        block = np.empty((hi - lo, *self.meta.images_shape[1:]), dtype=np.uint8)
        table = self._table
        allocated = table is None or table.offsets[self.chunk_map.chunk_of(lo)] >= 0
        if self.direct and allocated:
            self._raw_file.read_into(block, self._sample_offset(lo))
        else:
            self._images.read_direct(block, np.s_[lo:hi], np.s_[0 : hi - lo])
        return block

    def _read_blob_bytes(self, begin: int, end: int) -> np.ndarray:
        data = np.empty(end - begin, dtype=np.uint8)
        if self._contiguous is not None:
            self._raw_file.read_into(data, self._contiguous + begin)
            return data
        table = self._table
        if table is not None:
            step = table.chunk_nbytes
            chunk = begin // step
            if (end - 1) // step == chunk and table.offsets[chunk] >= 0:
                self._raw_file.read_into(data, int(table.offsets[chunk]) + begin - chunk * step)
                return data
        stored: np.ndarray = self._images[begin:end]
        return stored

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
