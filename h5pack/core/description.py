"""The one read-side description of a pack (``PackIndex``), and HDF5's of a pack without an index.

``core.index.CompactIndex`` parses a published pack's compact index; ``HDF5Index`` reads
HDF5's metadata as asked. h5py is opened (``hdf5``) only for what HDF5 alone reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import h5py
import numpy as np

from h5pack.core.integrity import PackIdentity
from h5pack.core.names import IMAGES, PATHS
from h5pack.core.source import ByteSource
from h5pack.errors import FormatError


@dataclass(frozen=True)
class ImagesLayout:
    """How the images are stored: ``filters`` as ``(id, values)``, a contiguous one's ``offset``."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunks: tuple[int, ...] | None
    compression: Any
    compression_opts: Any
    filters: tuple[tuple[int, tuple[int, ...]], ...]
    offset: int | None


class ChunkIndex(NamedTuple):
    """Every stored chunk of the images: its position, file offset, size and filter mask."""

    positions: np.ndarray  # (n, ndim) int64: the chunk's first element
    offsets: np.ndarray  # (n,) int64
    sizes: np.ndarray  # (n,) int64
    masks: np.ndarray  # (n,) int64: bit i set, filter i was skipped


class PackIndex(ABC):
    """A pack's read-side description, a context manager; ``source`` its bytes if remote."""

    path: str
    source: ByteSource | None = None

    @property
    @abstractmethod
    def attrs(self) -> Mapping[str, Any]: ...  # noqa: D102 (the root attributes)

    @abstractmethod
    def names(self) -> list[str]: ...  # noqa: D102 (a group's as ``group/name``: ``/fields``)

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]: ...  # noqa: D102

    @abstractmethod
    def array(self, name: str) -> np.ndarray: ...  # noqa: D102 (strings: object array of bytes)

    @abstractmethod
    def images(self) -> ImagesLayout: ...  # noqa: D102

    @abstractmethod
    def chunk_index(self) -> ChunkIndex: ...  # noqa: D102 (a chunked dataset's)

    @abstractmethod
    def paths(self) -> Any: ...  # noqa: D102 (sliceable, read slab by slab, never at open)

    @abstractmethod
    def hdf5(self) -> h5py.File: ...  # noqa: D102 (for what only HDF5 reads; opened on first use)

    @abstractmethod
    def close(self) -> None: ...  # noqa: D102

    def identity(self, pack_id: str | None) -> PackIdentity | None:
        """Return the identity of what was opened (None: ask the HDF5 file's descriptor)."""
        if self.source is None:
            return None
        found = self.source.identity()
        return PackIdentity.remote(pack_id, found.size, found.tag)

    def __enter__(self) -> PackIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HDF5Index(PackIndex):
    """A pack described from HDF5's metadata, read as asked (closed with its ``handle``)."""

    def __init__(self, handle: h5py.File, path: str, source: ByteSource | None = None) -> None:
        self.handle, self.path, self.source = handle, path, source

    @property
    def attrs(self) -> Mapping[str, Any]:  # noqa: D102 (read as asked: damage met in a check)
        found: Mapping[str, Any] = self.handle.attrs
        return found

    def names(self) -> list[str]:  # noqa: D102
        found = []
        for name, item in self.handle.items():
            found += [f"{name}/{c}" for c in item] if isinstance(item, h5py.Group) else [name]
        return found

    def shape(self, name: str) -> tuple[int, ...]:  # noqa: D102
        return tuple(int(s) for s in self.handle[name].shape)

    def array(self, name: str) -> np.ndarray:  # noqa: D102
        return np.asarray(self.handle[name][()])

    def images(self) -> ImagesLayout:  # noqa: D102
        images = self.handle[IMAGES]
        plist = images.id.get_create_plist()
        filters = []
        for i in range(plist.get_nfilters()):
            filter_id, _flags, values, _name = plist.get_filter(i)
            filters.append((int(filter_id), tuple(int(v) for v in values)))
        if images.is_virtual:  # docs/decisions/0160-no-virtual-packs.md
            raise FormatError(
                f"{self.path}: its images are an HDF5 virtual dataset, which h5pack does not "
                "read; merge the packs it views without --virtual, or read them as a pack set"
            )
        offset = images.id.get_offset() if images.chunks is None else None
        return ImagesLayout(
            shape=tuple(int(s) for s in images.shape),
            dtype=images.dtype,
            chunks=tuple(int(c) for c in images.chunks) if images.chunks else None,
            compression=images.compression,
            compression_opts=images.compression_opts,
            filters=tuple(filters),
            offset=None if offset is None else int(offset),
        )

    def chunk_index(self) -> ChunkIndex:  # noqa: D102
        found: list[tuple[tuple[int, ...], int, int, int]] = []
        self.handle[IMAGES].id.chunk_iter(
            lambda info: found.append(
                (tuple(info.chunk_offset), info.byte_offset, info.size, info.filter_mask)
            )
        )
        ndim = len(self.handle[IMAGES].shape)
        rows = np.array([f[1:] for f in found], dtype=np.int64).reshape(-1, 3)
        positions = np.array([f[0] for f in found], dtype=np.int64).reshape(-1, ndim)
        return ChunkIndex(positions, rows[:, 0], rows[:, 1], rows[:, 2])

    def paths(self) -> Any:  # noqa: D102
        return self.handle[PATHS]

    def hdf5(self) -> h5py.File:  # noqa: D102
        return self.handle

    def close(self) -> None:  # noqa: D102
        if self.handle.id.valid:
            self.handle.close()
