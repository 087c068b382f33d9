"""Where packs are kept: one ``Store`` per kind of storage, chosen once from a path or URL.

NOTE [ Stores ]

zarr v3's ``Store`` is the model. Each public edge (``make_loader``, ``convert``,
``merge_packs``, ``pack_info``, ``verify_pack``, the benchmarks, the CLI) turns the path or
URL it was given, plus the user's settings, into one store with ``open_store``, which parses
them into the store's typed options (``RetryPolicy.of``); below the edge only the store
travels. A store answers for every path or URL of its kind: ``source(path)`` (the bytes,
NOTE [ Byte sources ]: read-ahead and the disk cache wrap it, so they work over any store),
``stat``, ``get`` (a manifest), ``objects`` (under a prefix: NOTE [ Sources in a bucket ]),
and for the writers ``put``, ``publish``, ``delete``, ``sweep``, each appearing whole or not
at all (NOTE [ Publishing in a bucket ]). A new kind is one module with a ``Store`` subclass
and its options class, registered in ``SCHEMES`` with the extra that brings its client.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from h5pack._types import StrPath
from h5pack.core.source import ByteSource, LocalSource
from h5pack.errors import FormatError, H5PackError, OptionsError, PackNotFoundError, install_line

if TYPE_CHECKING:
    from h5pack.core.retry import RetryPolicy

T = TypeVar("T")

# scheme -> (module, class) of its store, imported on first use (its client is an extra)
SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("h5pack.core.s3", "S3Store"),
    "gs": ("h5pack.core.gcs", "GCSStore"),
    "gcs": ("h5pack.core.gcs", "GCSStore"),
    "az": ("h5pack.core.azure", "AzureStore"),
    "abfs": ("h5pack.core.azure", "AzureStore"),
    "http": ("h5pack.core.http", "HTTPStore"),
    "https": ("h5pack.core.http", "HTTPStore"),
}
# The extra that brings each scheme's client (HTTP needs none).
EXTRAS: dict[str, str] = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}


class MissingExtraError(H5PackError, ImportError):
    """A URL's client library is not installed; the message names the extra to install."""


def missing_extra(scheme: str, err: ImportError) -> MissingExtraError:
    """Return the error for a ``scheme://`` URL read without its client installed."""
    extra = EXTRAS.get(scheme, scheme)
    return MissingExtraError(
        f"reading {scheme}:// URLs needs h5pack's {extra!r} extra: {install_line(extra)} ({err})"
    )


def is_url(path: StrPath | str) -> bool:
    """Return whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    scheme, sep, _ = os.fspath(path).partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1


def split_url(url: str) -> tuple[str, str, str]:
    """Return ``(scheme, bucket, key)`` of ``scheme://bucket/key`` (``FormatError``: no bucket)."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise FormatError(f"{url}: the URL names no bucket (expected {scheme}://BUCKET/KEY)")
    return scheme.lower(), bucket, key


def join_url(base: str, relative: str) -> str:
    """Return the path or URL of ``relative`` (``/``-separated) under the prefix ``base``."""
    return base.rstrip("/") + "/" + relative.lstrip("/")


@dataclass(frozen=True)
class ObjectInfo:
    """A stored object (or file), as its store saw it."""

    url: str
    size: int
    etag: str  # its ETag or generation (remote), device:inode (local)


