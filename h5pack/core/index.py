"""The compact index at a pack's end: what a remote reader needs to open it in one or two GETs.

NOTE [ Compact index ]

h5py over a file object walks HDF5's metadata in many small serial reads (about six per
open plus one per metadata block), which costs a round trip each on a bucket. So when a
pack is published (``write.publish``), everything a reader needs at open is copied from
HDF5's metadata into one compact index appended after HDF5's end of file (HDF5 ignores
bytes past its end-of-allocation; every local reader keeps reading the file through HDF5
exactly as before)::

    [HDF5 file][paths section][main section][footer, FOOTER_BYTES]

- main section: ``uint32 LE`` length of a JSON header, the header (root attributes; each
  dataset's shape and dtype; the images' chunks, filters and either their chunk index or
  their contiguous offset; where each array lies), then the arrays' bytes (labels, shapes,
  checksums, source_index, offsets, sizes, sample_xxh3 and the chunk index; little-endian).
- paths section: every ``/paths`` entry's length (``uint32 LE``) then their bytes; read
  only when the paths are (messages, ``info``), so an open does not pay for them.
- footer: ``MAGIC``, then (``uint64 LE``) the main section's offset and length, the paths
  section's offset and length, then the CRC32 of each section (``uint32 LE``).

A reader GETs the last ``TAIL_BYTES`` with one suffix range request (which needs neither
the size nor a HEAD first: the answer carries both and the ETag), finds the footer, and
only if the main section starts before the tail issues one more ranged GET: at most two
requests to open, whatever the number of samples. ``IndexFile`` serves the index through
the few h5py calls ``format.read_meta``, ``format.read_paths`` and ``read.direct``'s
``chunk_table`` make, so the remote metadata is validated by the very code that validates
it locally (digests, shapes, labels); anything else (a fallback read of data through
HDF5) is delegated to h5py over a read-ahead file object, opened on first use. A pack
without a footer (written before the index) is read by h5py over that file object from
the start: slower, never different. The sections carry CRC32s: a damaged index is refused,
never trusted.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from h5pack.core.source import ByteSource
from h5pack.errors import FormatError

MAGIC = b"H5PKIX01"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # packs have no user block: it is at byte 0
_FOOTER = struct.Struct("<8sQQQQII")
FOOTER_BYTES = _FOOTER.size
# The suffix read at open: footer and main section of packs up to ~4,000 samples at once.
TAIL_BYTES = 256 * 1024
INDEX_VERSION = 1
IMAGES = "images"  # format.IMAGES (imported there from here would be a cycle)
PATHS = "paths"


class Footer(NamedTuple):
    """Where the index's sections lie in the file."""

    main_offset: int
    main_length: int
    paths_offset: int
    paths_length: int
    main_crc: int
    paths_crc: int


# -- writing ---------------------------------------------------------------------------------
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


def build_index(handle: h5py.File, file_bytes: int) -> bytes | None:
    """Return the index of the open pack ``handle`` (``file_bytes`` long), or None.

    None for a pack the index does not describe: a virtual one (``merge --virtual``).
    """
    images = handle[IMAGES]
    if images.is_virtual:
        return None
    arrays: list[bytes] = []
    where = 0

    def add(array: np.ndarray) -> dict[str, Any]:
        nonlocal where
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        entry = {"at": where, "nbytes": len(data), "dtype": array.dtype.newbyteorder("<").str}
        entry["shape"] = list(array.shape)
        arrays.append(data)
        where += len(data)
        return entry

    plist = images.id.get_create_plist()
    filters = []
    for i in range(plist.get_nfilters()):
        filter_id, flags, values, name = plist.get_filter(i)
        filters.append([int(filter_id), int(flags), [int(v) for v in values], _jsonable(name)])
    described: dict[str, Any] = {
        "shape": list(images.shape),
        "dtype": images.dtype.str,
        "chunks": list(images.chunks) if images.chunks else None,
        "compression": _jsonable(images.compression),
        "compression_opts": _jsonable(images.compression_opts),
        "filters": filters,
        "offset": None,
    }
    if images.chunks is None:
        offset = images.id.get_offset()
        described["offset"] = None if offset is None else int(offset)
    else:
        found: list[tuple[tuple[int, ...], int, int, int]] = []
        images.id.chunk_iter(
            lambda info: found.append(
                (tuple(info.chunk_offset), info.byte_offset, info.size, info.filter_mask)
            )
        )
        described["chunk_offsets"] = add(np.array([f[0] for f in found], dtype=np.int64))
        described["chunk_index"] = add(np.array([f[1:] for f in found], dtype=np.int64))
    datasets: dict[str, Any] = {IMAGES: described}
    paths: list[bytes] = []
    for name in handle:
        if name == IMAGES:
            continue
        dataset = handle[name]
        if isinstance(dataset, h5py.Group):  # /fields (core.fields): listed, read from HDF5
            for child in dataset:
                found_field = dataset[child]
                datasets[f"{name}/{child}"] = {
                    "shape": list(found_field.shape),
                    "dtype": found_field.dtype.str,
                    "chunks": list(found_field.chunks) if found_field.chunks else None,
                    "hdf5": True,
                }
            continue
        entry: dict[str, Any] = {"shape": list(dataset.shape), "dtype": dataset.dtype.str}
        if name == PATHS:
            paths = [_element_bytes(p) for p in dataset[()]]
        elif dataset.dtype.kind in "biuf":
            entry["array"] = add(dataset[()])
        else:
            entry["strings"] = [_jsonable(_element_bytes(v)) for v in dataset[()]]
        datasets[name] = entry
    header = {
        "version": INDEX_VERSION,
        "file_bytes": file_bytes,
        "attrs": {key: _jsonable(handle.attrs[key]) for key in handle.attrs},
        "datasets": datasets,
    }
    text = json.dumps(header).encode()
    main = struct.pack("<I", len(text)) + text + b"".join(arrays)
    lengths = np.array([len(p) for p in paths], dtype="<u4").tobytes()
    paths_section = lengths + b"".join(paths)
    paths_offset, main_offset = file_bytes, file_bytes + len(paths_section)
    footer = _FOOTER.pack(
        MAGIC,
        main_offset,
        len(main),
        paths_offset,
        len(paths_section),
        zlib.crc32(main),
        zlib.crc32(paths_section),
    )
    return paths_section + main + footer


