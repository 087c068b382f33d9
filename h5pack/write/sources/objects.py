"""Sources in a bucket: their objects read through the store, in ranges, where they lie.

NOTE [ Sources in a bucket ]

Every source kind reads a URL (``s3://``, ``gs://``, ``az://``) as it reads a local path, through
the ``Store`` of the URL (``PathSource.store``; NOTE [ Stores ]), with no scheme tested:

- a prefix is listed with ``Store.objects`` (one request per page of names, sizes and ETags,
  kept for the source when detection listed it already: ``listed``);
- an archive's headers are walked through an ``ObjectFile``: a file over the object's
  ``ByteSource`` that reads ``READAHEAD`` bytes per request, so a tar of small members
  costs one ranged GET per ``READAHEAD`` of the archive, not one per member, and members
  larger than that are skipped, not fetched; a WebDataset shard's ``cls``/``txt``/``json``
  come from the same bytes;
- a Parquet file is a pyarrow file over the same wrapper, read exactly (no read-ahead):
  the footer, then the columns of the row groups needed;
- each image is a ``FileRange`` whose ``store`` is set: picklable (the URL, the range, the
  store's settings), read by the worker process itself with one ranged GET
  (``read_object``), from this process's source of the object (``opened``: one client and
  one ETag per object, checked on every answer).

Local paths keep reading local files (``FileRange.store`` None); only what is small goes whole
through ``Store.get`` (a COCO file, a manifest).
"""

from __future__ import annotations

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

# This process's open objects (least recently used first) and listings kept for a source.
_LISTED: dict[tuple[Store, str], list[ObjectInfo]] = {}


class ObjectFile(io.RawIOBase):
    """``size`` bytes of ``source`` from ``start``, as a read-only file that reads ahead.

    A read of what is not held fetches at least ``readahead`` bytes in one request (0:
    exactly what is asked, as a local file is read).
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
        """Return True: a file to read."""
        return True

    def seekable(self) -> bool:
        """Return True: reads go anywhere."""
        return True

    def tell(self) -> int:
        """Return the position."""
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move to ``offset`` from the start, the position or the end; return the position."""
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
    """Return the objects under the URL ``prefix`` (``Store.objects``), sorted.

    With ``keep``, the answer is kept for the next call (a detection's listing serves the
    source's); a kept answer is used once.

    Raises:
        SourceError: The prefix cannot be listed; the message names it.
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


def first_member(store: Store, url: str) -> str | None:
    """Return the name of a tar's first member (None when it has none or is no tar)."""
    source = store.source(url)
    try:
        with tarfile.open(fileobj=ObjectFile(source, readahead=2**16), mode="r:") as archive:
            first = archive.next()
    except (OSError, H5PackError, tarfile.TarError):
        return None
    finally:
        source.close()
    return first.name if first is not None and first.isfile() else None


def url_kind(url: str, store: Store) -> str:
    """Return the kind of source a URL names (``sample_source``'s detection for URLs).

    A brace pattern is WebDataset shards, a glob or ``.parquet`` Parquet; an object is
    known by its suffix (a ``.tar`` whose first member is a tar is ImageNet's); a prefix
    by its objects: all ``.parquet``, all ``.tar`` (shards), else an image folder.
    """
    lower = url.lower()
    if "{" in url and "}" in url:
        return "webdataset"
    if lower.endswith(".parquet") or any(c in url for c in "*?["):
        return "parquet"
    suffixes = {".tar.gz": "tgz", ".tgz": "tgz", ".zip": "zip", ".tar": "tar"}
    kind = next((k for s, k in suffixes.items() if lower.endswith(s)), None)
    if kind == "tar":
        first = first_member(store, url)
        return "imagenet" if first is not None and first.lower().endswith(".tar") else "tar"
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
    """Return the images under the URL ``root`` by relative path, in one listing.

    ``walk``'s rules: hidden names and OS litter are not images, image extensions are.
    """
    prefix = folder_url(root)
    found: dict[str, FileRange] = {}
    for item in listed(store, prefix):
        relative = under(prefix, item.url)
        parts = relative.split("/")
        if has_image_extension(parts[-1]) and not any(is_ignored_name(p) for p in parts):
            found[relative] = FileRange(item.url, 0, item.size, store)
    return found


def read_text(path: str, store: Store | None) -> str:
    """Return the text of a small file or object read whole (a COCO file, a manifest).

    Raises:
        OSError: A local file cannot be read.
        SourceError: An object cannot be read; the message names its URL.
    """
    # utf-8-sig drops the byte-order mark spreadsheets write; surrogateescape keeps file
    # names that are not UTF-8 as os.fsdecode would.
    if not is_url(path):
        return Path(path).read_text(encoding="utf-8-sig", errors="surrogateescape")
    try:
        data = (store if store is not None else open_store(path)).get(path)
    except H5PackError as err:
        raise SourceError(f"cannot read {path}: {err}") from err
    if data is None:
        raise SourceError(f"cannot read {path}: no such object")
    return data.decode("utf-8-sig", errors="surrogateescape")
