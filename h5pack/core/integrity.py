"""Checks that what a reader serves is what was written: digests and the pack's identity.

XXH3-64 per sample (memory speed; CRC32 without ``xxhash``), CRC32 of the metadata HDF5
does not checksum, and ``PackIdentity``: which file a process read.
"""

from __future__ import annotations

import importlib
import os
import secrets
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

Buffer = bytes | bytearray | memoryview | np.ndarray


@cache
def contiguous_sample_digest() -> Callable[[Any], int] | None:
    """Return ``sample_digest``'s function for C-contiguous buffers (no checks), or None."""
    try:
        module = importlib.import_module("xxhash")
    except ImportError:
        return None
    function: Callable[[Any], int] = module.xxh3_64_intdigest
    return function


def has_sample_digest() -> bool:
    """Return whether this process can compute ``sample_digest`` (``xxhash`` installed)."""
    return contiguous_sample_digest() is not None


def _contiguous(data: Buffer) -> Buffer:
    if isinstance(data, np.ndarray) and not data.flags.c_contiguous:
        return np.ascontiguousarray(data)
    return data


def sample_digest(data: Buffer) -> int:
    """Return the XXH3-64 of a sample's stored bytes (``RuntimeError`` without ``xxhash``)."""
    function = contiguous_sample_digest()
    if function is None:
        raise RuntimeError("sample digests need the xxhash package: pip install xxhash")
    return function(_contiguous(data))


def crc32(data: Buffer) -> int:
    """Return the CRC32 of a sample's stored bytes (what ``checksums`` records)."""
    data = _contiguous(data)
    return zlib.crc32(data.data if isinstance(data, np.ndarray) else data)


def hex32(value: int) -> str:
    """Return a 32-bit digest as the 8 lowercase hex digits the pack records."""
    return f"{value & 0xFFFFFFFF:08x}"


def array_digest(array: np.ndarray, dtype: str) -> str:
    """Return the CRC32 (hex) of ``array``'s elements as ``dtype`` (little-endian), in C order."""
    canonical = np.ascontiguousarray(np.asarray(array).astype(np.dtype(dtype), copy=False))
    return hex32(zlib.crc32(canonical.data))


def strings_crc(items: Iterable[bytes], crc: int = 0) -> int:
    """Continue the CRC32 ``crc`` over ``items``, each as uint32 LE length then its bytes."""
    for item in items:
        crc = zlib.crc32(item, zlib.crc32(struct.pack("<I", len(item)), crc))
    return crc


def strings_digest(items: Iterable[bytes]) -> str:
    """Return the CRC32 (hex) of a list of byte strings (see ``strings_crc``)."""
    return hex32(strings_crc(items))


def text_digest(text: str) -> str:
    """Return the CRC32 (hex) of a text attribute's UTF-8 bytes."""
    return hex32(zlib.crc32(text.encode("utf-8", "surrogateescape")))


def new_pack_id() -> str:
    """Return a fresh random pack id (32 hex digits)."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class PackIdentity:
    """Which file a process read: its pack id and status (a remote object's ETag and size)."""

    pack_id: str | None
    device: int
    inode: int
    size: int
    mtime_ns: int
    etag: str | None = None

    @classmethod
    def of(cls, stat: os.stat_result, pack_id: str | None) -> PackIdentity:
        """Return the identity of a file with status ``stat`` holding pack ``pack_id``."""
        return cls(pack_id, stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)

    @classmethod
    def remote(cls, pack_id: str | None, size: int, etag: str) -> PackIdentity:
        """Return the identity of a remote object of ``size`` bytes and ``etag``."""
        return cls(pack_id, 0, 0, size, 0, etag)

    def changes(self, now: PackIdentity) -> list[str]:
        """Return what differs between this identity and ``now`` (empty: the same file)."""
        found = []
        if self.pack_id != now.pack_id:
            found.append(f"pack id {self.pack_id} then, {now.pack_id} now")
        if (self.device, self.inode) != (now.device, now.inode):
            found.append(f"file {self.device}:{self.inode} then, {now.device}:{now.inode} now")
        if self.size != now.size:
            found.append(f"{self.size} bytes then, {now.size} now")
        if self.mtime_ns != now.mtime_ns:
            found.append("modified since")
        if self.etag != now.etag:
            found.append(f"ETag {self.etag} then, {now.etag} now")
        return found