def append_index(path: Path) -> bool:
    """Append the compact index to the finished pack ``path``; return whether it has one.

    For a pack that already ends with one, or a file that is no HDF5 file, nothing is done.
    """
    with open(path, "rb") as raw:
        if raw.read(8) != HDF5_SIGNATURE:
            return False  # not an HDF5 file: nothing to index
        raw.seek(0, 2)
        size = raw.tell()
        if size >= FOOTER_BYTES:
            raw.seek(size - FOOTER_BYTES)
            if raw.read(8) == MAGIC:
                return True
    import hdf5plugin  # noqa: F401  (the plugins' filter ids in the pipeline)

    with h5py.File(path, "r", locking=False) as handle:
        index = build_index(handle, size)
    if index is None:
        return False
    with open(path, "ab") as raw:
        raw.write(index)
    return True


# -- reading ---------------------------------------------------------------------------------
def parse_footer(tail: bytes | memoryview, url: str) -> Footer | None:
    """Return the footer at the end of ``tail``, or None when the pack has no index."""
    if len(tail) < FOOTER_BYTES:
        return None
    magic, *fields = _FOOTER.unpack(bytes(tail[-FOOTER_BYTES:]))
    if magic != MAGIC:
        return None
    return Footer(*fields)


class UnknownIndexError(Exception):
    """An index of a version this h5pack does not know: the pack is read through HDF5."""


class _ChunkInfo(NamedTuple):
    chunk_offset: tuple[int, ...]
    byte_offset: int
    size: int
    filter_mask: int


class _Plist:
    def __init__(self, filters: list[list[Any]]) -> None:
        self._filters = filters

    def get_nfilters(self) -> int:
        return len(self._filters)

    def get_filter(self, i: int) -> tuple[int, int, tuple[int, ...], bytes]:
        filter_id, flags, values, name = self._filters[i]
        found = _unjson(name)
        return int(filter_id), int(flags), tuple(values), found if isinstance(found, bytes) else b""


