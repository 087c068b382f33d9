"""Sources in a bucket: their objects read through the store, in ranges, where they lie.

NOTE [ Sources in a bucket ]: every source kind reads a URL (``s3://``, ``gs://``,
``az://``) as it reads a local path, through the URL's ``Store`` (``PathSource.store``;
NOTE [ Stores ]), with no scheme tested. A prefix is listed with ``Store.objects`` (kept
for the source when detection listed it: ``listed``). An archive's headers are walked
through an ``ObjectFile`` that reads ``READAHEAD`` bytes per request, so a tar of small
members costs one ranged GET per ``READAHEAD``, not one per member (a WebDataset shard's
``cls``/``txt``/``json`` come from the same bytes). A Parquet file is read exactly (no
read-ahead): its footer, then the row groups needed. Each image is a ``FileRange`` whose
``store`` is set: picklable, read by the worker itself with one ranged GET
(``read_object``; one client and ETag per object, checked on every answer). What is small
(a COCO file, a manifest) goes whole through ``Store.get``.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from h5pack.core.source import ByteSource
from h5pack.core.store import ObjectInfo, Store, is_url, open_store
from h5pack.errors import H5PackError, SourceError
from h5pack.write.scan import has_image_extension, is_ignored_name
from h5pack.write.sources.base import FileRange

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

READAHEAD = 4 * 2**20  # bytes a remote archive's header walk fetches per request

# Listings kept for a source (``listed``).
_LISTED: dict[tuple[Store, str], list[ObjectInfo]] = {}


class ObjectFile(io.RawIOBase):
    """``size`` bytes of ``source`` from ``start``, as a read-only file.

    A read of what is not held fetches at least ``readahead`` bytes in one request (0:
    exactly what is asked).
    """

    def __init__(
        self,
        source: ByteSource,
        start: int = 0,
        size: int | None = None,
        *,
        readahead: int | None = None,
    ) -> None:
        self.source, self.start = source, start
        self.end = start + (source.size() - start if size is None else size)
        self.readahead = (READAHEAD if source.remote else 0) if readahead is None else readahead
        self.pos = 0
        self.held, self.held_at = memoryview(b""), 0  # the last bytes read, and where

    def readable(self) -> bool:
        """Return True."""
        return True

    def seekable(self) -> bool:
        """Return True."""
        return True

    def tell(self) -> int:
        """Return the position."""
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move to ``offset`` from ``whence``; return the position."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.end - self.start}
        self.pos = base[whence] + offset
        return self.pos

    def pread(self, offset: int, size: int) -> memoryview:
        """Return up to ``size`` bytes at ``offset`` (of this file), from what is held if it can."""
        at = self.start + offset
        size = max(0, min(size, self.end - at))
        if size == 0:
            return memoryview(b"")
        if not self.held_at <= at or at + size > self.held_at + len(self.held):
            stop = min(self.end, at + max(size, self.readahead))
            self.held, self.held_at = self.source.read(at, stop), at
        return self.held[at - self.held_at : at - self.held_at + size]

    def readinto(self, buffer: WriteableBuffer) -> int:
        """Fill ``buffer`` from the position; return how many bytes (0 at the end)."""
        view = memoryview(buffer).cast("B")
        data = self.pread(self.pos, view.nbytes)
        view[: len(data)] = data
        self.pos += len(data)
        return len(data)


def listed(store: Store, prefix: str, *, keep: bool = False) -> list[ObjectInfo]:
    """Return the objects under the URL ``prefix``, sorted (SourceError naming it).

    With ``keep``, the answer is kept for the next call (detection's serves the source's).
    """
    found = _LISTED.pop((store, prefix), None)
    if found is None:
        try:
            found = store.objects(prefix)
        except H5PackError as err:
            raise SourceError(f"cannot list {prefix}: {err}") from err
    if keep:
        _LISTED[(store, prefix)] = found
    return found


def under(prefix: str, url: str) -> str:
    """Return the path of ``url`` below the prefix ``prefix`` (``/``-separated)."""
    return url[len(prefix) :].lstrip("/")


def folder_url(url: str) -> str:
    """Return ``url`` as a prefix of a folder's objects (ending with ``/``)."""
    return url if url.endswith("/") else url + "/"


def is_tar_of_tars(store: Store, path: str) -> bool:
    """Whether the file or object ``path`` is a tar whose first file is a tar (ImageNet's)."""
    try:
        with (
            contextlib.closing(store.source(path)) as source,
            tarfile.open(fileobj=ObjectFile(source, readahead=2**16), mode="r:") as archive,
        ):
            first = archive.next()
            while first is not None and first.isdir():  # `tar -cf x.tar train/`
                first = archive.next()
    except (OSError, H5PackError, tarfile.TarError):
        return False
    return first is not None and first.isfile() and first.name.lower().endswith(".tar")


def url_kind(url: str, store: Store) -> str:
    """Return the kind of source a URL names (``sample_source``'s detection for URLs).

    A brace pattern is WebDataset shards, a glob or ``.parquet`` Parquet; an object is
    known by its suffix (a tar of tars is ImageNet's); a prefix by its objects.
    """
    lower = url.lower()
    if "{" in url and "}" in url:
        return "webdataset"
    if lower.endswith(".parquet") or any(c in url for c in "*?["):
        return "parquet"
    suffixes = {".tar.gz": "tgz", ".tgz": "tgz", ".zip": "zip", ".tar": "tar"}
    kind = next((k for s, k in suffixes.items() if lower.endswith(s)), None)
    if kind == "tar":
        return "imagenet" if is_tar_of_tars(store, url) else "tar"
    if kind is not None:
        return kind
    prefix = folder_url(url)
    names = [under(prefix, o.url).lower() for o in listed(store, prefix, keep=True)]
    names = [n for n in names if not is_ignored_name(n.rsplit("/", 1)[-1])]  # .DS_Store...
    if names and all(n.endswith(".parquet") for n in names):
        return "parquet"
    if names and all(n.endswith(".tar") and "/" not in n for n in names):
        return "webdataset"
    return "folder"


def located(store: Store, path: str) -> str:
    """Return where a source's file is read from: its absolute path, or its URL."""
    return path if store.remote else os.path.abspath(path)


def member_range(store: Store, path: str, offset: int, size: int) -> FileRange:
    """Return the ``size`` bytes at ``offset`` of the file or object ``path``."""
    return FileRange(path, offset, size, store if store.remote else None)


def prefix_images(store: Store, root: str) -> dict[str, FileRange]:
    """Return the images under the URL ``root`` by relative path (``walk``'s rules)."""
    prefix = folder_url(root)
    found: dict[str, FileRange] = {}
    for item in listed(store, prefix):
        relative = under(prefix, item.url)
        parts = relative.split("/")
        if has_image_extension(parts[-1]) and not any(is_ignored_name(p) for p in parts):
            found[relative] = FileRange(item.url, 0, item.size, store)
    return found


def read_text(path: str, store: Store | None) -> str:
    """Return the text of a small file or object (OSError; SourceError naming its URL)."""
    # utf-8-sig drops a spreadsheet's byte-order mark; surrogateescape keeps non-UTF-8 names
    if not is_url(path):
        return Path(path).read_text(encoding="utf-8-sig", errors="surrogateescape")
    try:
        data = (store if store is not None else open_store(path)).get(path)
    except H5PackError as err:
        raise SourceError(f"cannot read {path}: {err}") from err
    if data is None:
        raise SourceError(f"cannot read {path}: no such object")
    return data.decode("utf-8-sig", errors="surrogateescape")
