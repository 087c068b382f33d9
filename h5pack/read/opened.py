"""Opening a pack for reading: its description, its metadata checked, its one byte path.

A URL's pack is described once from its compact index (NOTE [ Compact index ]), a local one
from HDF5, then opened with the chunk cache its metadata asks for; h5py's images dataset is
opened only when HDF5 must read (``StoredImages.h5_images``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack.core import format as fmt
from h5pack.core.description import PackIndex
from h5pack.core.integrity import PackIdentity
from h5pack.core.layout import cache_settings, chunk_map_of, group_bytes, is_compressed
from h5pack.core.source import LocalSource
from h5pack.core.store import Store
from h5pack.read.direct import chunk_table, contiguous_offset
from h5pack.read.options import ReaderOptions
from h5pack.read.planned import group_chunks, group_spans, planned_source
from h5pack.read.stored import StoredImages


@dataclass(eq=False)
class OpenPack:
    """A pack opened for reading (``compressed``: groups read whole into a window)."""

    index: PackIndex
    meta: fmt.PackMeta
    stored: StoredImages
    compressed: bool
    pieces: tuple[np.ndarray, np.ndarray] | None  # each group's pieces, for a planned source

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
    # the reader's window holds decompressed chunks: HDF5's cache needs one chunk at most
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
    h5_images = functools.cache(lambda: index.hdf5()[fmt.IMAGES])  # opened on first use
    table = contiguous = None
    if options.direct:
        with fmt.reading(path, "the images' dataset and chunk index"):
            table, contiguous = chunk_table(index), contiguous_offset(index)
    # remote: whole chunks, one request each
    compressed = compressed or remote
    identity = meta.identity
    source = index.source  # a URL's (core.remote)
    if source is None:  # refused when it names another file than the metadata's
        source = LocalSource(path, inode=(identity.device, identity.inode) if identity else None)
        if table is not None or contiguous is not None:  # now: a later descriptor could
            source.fd()  # name a replacing file
    chunk_map = chunk_map_of(meta)
    pieces = None
    # groups read whole go through the plan; runs of uncompressed local samples do not
    if compressed and (table is not None or contiguous is not None):
        if table is not None:
            offsets, sizes = table.offsets, table.sizes
        else:
            assert contiguous is not None
            begin, end = group_spans(chunk_map, meta, int(np.prod(meta.images_shape[1:])))
            offsets, sizes = contiguous + begin, end - begin
        pieces = group_chunks(chunk_map, meta, table.chunk_nbytes if table is not None else 0)
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
    return OpenPack(index, meta, stored, compressed, pieces)
