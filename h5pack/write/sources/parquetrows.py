"""Where a Parquet row's image lies, and how the converting process reads the rows.

NOTE [ Parquet runs ]: a row group's column is stored in compressed pages (most values in
one dictionary page), so a row group is read whole, never per image. A Parquet source's
write order is a seeded random interleaving of runs of consecutive row groups (as a gzip
tar's runs), each read front to back, so that chunks mix rows of every part of the files
while only each run's current group is held: ``runs_for`` gives as many runs as
``CACHE_BYTES`` holds, at most ``RUNS``. Its images are ``ParquetRow``s with
``in_parent``: the converting process reads them in write order (``ship``), each group
once, dropped after its last sample. A read out of that order (``verify --source``) reads
a group again if it was dropped.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from h5pack.core.store import Store
from h5pack.errors import DecodeError, H5PackError, SourceError, install_line
from h5pack.write.sources.base import FileRange, opened
from h5pack.write.sources.objects import ObjectFile

RUNS = 64
CACHE_BYTES = 2**30  # the row groups held at once, by their images' bytes

# This process's open files, row groups and image lengths (reset in a forked child).
_STATE: dict[str, Any] = {}


def pyarrow_parquet() -> Any:
    """Return ``pyarrow.parquet`` (SourceError saying how to install it)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise SourceError(
            f"Parquet sources are read with pyarrow: {install_line('parquet')}"
        ) from err
    return pq


@dataclass(frozen=True, slots=True)
class ParquetRow(FileRange):
    """One row's image of a Parquet file (NOTE [ Parquet runs ]).

    ``column`` is the image column (a struct of ``bytes`` and ``path``); ``name`` the file
    and row as messages name them; ``last``: the last sample of its group (its read drops it).
    """

    row_group: int = 0
    row: int = 0
    column: str = "image"
    name: str = ""
    last: bool = False
    in_parent: ClassVar[bool] = True

    def read(self) -> bytes:
        """Return the image's bytes (DecodeError: none, or the file cannot be read)."""
        data = _take(self)
        if not data:
            raise DecodeError(f"{self.name}: no image bytes in its {self.column!r} column")
        return bytes(data)

    def nbytes(self) -> int:
        """Return how many bytes ``read`` gives (0 for none), reading the row group once."""
        return int(lengths(self)[self.row])


def runs_for(group_bytes: int) -> int:
    """Return how many runs to interleave when the largest row group holds ``group_bytes``."""
    return max(1, min(RUNS, CACHE_BYTES // max(1, group_bytes)))


def _take(image: ParquetRow) -> Any:
    """Return a row's image bytes (None when null), reading its row group if not held."""
    groups: OrderedDict[tuple[str, int, str], Any] = _state()["groups"]
    key = (image.path, image.row_group, image.column)
    images = groups.pop(key, None)
    if images is None:
        images = _read(image)
    if not image.last:  # the group's last sample drops it
        _hold(key, images)
    return images[image.row].as_py()


def _hold(key: tuple[str, int, str], images: Any) -> None:
    """Keep a row group's images, dropping the least recently used past ``CACHE_BYTES``."""
    groups: OrderedDict[tuple[str, int, str], Any] = _state()["groups"]
    groups[key] = images
    while len(groups) > 1 and sum(g.nbytes for g in groups.values()) > CACHE_BYTES:
        groups.popitem(last=False)


def _read(image: ParquetRow) -> Any:
    """Return the image bytes of a row's group (a pyarrow binary array)."""
    try:
        table = _open(image.path, image.store).read_row_group(
            image.row_group, columns=[f"{image.column}.bytes"], use_threads=False
        )
    except (OSError, ValueError, H5PackError) as err:  # pyarrow's ArrowIOError, ArrowInvalid
        message = f"{image.name or image.path}: cannot read row group {image.row_group}: {err}"
        raise DecodeError(message) from err
    return table.column(0).combine_chunks().flatten()[0]


def _state() -> dict[str, Any]:
    if _STATE.get("pid") != os.getpid():
        _STATE.clear()
        _STATE.update(pid=os.getpid(), files={}, groups=OrderedDict(), lengths={})
    return _STATE


def parquet_file(path: str, store: Store | None) -> Any:
    """Return a ``ParquetFile`` of a local file (mapped), or of an object read in exact ranges."""
    if store is None:
        return pyarrow_parquet().ParquetFile(path, memory_map=True)
    return pyarrow_parquet().ParquetFile(ObjectFile(opened(store, path), readahead=0))


def _open(path: str, store: Store | None) -> Any:
    files: dict[str, Any] = _state()["files"]
    if path not in files:
        files[path] = parquet_file(path, store)
    return files[path]


def lengths(image: ParquetRow) -> np.ndarray:
    """Return the byte length of each row's image in ``image``'s row group (0 where none)."""
    import pyarrow.compute as pc

    found: dict[tuple[str, int, str], np.ndarray] = _state()["lengths"]
    key = (image.path, image.row_group, image.column)
    if key not in found:
        images = _state()["groups"].get(key)
        if images is None:  # kept: the rows are read next (a remote group is not fetched twice)
            images = _read(image)
            _hold(key, images)
        found[key] = pc.binary_length(images).fill_null(0).to_numpy().astype(np.int64)
    return found[key]
