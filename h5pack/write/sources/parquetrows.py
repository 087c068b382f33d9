"""Where a Parquet row's image lies, and the reads of its row group in each process.

NOTE [ Parquet row groups ]: a Parquet file is read by row group (a column of a row group
is compressed as a whole), so an image is named by ``(file, row group, row)``: a
``ParquetRow``, picklable and small like a ``FileRange``. Each process (a worker, or the
parent for planning) reads the image column of a row group once into a small cache
(``CACHE_BYTES``, at least one group), and takes its rows from there. So that a worker
meets each group in one stretch, the write order of a Parquet source keeps each row group
in one window of a few groups (``ParquetSource.split``): the groups shuffled, then the
samples of each window (``WINDOW_BYTES`` of images) shuffled among themselves.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack.errors import DecodeError, SourceError, install_line
from h5pack.write.sources.base import FileRange

WINDOW_BYTES = 64 * 2**20
CACHE_BYTES = 2 * WINDOW_BYTES

# This process's open files, image columns and image lengths (reset in a forked child).
_STATE: dict[str, Any] = {}


def pyarrow_parquet() -> Any:
    """Return ``pyarrow.parquet``, or say how to install it.

    Raises:
        SourceError: pyarrow is not installed.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise SourceError(
            f"Parquet sources are read with pyarrow: {install_line('parquet')}"
        ) from err
    return pq


@dataclass(frozen=True, slots=True)
class ParquetRow(FileRange):
    """One row's image of a Parquet file (NOTE [ Parquet row groups ]).

    Attributes:
        path: The Parquet file (absolute).
        row_group: Its row group.
        row: The row within the group.
        column: The image column (a struct of ``bytes`` and ``path``).
        name: The file and row as messages name them (``train-00000.parquet, row 12``).
    """

    row_group: int = 0
    row: int = 0
    column: str = "image"
    name: str = ""

    def read(self) -> bytes:
        """Return the image's bytes.

        Raises:
            DecodeError: The row has no image bytes, or the file cannot be read.
        """
        data = _images(self.path, self.row_group, self.column, self.name)[self.row].as_py()
        if not data:
            raise DecodeError(f"{self.name}: no image bytes in its {self.column!r} column")
        return bytes(data)

    def nbytes(self) -> int:
        """Return how many bytes ``read`` gives (0 for none), reading the row group once."""
        return int(lengths(self.path, self.row_group, self.column, self.name)[self.row])


def _state() -> dict[str, Any]:
    if _STATE.get("pid") != os.getpid():
        _STATE.clear()
        _STATE.update(pid=os.getpid(), files={}, groups=OrderedDict(), lengths={})
    return _STATE


def _open(path: str) -> Any:
    files: dict[str, Any] = _state()["files"]
    if path not in files:
        files[path] = pyarrow_parquet().ParquetFile(path)
    return files[path]


def _images(path: str, row_group: int, column: str, name: str) -> Any:
    """Return the image bytes of a row group (a pyarrow binary array), through the cache."""
    groups: OrderedDict[tuple[str, int, str], Any] = _state()["groups"]
    key = (path, row_group, column)
    if key in groups:
        groups.move_to_end(key)
        return groups[key]
    groups[key] = images = _read(path, row_group, column, name)
    while len(groups) > 1 and sum(g.nbytes for g in groups.values()) > CACHE_BYTES:
        groups.popitem(last=False)
    return images


def _read(path: str, row_group: int, column: str, name: str) -> Any:
    try:
        table = _open(path).read_row_group(row_group, columns=[f"{column}.bytes"])
        return table.column(0).combine_chunks().flatten()[0]
    except (OSError, ValueError) as err:  # pyarrow's ArrowIOError and ArrowInvalid
        raise DecodeError(f"{name}: cannot read row group {row_group}: {err}") from err


def lengths(path: str, row_group: int, column: str, name: str = "") -> np.ndarray:
    """Return the byte length of each row's image in a row group (0 where none).

    Read once per process and kept (8 bytes a row); the images read are not kept, so
    planning in the parent holds one row group at a time.
    """
    import pyarrow.compute as pc

    found: dict[tuple[str, int, str], np.ndarray] = _state()["lengths"]
    key = (path, row_group, column)
    if key not in found:
        images = _state()["groups"].get(key)
        if images is None:
            images = _read(path, row_group, column, name or path)
        found[key] = pc.binary_length(images).fill_null(0).to_numpy().astype(np.int64)
    return found[key]
