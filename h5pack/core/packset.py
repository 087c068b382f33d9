"""A pack set (docs/format.md): shard packs and the manifest listing them."""

from __future__ import annotations

import json
import mimetypes
import os
import re
import secrets
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core.format import PackMeta
from h5pack.errors import FormatError, OptionsError, PackNotFoundError

PACKSET_VERSION = 1
PACKSET_MARKER_KEY = "h5pack_packset"
MANIFEST_NAME = "packset.json"


def shard_name(index: int, num_shards: int) -> str:
    """Return the file name of shard ``index`` of ``num_shards``."""
    return f"shard-{index:05d}-of-{num_shards:05d}.h5"


def shard_slice(num_samples: int, index: int, num_shards: int) -> tuple[int, int]:
    """Return the positions ``[lo, hi)`` of the write order that shard ``index`` holds."""
    if num_shards < 1:
        raise OptionsError(f"num_shards should be >= 1, but got num_shards={num_shards}")
    if not 0 <= index < num_shards:
        raise OptionsError(
            f"the shard index should be in 0..{num_shards - 1}, but got {index} "
            f"(--shard {index}/{num_shards})"
        )
    return index * num_samples // num_shards, (index + 1) * num_samples // num_shards


def meta_digest(meta: PackMeta) -> str:
    """Return a CRC32 (hex) of a pack's per-sample metadata and class list (a shard's digest)."""
    crc = 0
    for array in (meta.labels, meta.source_index, meta.shapes, meta.checksums):
        crc = zlib.crc32(np.ascontiguousarray(array).tobytes(), crc)
    crc = zlib.crc32("\n".join(meta.classes).encode(), crc)
    crc = zlib.crc32(f"{meta.num_samples}:{meta.mode}:{meta.storage}".encode(), crc)
    return f"{crc:08x}"


def slice_fingerprint(labels: Iterable[int], relatives: Iterable[str]) -> str:
    """Return a CRC32 (hex) of a slice's files: each one's label and relative path, in order."""
    crc = 0
    for label, relative in zip(labels, relatives, strict=True):
        crc = zlib.crc32(b"%d\t%s\n" % (int(label), os.fsencode(relative)), crc)
    return f"{crc:08x}"


@dataclass(frozen=True, kw_only=True)
class ShardIdentity:
    """Which slice of which split a shard holds (its ``format.SHARD_KEY`` attribute)."""

    index: int
    num_shards: int
    seed: int
    shuffled: bool
    num_found: int
    num_planned: int
    slice_crc32: str

    def to_text(self) -> str:
        """Return the attribute's text (JSON with sorted keys)."""
        return json.dumps(asdict(self), sort_keys=True)

    def differences(self, recorded: Mapping[str, Any]) -> list[str]:
        """Return how a shard's recorded identity differs from this one (empty: the same)."""
        if not recorded:
            return ["no shard identity (it is a plain pack, not a shard of a pack set)"]
        return [
            f"{key.replace('_', ' ')} {recorded.get(key)!r}, this conversion {value!r}"
            if key != "slice_crc32"
            else "other files in its slice (the folder changed since it was written)"
            for key, value in asdict(self).items()
            if recorded.get(key) != value
        ]


@dataclass(frozen=True, kw_only=True)
class ShardEntry:
    """One shard of a pack set, as the manifest records it."""

    path: str
    num_samples: int
    file_bytes: int
    digest: str

    @classmethod
    def of(cls, path: Path, meta: PackMeta) -> ShardEntry:
        """Return the entry of the shard at ``path`` (its metadata ``meta``), named by file name."""
        return cls(
            path=path.name,
            num_samples=meta.num_samples,
            file_bytes=path.stat().st_size,
            digest=meta_digest(meta),
        )


@dataclass(frozen=True, kw_only=True)
class PackSetManifest:
    """A pack set's manifest; ``root`` is the directory the shard paths are relative to."""

    root: Path
    num_samples: int  # the fields below in the order the manifest holds them
    classes: tuple[str, ...]
    seed: int
    num_shards: int
    created_utc: str = ""
    tool_version: str = ""
    shards: tuple[ShardEntry, ...]

    @property
    def manifest_path(self) -> Path:
        """Where the manifest lives."""
        return self.root / MANIFEST_NAME


def manifest_text(manifest: PackSetManifest) -> str:
    """Return the manifest's on-disk text (JSON, without the final newline)."""
    fields = {k: v for k, v in asdict(manifest).items() if k != "root"}
    return json.dumps({PACKSET_MARKER_KEY: PACKSET_VERSION, **fields}, indent=1, ensure_ascii=False)


