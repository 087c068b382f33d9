"""How a process reads a pack: ``ReaderOptions``, validated once, handed to every reader."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from h5pack._types import StrPath
from h5pack.core.decode import BACKENDS, Backend
from h5pack.core.store import Store, open_store
from h5pack.errors import OptionsError
from h5pack.read.diskcache import DiskCacheOptions
from h5pack.read.eviction import EvictionPolicy

RENAMED = {
    "cache_dir": "disk_cache_dir",
    "cache_disk_bytes": "disk_cache_bytes",
    "cache_eviction": "disk_cache_eviction",
}
"""Fields of older releases and their names now: one word for the disk cache (issue 26)."""


def renamed_message(name: str) -> str | None:
    """Return what the field ``name`` of an older release is called now, or None."""
    new = RENAMED.get(name)
    return None if new is None else f"{name}= moved to reader=ReaderOptions({new}=...)"


class ReaderKeywords(TypedDict, total=False):
    """The ``ReaderOptions`` fields ``make_loader`` also takes as keywords."""

    storage_options: Mapping[str, Any] | None


@dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """How a process reads a pack: window of decompressed chunks, threads, checks, decoder.

    Attributes:
        window_chunks: Decompressed chunks kept, first in, first out (the sampler's window:
            a chunk-aware epoch decompresses each chunk once). None: 1, or the sampler's.
        chunk_cache_bytes: Bytes of decompressed chunks kept instead (one chunk at least).
        locking: HDF5 file locking; ``False`` for network file systems without it, or a
            pack a writer still holds. None keeps HDF5's default.
        backend: Decoder of encoded packs, ``"pillow"`` or ``"opencv"``.
        direct: Use the direct chunk path where it applies; ``False``: h5py reads all.
        threads: Threads that decompress and decode (0 or 1: the calling thread). None: 0
            for a bare reader, ``make_loader`` chooses.
        storage_options: The remote client's settings for a URL (``core.s3.S3Options``...).
        store: The store, chosen once with ``open_store`` (stands for ``storage_options``).
        verify_checksums: Check every sample read against its recorded digest (XXH3-64, else
            CRC32) and raise ``FormatError`` on a mismatch; on by default.
        read_ahead: How chunks are fetched ahead (NOTE [ Planned read-ahead ]); None:
            ``ReadAheadOptions()`` for remote packs, none for local ones.
        disk_cache_dir: The user's disk cache of remote chunks (NOTE [ One disk cache per
            machine ]); None: ``$XDG_CACHE_HOME/h5pack``, else ``~/.cache/h5pack``.
        disk_cache_bytes: Its budget (the whole directory's); 0: no disk cache; None: half
            the free space of its file system when the directory is created.
        disk_cache_eviction: ``"belady"`` (needed farthest ahead goes) or ``"lru"``.
    """

    window_chunks: int | None = None
    chunk_cache_bytes: int | None = None
    locking: bool | None = None
    backend: Backend = "pillow"
    direct: bool = True
    threads: int | None = None
    verify_checksums: bool = True
    # not in the repr: it may hold credentials (NOTE [ No secret in any message ])
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    store: Store | None = None
    read_ahead: ReadAheadOptions | None = None
    disk_cache_dir: str | os.PathLike[str] | None = None
    disk_cache_bytes: int | None = None
    disk_cache_eviction: EvictionPolicy = "belady"

    def __new__(cls, **fields: Any) -> ReaderOptions:  # noqa: D102  (refuses renamed fields)
        moved = [message for name in fields if (message := renamed_message(name))]
        if moved:
            raise OptionsError("; ".join(moved))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        self.disk_cache  # noqa: B018  (validates the budget and the eviction policy)
        for name, low in (("window_chunks", 1), ("chunk_cache_bytes", 0), ("threads", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise OptionsError(f"{name} should be >= {low}, but got {name}={value}")
        if self.backend not in BACKENDS:
            raise OptionsError(
                f"backend should be one of {', '.join(BACKENDS)}, but got backend={self.backend!r}"
            )

    def store_for(self, path: StrPath | Sequence[StrPath]) -> Store:
        """Return ``store``, or the store of ``path`` with ``storage_options`` (NOTE [ Stores ])."""
        return self.store or open_store(path, self.storage_options)

    def window_for(self, group_bytes: int) -> int:
        """Return the decompressed groups to keep, for groups of ``group_bytes``."""
        if self.chunk_cache_bytes is not None:
            return max(1, self.chunk_cache_bytes // max(1, group_bytes))
        return self.window_chunks or 1

    @property
    def disk_cache(self) -> DiskCacheOptions | None:
        """The disk cache of remote chunks these options ask for (None: none)."""
        if self.disk_cache_bytes == 0:
            return None
        return DiskCacheOptions(
            directory=self.disk_cache_dir,
            budget_bytes=self.disk_cache_bytes,
            eviction=self.disk_cache_eviction,
        )


MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ReadAheadOptions:
    """How far and how wide a worker reads ahead of its reader.

    Attributes:
        requests_in_flight: Requests kept in flight; None: sized by measurement (NOTE).
        max_requests_in_flight: The most in flight when sized so (and the fetching threads).
        ahead_bytes: The most bytes fetched ahead (in flight plus fetched and unused).
        merge_bytes: The largest request merging chunks adjacent in plan and file (0: none).
    """

    requests_in_flight: int | None = None
    max_requests_in_flight: int = 16
    ahead_bytes: int = 128 * MIB
    merge_bytes: int = 16 * MIB

    def __post_init__(self) -> None:
        lowest = (("requests_in_flight", 1), ("max_requests_in_flight", 1), ("ahead_bytes", 1))
        for name, low in (*lowest, ("merge_bytes", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise OptionsError(f"{name} should be >= {low}, but got {name}={value}")

    @property
    def threads(self) -> int:
        """Return the fetching threads."""
        return max(self.requests_in_flight or 1, self.max_requests_in_flight)
