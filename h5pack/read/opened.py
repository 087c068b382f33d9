"""Opening a pack for reading: its description, its metadata checked, its one byte path.

A URL's pack is described once (its compact index: 1-2 requests, NOTE [ Compact index ]); a
local one is described from HDF5 (``core.description``), then opened again with the chunk
cache its metadata asks for. The images' chunk index comes from the description; h5py's
images dataset is opened only when HDF5 must read (``StoredImages.h5_images``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from h5pack.core import format as fmt
from h5pack.core.description import PackIndex
from h5pack.core.integrity import PackIdentity
from h5pack.core.layout import cache_settings, chunk_map_of, group_bytes, is_compressed
from h5pack.core.source import LocalSource
from h5pack.core.store import Store
from h5pack.errors import FormatError
from h5pack.read.direct import chunk_table, contiguous_offset
from h5pack.read.options import ReaderOptions
from h5pack.read.planned import group_chunks, group_pieces, planned_source
from h5pack.read.stored import StoredImages
from h5pack.read.virtual import check_virtual_sources, open_virtual


@dataclass(eq=False)
class OpenPack:
    """A pack opened for reading."""

    index: PackIndex
    meta: fmt.PackMeta
    stored: StoredImages
    compressed: bool
    virtual: bool
    pieces: tuple[np.ndarray, np.ndarray] | None

    def close(self) -> None:
        """Close the byte source and the description."""
        self.stored.source.close()
        self.index.close()


def open_pack(
    path: str,
    options: ReaderOptions,
    store: Store,
    *,
    expected: PackIdentity | None = None,
    meta: fmt.PackMeta | None = None,
) -> OpenPack:
    """Open the pack ``path`` (see ``PackReader``, whose arguments these are)."""
    opened: PackIndex | None = None
    if store.remote:
        opened = fmt.open_index(path, store=store)
        try:
            found = fmt.read_meta(opened, path)
        except BaseException:
            opened.close()
            raise
        fmt.check_identity(path, meta.identity if meta else None, found.identity)
        meta = meta or found
    elif meta is None:
        with fmt.open_index(path, locking=options.locking) as probe:
            meta = fmt.read_meta(probe)
    fmt.check_identity(path, expected, meta.identity)
    compressed = is_compressed(meta)
    # The reader's window holds decompressed chunks, so HDF5's own cache needs one chunk at
    # most (none for uncompressed data, see layout.cache_settings).
    settings: dict[str, Any] = cache_settings(
        compressed=compressed, window_chunks=1, chunk_bytes=group_bytes(meta)
    )
    index = opened or fmt.open_index(path, locking=options.locking, **settings)
    try:
        return _open_images(path, index, meta, options, compressed, store.remote)
    except BaseException:
        index.close()
        raise


def _open_images(
    path: str,
    index: PackIndex,
    meta: fmt.PackMeta,
    options: ReaderOptions,
    compressed: bool,
    remote: bool,
) -> OpenPack:
    # the same file as the metadata's (the path may have been replaced meanwhile)
    fmt.check_identity(path, meta.identity, fmt.identity_of(index, path))
    with fmt.reading(path, "the images' dataset and chunk index"):
        virtual = index.images().virtual
    images: list[h5py.Dataset] = []  # h5py's images dataset, once opened

    def h5_images() -> h5py.Dataset:
        if not images:
            images.append(index.hdf5()[fmt.IMAGES])
        return images[0]

    table = contiguous = None
    if virtual:  # NOTE [ Virtual packs ] (write/merge.py): sources checked, h5py reads
        if remote:
            raise FormatError(
                f"{path} is a virtual pack (h5pack merge --virtual), whose sources HDF5 "
                "opens by local path; merge without --virtual to read it from a bucket"
            )
        handle = index.hdf5()
        num_sources, chunk_bytes = check_virtual_sources(handle, handle[fmt.IMAGES], path, meta)
        with fmt.reading(path, "the images' virtual dataset"):
            images.append(open_virtual(handle, num_sources, chunk_bytes))
    elif options.direct:
        with fmt.reading(path, "the images' dataset and chunk index"):
            table, contiguous = chunk_table(index), contiguous_offset(index)
    # a remote pack reads whole chunks, one request each (never one per sample); a virtual
    # one whole groups, as one HDF5 read per sample intersects its mappings each time
    compressed = compressed or virtual or remote
    identity = meta.identity
    source = index.source  # a URL's (core.remote)
    if source is None:  # refused when it names another file than the metadata's
        source = LocalSource(path, inode=(identity.device, identity.inode) if identity else None)
        if table is not None or contiguous is not None:  # now: a later descriptor could
            source.fd()  # name a replacing file
    chunk_map = chunk_map_of(meta)
    pieces = None  # group -> pieces
    # Groups read whole (compressed, or any remote pack) go through the plan; a local
    # uncompressed pack reads runs of samples, which no plan describes.
    if compressed and (table is not None or contiguous is not None):
        if table is not None:
            offsets, sizes = table.offsets, table.sizes
            pieces = group_chunks(chunk_map, meta, table.chunk_nbytes)
        else:
            assert contiguous is not None
            offsets, sizes, pieces = group_pieces(
                chunk_map, meta, contiguous, int(np.prod(meta.images_shape[1:]))
            )
        source = planned_source(
            source,
            offsets,
            sizes,
            pack_id=meta.pack_id,
            read_ahead=options.read_ahead,
            disk_cache=options.disk_cache,
            reader_checks=remote and options.verify_checksums,
        )
    stored = StoredImages(
        meta, chunk_map, table=table, contiguous=contiguous, source=source, images=h5_images
    )
    return OpenPack(index, meta, stored, compressed, virtual, pieces)