class Store(ABC):
    """One kind of storage, reached with one set of settings (NOTE [ Stores ]).

    Picklable: a DataLoader worker or a Dask task gets the options and makes its own
    clients and descriptors.
    """

    remote: ClassVar[bool] = True  # each request has a latency worth saving
    options_type: ClassVar[type[RetryPolicy]]  # its settings, typed (a remote store's)

    def __init__(self, options: Any = None) -> None:
        self.options = options

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Store:
        """Return the store of the environment's settings overridden by ``settings``."""
        return cls(cls.options_type.of(settings))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and getattr(other, "options", None) == self.options

    def __hash__(self) -> int:
        return hash((type(self), self.options))

    @abstractmethod
    def source(self, path: str) -> ByteSource:
        """Return the bytes of the object at ``path`` (opened lazily; identity on first read)."""

    def stat(self, path: str) -> ObjectInfo | None:
        """Return the object at ``path`` (one request), or None; a missing bucket raises."""
        found = self._unless_missing(lambda source: source.identity(), path)
        return None if found is None else ObjectInfo(path, found.size, found.tag)

    def get(self, path: str) -> bytes | None:
        """Return the small object at ``path`` whole (a manifest), or None when there is none."""
        return self._unless_missing(lambda source: source.read_all(), path)

    def _unless_missing(self, read: Callable[[ByteSource], T], path: str) -> T | None:
        """Return ``read(source)``, or None when the object is missing (not its bucket)."""
        with contextlib.closing(self.source(path)) as source:
            try:
                return read(source)
            except PackNotFoundError as err:
                if "no bucket" in str(err):
                    raise
                return None

    def objects(self, prefix: str) -> list[ObjectInfo]:
        """Return the objects whose URL starts with ``prefix``, sorted (a request per page)."""
        raise FormatError(f"{prefix}: {type(self).__name__} cannot list objects; name each one")

    def put(self, path: str, data: bytes) -> None:
        """Write the small object ``path`` (it appears whole or not at all)."""
        raise self.read_only(path)

    def publish(self, local: Path, path: str, *, if_absent: bool) -> ObjectInfo:
        """Make the finished local file ``local`` appear whole under ``path``.

        ``TargetExistsError``: ``if_absent`` and an object is there (atomic where it can be).
        """
        raise self.read_only(path)

    def delete(self, path: str) -> None:
        """Remove ``path`` (no error when it is gone)."""
        raise self.read_only(path)

    def read_only(self, path: str) -> H5PackError:
        """Return the error of a write into a store that takes none."""
        return H5PackError(f"{path}: {type(self).__name__} is read-only")

    def download(self, path: str, local: Path, *, step_bytes: int = 64 * 2**20) -> int:
        """Copy the object at ``path`` into the local file ``local``; return its size."""
        with contextlib.closing(self.source(path)) as source, open(local, "wb") as out:
            size = source.size()
            for start in range(0, size, step_bytes):
                out.write(source.read(start, min(size, start + step_bytes)))
        return size

    def sweep(self, paths: Sequence[str]) -> list[str]:
        """Remove what killed writes left under ``paths``; return what was removed."""
        return []


class LocalStore(Store):
    """The local file system: paths, ``os.preadv``, the inode as identity."""

    remote = False

    def source(self, path: str) -> ByteSource:
        """Return the file at ``path`` (``LocalSource``)."""
        return LocalSource(os.fspath(path))

    def stat(self, path: str) -> ObjectInfo | None:
        """Return the file at ``path``, or None."""
        try:
            found = os.stat(path)
        except FileNotFoundError:
            return None
        return ObjectInfo(path, found.st_size, f"{found.st_dev}:{found.st_ino}")

    def put(self, path: str, data: bytes) -> None:
        """Write ``path`` through a temporary file renamed over it."""
        temp = Path(f"{path}.{os.getpid()}.tmp")
        temp.write_bytes(data)
        os.replace(temp, path)

    def publish(self, local: Path, path: str, *, if_absent: bool) -> ObjectInfo:
        """Rename ``local`` to ``path`` (a hard link first with ``if_absent``: never clobbers)."""
        from h5pack.errors import TargetExistsError

        if if_absent:
            try:
                os.link(local, path)
            except FileExistsError:
                raise TargetExistsError(f"{path} appeared meanwhile; not replaced") from None
            local.unlink()
        else:
            os.replace(local, path)
        found = self.stat(path)
        assert found is not None  # just written
        return found

    def delete(self, path: str) -> None:
        """Remove the file ``path``."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def open_store(
    path: StrPath | Sequence[StrPath] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Store:
    """Return the store of a path or URL (the first URL of a list): the public edges' call.

    Args:
        path: A local path, a URL (``s3://bucket/key``), or a list of them (a URL among
            them chooses); None: the local file system.
        storage_options: The client's settings beyond what the environment says (for S3,
            ``S3Options``); ignored for local paths.

    Raises:
        FormatError: an unknown scheme.
        OptionsError: an unknown storage option, or URLs of two kinds of storage.
    """
    paths = [path] if isinstance(path, str | os.PathLike) else list(path or ())
    urls = [os.fspath(p) for p in paths if is_url(p)]
    if not urls:
        return LocalStore()
    schemes = {u.partition("://")[0].lower() for u in urls}
    if len({SCHEMES.get(s, s) for s in schemes}) > 1:
        raise OptionsError(
            f"{', '.join(sorted(s + '://' for s in schemes))} URLs in one call: each call "
            "reads and writes one kind of storage (copy through a local path)"
        )
    scheme = urls[0].partition("://")[0].lower()
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES))
        raise FormatError(f"h5pack reads {known} URLs and local paths, not {scheme}://")
    module_name, class_name = SCHEMES[scheme]
    found: type[Store] = getattr(importlib.import_module(module_name), class_name)
    return found.of(storage_options or {})


def open_source(path: StrPath, *, storage_options: Mapping[str, Any] | None = None) -> ByteSource:
    """Return the bytes of a local path or a URL (``open_store(path).source(path)``)."""
    return open_store(path, storage_options).source(os.fspath(path))
