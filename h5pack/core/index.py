"""The compact index at a pack's end: what a remote reader needs to open it in one or two GETs.

# NOTE [ Compact index ]
# h5py over a file object walks HDF5's metadata in many small serial reads, a round trip
# each on a bucket. So a published pack ends with a compact index after HDF5's end of
# file (docs/format.md): attributes, shapes, the images' chunk index and the per-sample
# arrays, the paths apart, and a footer with both sections' CRC32s. A reader GETs the last
# ``TAIL_BYTES`` and, only if the main section starts before them, one more range.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from h5pack.core.description import ChunkIndex, HDF5Index, ImagesLayout, PackIndex
from h5pack.core.names import DAMAGED, IMAGES, PATHS
from h5pack.core.source import ByteSource
from h5pack.errors import FormatError

MAGIC = b"H5PKIX01"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # packs have no user block: it is at byte 0
_FOOTER = struct.Struct("<8sQQQQII")
FOOTER_BYTES = _FOOTER.size
TAIL_BYTES = 256 * 1024  # footer and main section of packs up to ~4,000 samples at once
INDEX_VERSION = 1


class Footer(NamedTuple):
    """Where the index's sections lie in the file."""

    main_offset: int
    main_length: int
    paths_offset: int
    paths_length: int
    main_crc: int
    paths_crc: int


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b": value.decode("utf-8", "surrogateescape")}
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _unjson(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"b"}:
        return str(value["b"]).encode("utf-8", "surrogateescape")
    if isinstance(value, list):
        return tuple(_unjson(v) for v in value)
    return value


def _element_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8", "surrogateescape")
    return bytes(np.asarray(item, dtype=np.uint8))  # 1.0's variable-length uint8 paths


def build_index(index: PackIndex, file_bytes: int) -> bytes:
    """Return the compact index of the pack ``index`` describes."""
    images = index.images()
    arrays: list[bytes] = []
    where = 0

    def add(array: np.ndarray) -> dict[str, Any]:
        nonlocal where
        little = array.dtype.newbyteorder("<")
        data = np.ascontiguousarray(array).astype(little).tobytes()
        arrays.append(data)
        where += len(data)
        shape = list(array.shape)
        return {"at": where - len(data), "nbytes": len(data), "dtype": little.str, "shape": shape}

    described: dict[str, Any] = {
        "shape": list(images.shape),
        "dtype": images.dtype.str,
        "chunks": list(images.chunks) if images.chunks else None,
        "compression": _jsonable(images.compression),
        "compression_opts": _jsonable(images.compression_opts),
        "filters": [[f, 0, list(values), ""] for f, values in images.filters],
        "offset": images.offset,
    }
    if images.chunks is not None:
        chunks = index.chunk_index()
        described["chunk_offsets"] = add(chunks.positions)
        described["chunk_index"] = add(np.stack([chunks.offsets, chunks.sizes, chunks.masks], 1))
    datasets: dict[str, Any] = {IMAGES: described}
    paths: list[bytes] = []
    for name in index.names():
        if name == IMAGES:
            continue
        if "/" in name:  # a field's dataset (/fields, core.fields): listed, read from HDF5
            field = index.hdf5()[name]
            datasets[name] = {"shape": list(field.shape), "dtype": field.dtype.str, "hdf5": True}
            datasets[name]["chunks"] = list(field.chunks) if field.chunks else None
            continue
        value = index.array(name)
        entry: dict[str, Any] = {"shape": list(value.shape), "dtype": value.dtype.str}
        if name == PATHS:
            paths = [_element_bytes(p) for p in value]
        elif value.dtype.kind in "biuf":
            entry["array"] = add(value)
        else:
            entry["strings"] = [_jsonable(_element_bytes(v)) for v in value]
        datasets[name] = entry
    header = {
        "version": INDEX_VERSION,
        "file_bytes": file_bytes,
        "attrs": {key: _jsonable(index.attrs[key]) for key in index.attrs},
        "datasets": datasets,
    }
    text = json.dumps(header).encode()
    main = struct.pack("<I", len(text)) + text + b"".join(arrays)
    lengths = np.array([len(p) for p in paths], dtype="<u4").tobytes()
    section = lengths + b"".join(paths)
    places = (file_bytes + len(section), len(main), file_bytes, len(section))
    footer = _FOOTER.pack(MAGIC, *places, zlib.crc32(main), zlib.crc32(section))
    return section + main + footer


def append_index(path: Path) -> bool:
    """Append the compact index to the pack ``path`` (unless there); return whether it has one."""
    with open(path, "rb") as raw:
        if raw.read(8) != HDF5_SIGNATURE:
            return False
        size = raw.seek(0, 2)
        if size >= FOOTER_BYTES:
            raw.seek(size - FOOTER_BYTES)
            if raw.read(8) == MAGIC:
                return True
    import hdf5plugin  # noqa: F401  (the plugins' filter ids in the pipeline)

    with HDF5Index(h5py.File(path, "r", locking=False), str(path)) as index:
        found = build_index(index, size)
    with open(path, "ab") as raw:
        raw.write(found)
    return True