def write_manifest(manifest: PackSetManifest) -> Path:
    """Write ``manifest`` atomically (a temporary file, then a rename); the last writer wins."""
    path = manifest.manifest_path
    text = manifest_text(manifest)
    for attempt in range(3):
        temporary = path.with_name(f".{path.name}.{os.getpid()}.w{secrets.token_hex(4)}.tmp")
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
            return path
        except FileNotFoundError:
            if attempt == 2:
                raise
        finally:
            temporary.unlink(missing_ok=True)
    raise AssertionError("unreachable")


def is_packset(source: StrPath | Sequence[StrPath]) -> bool:
    """Return whether ``source`` is a pack set: a list of packs, a set's directory or manifest."""
    if not isinstance(source, str | os.PathLike):
        return True
    if os.fspath(source).endswith(("/", ".json")):  # a directory, a prefix, a manifest
        return True
    return Path(source).is_dir()


def pack_paths(
    source: StrPath | Sequence[StrPath],
) -> tuple[list[Path], PackSetManifest | None]:
    """Return the packs of a pack set (its directory, manifest or a list) and its manifest."""
    if isinstance(source, str | os.PathLike):
        manifest = load_manifest(source)
        return [manifest.root / entry.path for entry in manifest.shards], manifest
    paths = [Path(p) for p in source]
    if not paths:
        raise OptionsError("a list of packs should hold at least one pack, but got none")
    return paths, None


def holds_images(folder: Path, *, limit: int = 1000) -> bool:
    """Return whether ``folder`` (or a subfolder) holds an image file, among ``limit`` names."""
    seen = 0
    for _, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            kind, _ = mimetypes.guess_type(name)
            if kind is not None and kind.startswith("image/") and not name.startswith("."):
                return True
            seen += 1
        seen += len(folders)
        if seen >= limit:
            return False
    return False


def load_manifest(source: StrPath) -> PackSetManifest:
    """Read and validate the manifest of the pack set at ``source`` (directory or manifest)."""
    path = Path(source) / MANIFEST_NAME if Path(source).is_dir() else Path(source)
    if path.exists() and not path.is_file():  # a FIFO or a device: never opened
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise FormatError(f"{path} is {kind}; a pack set manifest ({MANIFEST_NAME}) is a JSON file")
    if not path.is_file():
        if Path(source).is_dir() and holds_images(Path(source)):
            raise PackNotFoundError(
                f"{source} holds images, not a pack: convert it first (h5pack convert "
                f"{source} out.h5), then read out.h5"
            )
        where = f"{path.parent} has no {MANIFEST_NAME}" if Path(source).is_dir() else f"{path}"
        raise PackNotFoundError(
            f"{where}: no pack set manifest (a conversion with --shards writes it last; "
            "was it interrupted?)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise FormatError(f"{path}: the pack set manifest cannot be read ({err})") from err
    return parse_manifest(text, where=os.fspath(path), root=path.parent)


def parse_manifest(text: str, *, where: str, root: Path) -> PackSetManifest:
    """Return the manifest whose JSON text is ``text`` (``where``: its path or URL)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise FormatError(f"{where}: the pack set manifest cannot be read ({err})") from err
    if not isinstance(data, dict) or PACKSET_MARKER_KEY not in data:
        raise FormatError(f"{where} is not an h5pack pack set manifest")
    version = data[PACKSET_MARKER_KEY]
    if not isinstance(version, int) or version > PACKSET_VERSION or version < 1:
        raise FormatError(
            f"{where} is a pack set of version {version!r}, but this h5pack reads versions "
            f"1..{PACKSET_VERSION}; upgrade h5pack"
        )
    try:
        shards = tuple(
            ShardEntry(
                path=str(s["path"]),
                num_samples=int(s["num_samples"]),
                file_bytes=int(s["file_bytes"]),
                digest=str(s["digest"]),
            )
            for s in data["shards"]
        )
        manifest = PackSetManifest(
            root=root,
            shards=shards,
            classes=tuple(str(c) for c in data["classes"]),
            num_samples=int(data["num_samples"]),
            seed=int(data.get("seed", 0)),
            num_shards=int(data.get("num_shards", len(shards))),
            created_utc=str(data.get("created_utc", "")),
            tool_version=str(data.get("tool_version", "")),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise FormatError(f"{where}: the pack set manifest is malformed ({err})") from err
    # The counts against the total are checked with the shards (``member_problems``).
    for entry in shards:
        if re.match(r"[a-zA-Z][\w+.-]+:/", entry.path):  # s3://..., https://...
            raise FormatError(
                f"{where}: shard path {entry.path!r} is a URL; a pack set's shard paths are "
                "relative to its manifest (to read packs kept in several places, give "
                "their URLs as a list)"
            )
        if Path(entry.path).is_absolute() or ".." in Path(entry.path).parts:
            raise FormatError(f"{where}: shard path {entry.path!r} leaves the pack set")
    return manifest