class _DatasetId:
    def __init__(self, dataset: IndexDataset) -> None:
        self._dataset = dataset

    def get_create_plist(self) -> _Plist:
        return _Plist(self._dataset.entry.get("filters", []))

    def get_offset(self) -> int | None:
        offset = self._dataset.entry.get("offset")
        return None if offset is None else int(offset)

    def get_num_chunks(self) -> int:
        """Return the number of stored chunks."""
        return int(self._dataset.entry["chunk_index"]["shape"][0]) if self._dataset.chunks else 0

    def get_storage_size(self) -> int:
        """Return the stored bytes of the dataset (its chunks', or the contiguous run's)."""
        if not self._dataset.chunks:
            return int(np.prod(self._dataset.shape)) * int(self._dataset.dtype.itemsize)
        index = self._dataset.file.array(self._dataset.entry["chunk_index"])
        return int(index[:, 1].sum()) if index.size else 0

    def chunk_iter(self, visit: Callable[[_ChunkInfo], None]) -> None:
        offsets = self._dataset.file.array(self._dataset.entry["chunk_offsets"])
        index = self._dataset.file.array(self._dataset.entry["chunk_index"])
        for where, (byte_offset, size, mask) in zip(offsets, index, strict=True):
            visit(_ChunkInfo(tuple(int(o) for o in where), int(byte_offset), int(size), int(mask)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dataset.h5().id, name)


class IndexDataset:
    """One dataset as the index describes it; data reads go to h5py (opened on first use)."""

    def __init__(self, file: IndexFile, name: str, entry: dict[str, Any]) -> None:
        self.file, self.name, self.entry = file, name, entry
        self.shape = tuple(int(s) for s in entry["shape"])
        self.dtype = np.dtype(entry["dtype"])
        chunks = entry.get("chunks")
        self.chunks = tuple(int(c) for c in chunks) if chunks else None
        self.compression = _unjson(entry.get("compression"))
        self.compression_opts = _unjson(entry.get("compression_opts"))
        self.is_virtual = False
        self.id = _DatasetId(self)

    def h5(self) -> h5py.Dataset:
        """Return the real dataset (h5py over the read-ahead file object)."""
        return self.file.h5()[self.name]

    def value(self) -> np.ndarray:
        """Return the whole dataset from the index (no request but for the paths)."""
        if self.name == PATHS:
            return self.file.paths()
        if "array" in self.entry:
            return self.file.array(self.entry["array"])
        if "strings" in self.entry:
            found = np.empty(len(self.entry["strings"]), dtype=object)
            found[:] = [_unjson(s) for s in self.entry["strings"]]
            return found
        return np.asarray(self.h5()[()])

    def __getitem__(self, key: Any) -> Any:
        if self.name == IMAGES or "hdf5" in self.entry:
            return self.h5()[key]
        return self.value()[key] if key != () else self.value()

    def read_direct(self, *args: Any, **kwargs: Any) -> None:
        """Read through h5py (the fallback path of data the direct path does not read)."""
        self.h5().read_direct(*args, **kwargs)

    def virtual_sources(self) -> list[Any]:
        """None: the index describes no virtual dataset."""
        return []


class IndexFile:
    """A pack's HDF5 metadata served from its compact index (NOTE [ Compact index ]).

    Quacks like the read-only ``h5py.File`` that ``format.read_meta``, ``read_paths`` and
    ``chunk_table`` expect; ``h5()`` opens the real file (h5py over a read-ahead file object
    on the source) for anything else.

    Args:
        source: The pack's bytes.
        footer: Where the index lies.
        main: The main section's bytes.
        opener: Returns the real file when first needed.
        paths: The paths section, when the open's reads already hold it.
    """

    def __init__(
        self,
        source: ByteSource,
        footer: Footer,
        main: bytes | memoryview,
        opener: Callable[[], h5py.File],
        paths: bytes | memoryview | None = None,
    ) -> None:
        self.source, self.footer, self.filename = source, footer, source.url
        self.source_identity: object = None  # a remote source's (set by core.remote)
        if zlib.crc32(main) != footer.main_crc:
            raise FormatError(
                f"{source.url}: its compact index does not match its CRC32; the pack is "
                "damaged: re-create it, or restore it from a copy"
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
        self.attrs = {key: _unjson(value) for key, value in self.header["attrs"].items()}
        self._datasets = {
            name: IndexDataset(self, name, entry) for name, entry in self.header["datasets"].items()
        }
        self.id = self  # ``identity_of`` asks for a descriptor: there is none

    def get_vfd_handle(self) -> int:
        """Raise: no descriptor (``format.identity_of`` then asks ``source_identity``)."""
        raise TypeError("a remote pack has no file descriptor")

    @property
    def valid(self) -> bool:
        """Whether the file is open (h5py's ``id.valid``)."""
        return True

    def array(self, entry: dict[str, Any]) -> np.ndarray:
        """Return one array of the main section."""
        at, nbytes = int(entry["at"]), int(entry["nbytes"])
        data = np.frombuffer(self._arrays[at : at + nbytes], dtype=np.dtype(entry["dtype"]))
        return data.reshape(tuple(entry["shape"])).copy()

    def paths(self) -> np.ndarray:
        """Return every path's bytes (one GET, unless the open's reads held them)."""
        if self._paths is None:
            self._paths = self._read_paths()
        return self._paths

    def _read_paths(self) -> np.ndarray:
        if self._paths_bytes is None:
            offset, length = self.footer.paths_offset, self.footer.paths_length
            self._paths_bytes = self.source.read(offset, offset + length) if length else b""
        data = self._paths_bytes
        if zlib.crc32(data) != self.footer.paths_crc:
            raise FormatError(
                f"{self.filename}: the paths of its compact index do not match their CRC32; "
                "the pack is damaged: re-create it, or restore it from a copy"
            )
        count = int(self.header["datasets"][PATHS]["shape"][0])
        lengths = np.frombuffer(data[: 4 * count], dtype="<u4")
        ends = 4 * count + np.cumsum(lengths, dtype=np.int64)
        starts = ends - lengths
        found = np.empty(count, dtype=object)
        raw = bytes(data)
        found[:] = [raw[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        return found

    def h5(self) -> h5py.File:
        """Return the real file, opened on first use."""
        if self._h5 is None:
            self._h5 = self._opener()
        return self._h5

    def keys(self) -> list[str]:
        """The root's dataset names."""
        return list(self._datasets)

    def __iter__(self) -> Iterator[str]:
        return iter(self._datasets)

    def __contains__(self, name: object) -> bool:
        return name in self._datasets

    def __getitem__(self, name: str) -> IndexDataset:
        return self._datasets[name]

    def close(self) -> None:
        """Close the real file if it was opened."""
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
