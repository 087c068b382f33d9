"""Conversions and merges into a bucket: written in a local staging directory, then uploaded.

NOTE [ Publishing in a bucket ]: an object appears under its key only when its upload
completes, so a killed conversion never leaves part of a pack there. A killed multipart
upload leaves its parts: the store aborts the upload on any error (signals included), and
every run first sweeps the incomplete uploads under the keys it is about to write
(``Store.sweep``). A lifecycle rule is still worth setting (docs/object-storage.md).

A set under a prefix is ``RemoteSet``; the local writers are passed in.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

from h5pack._types import StrPath
from h5pack.core.packset import (
    MANIFEST_NAME,
    parse_manifest,
    shard_name,
)
from h5pack.core.private import owned_by_me
from h5pack.core.store import Store, split_url
from h5pack.errors import (
    H5PackError,
    OptionsError,
    TargetExistsError,
)
from h5pack.write.leftovers import describe_removed
from h5pack.write.options import ConvertOptions
from h5pack.write.packset import another_split
from h5pack.write.publish import check_room, free_bytes, sigterm_as_exit
from h5pack.write.report import ConvertEvent
from h5pack.write.scan import name_paths

Emit = Callable[[ConvertEvent], None]
Room = Callable[[int], None]
R = TypeVar("R")


def publish_staged(
    store: Store,
    url: str,
    write: Callable[[Path, Room], R],
    *,
    overwrite: bool,
    staging_dir: StrPath | None,
    emit: Emit,
    checked: bool = False,
) -> R:
    """Return ``write(local, room)`` run in a staging directory, its file then published at ``url``.

    ``room(nbytes)`` checks the staging directory's free space; ``checked``: ``url`` was
    already checked (a shard being replaced).

    Raises:
        TargetExistsError: an object is at ``url`` (before or after) without ``overwrite``.
        H5PackError: the staging directory is too small, or the upload failed.
    """
    _, _, key = split_url(url)
    if not key or key.endswith("/"):
        raise OptionsError(
            f"{url} is a prefix, not a pack: give the pack's name, e.g. {url.rstrip('/')}/"
            "out.h5 (to write a pack set of shards under a prefix, convert with --shards N)"
        )
    if not checked and not overwrite and (found := store.stat(url)) is not None:
        raise TargetExistsError(f"{found.url} already exists; pass --overwrite to replace it")
    if swept := store.sweep([url]):
        uploads = "upload" if len(swept) == 1 else "uploads"
        killed = f"that a killed conversion left: {name_paths(sorted(set(swept)), limit=3)}"
        emit(ConvertEvent("note", f"aborted {len(swept)} incomplete multipart {uploads} {killed}"))
    with sigterm_as_exit(), Staging(staging_dir, what=url) as staging:
        if staging.removed:
            emit(ConvertEvent("note", describe_removed(staging.removed)))
        local = staging.path / PurePosixPath(key).name
        try:
            result = write(local, lambda nbytes: staging.check_room(nbytes, what=url))
        except H5PackError as err:
            text = str(err)
            if "no space left" in text.lower() and "--staging-dir" not in text:
                raise H5PackError(f"{text}; {staging.hint()}") from err
            raise
        if not overwrite and (found := store.stat(url)) is not None:
            raise TargetExistsError(f"{found.url} appeared during the conversion; not replaced")
        emit(ConvertEvent("note", f"uploading {local.stat().st_size / 2**20:.1f} MiB to {url}"))
        store.publish(local, url, if_absent=not overwrite)
    return result


def set_prefix(url: str) -> str:
    """Return a pack set's prefix URL, ending in ``/`` (its manifest's URL names it too)."""
    scheme, bucket, key = split_url(url)
    key = key.removesuffix(MANIFEST_NAME).strip("/")
    return f"{scheme}://{bucket}/{key}/" if key else f"{scheme}://{bucket}/"


@dataclass(frozen=True)
class RemoteShard:
    """Where one shard of a set in a bucket is published (picklable: a Dask task's)."""

    url: str
    store: Store
    staging_dir: str | None = None


class RemoteSet:
    """A pack set written under a prefix of a bucket (``convert_set`` into ``s3://...``)."""

    def __init__(self, url: str, store: Store, staging_dir: StrPath | None) -> None:
        self.prefix_url = set_prefix(url)
        self.store = store
        self.staging_dir = os.fspath(staging_dir) if staging_dir is not None else None
        self.manifest_url = self.prefix_url + MANIFEST_NAME

    def shard(self, index: int, num_shards: int) -> RemoteShard:
        """Return where shard ``index`` is published."""
        url = self.prefix_url + shard_name(index, num_shards)
        return RemoteShard(url, self.store, self.staging_dir)

    def prepare(self, num_shards: int, options: ConvertOptions, *, overwrite: bool) -> Path:
        """Refuse (``overwrite``: delete) another split's manifest; return the shards' root."""
        root = Path(split_url(self.prefix_url)[2] or ".")
        data = self.store.get(self.manifest_url)
        if data is not None and another_split(
            self.manifest_url,
            lambda: parse_manifest(
                data.decode("utf-8", "replace"), where=self.manifest_url, root=root
            ),
            num_shards,
            options,
            overwrite=overwrite,
            elsewhere="under another prefix",
        ):
            self.store.delete(self.manifest_url)
        return root


# A staging directory's run holds the flock of its ``.lock``: one whose lock can be taken
# is a dead run's (NOTE [ Telling a dead owner ] in write/leftovers.py).
_STAGING_PREFIX = "h5pack-staging-"
_LOCK_NAME = ".lock"


class Staging:
    """A private, locked directory under ``root`` (default ``TMPDIR``) for packs bound for a bucket.

    On entry it removes dead runs' ones; on exit, itself. ``what`` is named in errors.
    """

    def __init__(self, root: StrPath | None, *, what: str) -> None:
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir())
        self.what = what
        self.path = self.root / f"{_STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.removed: list[Path] = []
        self._fd = -1

    def __enter__(self) -> Staging:
        if not self.root.is_dir():
            raise OptionsError(
                f"the staging directory {self.root} (where {self.what} is written before it "
                "is uploaded) is not a directory: give an existing one with --staging-dir"
            )
        self.removed = remove_dead_staging(self.root)
        try:
            self.path.mkdir(mode=0o700)
            self._fd = os.open(self.path / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            with contextlib.suppress(OSError):  # no locks here: only this run removes it
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            self._remove()
            raise H5PackError(
                f"cannot create a staging directory in {self.root} for {self.what}: "
                f"{err.strerror or err}; give another with --staging-dir"
            ) from err
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def check_room(self, nbytes: int, *, what: str) -> None:
        """Refuse to go on (``H5PackError``, with a hint) when the directory has less free."""
        try:
            check_room(self.root, nbytes, what=what)
        except H5PackError as err:
            raise H5PackError(f"{err}; {self.hint()}") from None

    def hint(self) -> str:
        """Return what to do when the staging directory is too small."""
        free = free_bytes(self.root)
        said = f" ({free / 2**30:.1f} GiB free)" if free is not None else ""
        return (
            f"{self.what} is written whole in the staging directory {self.root}{said} "
            "before it is uploaded: give a larger one with --staging-dir DIR (or TMPDIR)"
        )

    def _remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def remove_dead_staging(root: Path) -> list[Path]:
    """Remove this user's staging directories under ``root`` whose run is gone; return them."""
    try:
        names = [entry.name for entry in os.scandir(root) if entry.name.startswith(_STAGING_PREFIX)]
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        directory = root / name
        if not owned_by_me(directory):  # another user's (or a planted link): never touched
            continue
        try:
            fd = os.open(directory / _LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1  # killed between mkdir and the lock: no one owns it
        except OSError:
            continue
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live run's (or no locks here: left alone)
            shutil.rmtree(directory, ignore_errors=True)
            if not directory.exists():
                removed.append(directory)
        finally:
            if fd >= 0:
                os.close(fd)
    return removed
