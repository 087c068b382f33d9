"""Virtual packs (``h5pack merge --virtual``, NOTE [ Virtual packs ] in write/merge.py).

A virtual pack's sources are checked before HDF5 reads them (it serves zeros for a source it
cannot open); it is read through h5py only, its groups whole into the reader's window.
"""

from __future__ import annotations

import json
import os
from typing import Any

import h5py
import numpy as np

from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.layout import next_prime
from h5pack.core.packset import meta_digest
from h5pack.errors import FormatError, H5PackError

VIRTUAL_SOURCES_KEY = fmt.VIRTUAL_SOURCES_KEY


# Decompressed source chunks that a virtual pack's sources may keep in HDF5's chunk
# caches, over all sources (each source keeps its own cache).
VIRTUAL_CACHE_BYTES = 2 * 2**30


def check_virtual_sources(
    handle: h5py.File, images: h5py.Dataset, path: str, meta: fmt.PackMeta
) -> tuple[int, int]:
    """Raise ``FormatError`` unless every source of a virtual pack is there and unchanged."""
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
    """Return what is wrong with one source of a virtual pack ("" when nothing)."""
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


def open_virtual(handle: h5py.File, num_sources: int, chunk_bytes: int) -> h5py.Dataset:
    """Open a virtual pack's images with a chunk cache for its compressed sources."""
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    if chunk_bytes:
        nbytes = max(chunk_bytes, min(2 * chunk_bytes, VIRTUAL_CACHE_BYTES // num_sources))
        dapl.set_chunk_cache(next_prime(200), int(nbytes * 1.05) + 2**20, 1.0)
    return h5py.Dataset(h5py.h5d.open(handle.id, fmt.IMAGES.encode(), dapl=dapl))