def parse_footer(tail: bytes | memoryview) -> Footer | None:
    """Return the footer at the end of ``tail``, or None when the pack has no index."""
    if len(tail) < FOOTER_BYTES:
        return None
    magic, *fields = _FOOTER.unpack(bytes(tail[-FOOTER_BYTES:]))
    return Footer(*fields) if magic == MAGIC else None


class UnknownIndexError(Exception):
    """An index of a version this h5pack does not know: the pack is read through HDF5."""


class CompactIndex(PackIndex):
    """A pack described by its compact index (NOTE [ Compact index ]).

    ``opener`` opens it with HDF5 when first needed; ``paths``: the paths section, if held.
    """

    def __init__(
        self,
        source: ByteSource,
        footer: Footer,
        main: bytes | memoryview,
        opener: Callable[[], h5py.File],
        paths: bytes | memoryview | None = None,
    ) -> None:
        self.source = self._source = source
        self.footer, self.path = footer, source.url
        if zlib.crc32(main) != footer.main_crc:
            raise FormatError(
                f"{source.url}: its compact index does not match its CRC32; {DAMAGED}"
            )
        (length,) = struct.unpack_from("<I", main, 0)
        try:
            self.header = json.loads(bytes(main[4 : 4 + length]))
        except ValueError as err:
            raise FormatError(f"{source.url}: its compact index cannot be read ({err})") from err
        if self.header.get("version") != INDEX_VERSION:
            raise UnknownIndexError(self.header.get("version"))
        self._arrays = memoryview(main)[4 + length :]
        self._opener = opener
        self._h5: h5py.File | None = None
        self._paths_bytes = paths
        self._paths: np.ndarray | None = None
        self._attrs = {key: _unjson(value) for key, value in self.header["attrs"].items()}
        self._datasets: dict[str, dict[str, Any]] = self.header["datasets"]

    @property
    def attrs(self) -> Mapping[str, Any]:  # noqa: D102
        return self._attrs

    def _stored(self, entry: dict[str, Any]) -> np.ndarray:
        at, nbytes = int(entry["at"]), int(entry["nbytes"])
        data = np.frombuffer(self._arrays[at : at + nbytes], dtype=np.dtype(entry["dtype"]))
        return data.reshape(tuple(entry["shape"])).copy()

    def names(self) -> list[str]:  # noqa: D102
        return list(self._datasets)

    def shape(self, name: str) -> tuple[int, ...]:  # noqa: D102
        return tuple(int(s) for s in self._datasets[name]["shape"])

    def array(self, name: str) -> np.ndarray:  # noqa: D102
        if name == PATHS:
            return self.paths()
        entry = self._datasets[name]
        if "array" in entry:
            return self._stored(entry["array"])
        if "hdf5" in entry:  # a field's dataset: its data only in HDF5's file
            return np.asarray(self.hdf5()[name][()])
        found = np.empty(len(entry["strings"]), dtype=object)
        found[:] = [_unjson(s) for s in entry["strings"]]
        return found

    def images(self) -> ImagesLayout:  # noqa: D102
        entry = self._datasets[IMAGES]
        chunks, offset = entry.get("chunks"), entry.get("offset")
        return ImagesLayout(
            shape=tuple(int(s) for s in entry["shape"]),
            dtype=np.dtype(entry["dtype"]),
            chunks=tuple(int(c) for c in chunks) if chunks else None,
            compression=_unjson(entry.get("compression")),
            compression_opts=_unjson(entry.get("compression_opts")),
            filters=tuple((int(f[0]), tuple(int(v) for v in f[2])) for f in entry["filters"]),
            offset=None if offset is None else int(offset),
        )

    def chunk_index(self) -> ChunkIndex:  # noqa: D102
        entry = self._datasets[IMAGES]
        rows = self._stored(entry["chunk_index"]).reshape(-1, 3)
        return ChunkIndex(self._stored(entry["chunk_offsets"]), rows[:, 0], rows[:, 1], rows[:, 2])

    def paths(self) -> np.ndarray:
        """Return every path's bytes (one GET, unless the open's reads held them)."""
        if self._paths is not None:
            return self._paths
        if self._paths_bytes is None:
            offset, length = self.footer.paths_offset, self.footer.paths_length
            self._paths_bytes = self._source.read(offset, offset + length) if length else b""
        data = self._paths_bytes
        if zlib.crc32(data) != self.footer.paths_crc:
            raise FormatError(
                f"{self.path}: the paths of its compact index do not match their CRC32; {DAMAGED}"
            )
        count = self.shape(PATHS)[0]
        lengths = np.frombuffer(data[: 4 * count], dtype="<u4")
        ends = 4 * count + np.cumsum(lengths, dtype=np.int64)
        starts, raw = ends - lengths, bytes(data)
        found = np.empty(count, dtype=object)
        found[:] = [raw[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        self._paths = found
        return found

    def hdf5(self) -> h5py.File:  # noqa: D102
        if self._h5 is None:
            self._h5 = self._opener()
        return self._h5

    def hdf5_index(self) -> HDF5Index:
        """Return HDF5's own description of the same pack (``verify`` compares the two)."""
        return HDF5Index(self.hdf5(), self.path, self.source)

    def close(self) -> None:  # noqa: D102
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None
