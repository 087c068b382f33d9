"""Packs published in a bucket: staged locally (``Staging``), uploaded whole under their key.

NOTE [ Publishing in a bucket ]: an object appears under its key only when its upload
completes, so a killed conversion never leaves part of a pack there. A killed multipart
upload leaves its parts: the store aborts the upload on any error (signals included), and
every run first sweeps the incomplete uploads under the keys it is about to write
(``Store.sweep``). A lifecycle rule is still worth setting (docs/object-storage.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from h5pack._types import StrPath
from h5pack.core.private import owned_by_me
from h5pack.errors import (
    H5PackError,
    OptionsError,
)
from h5pack.write.publish import check_room, free_bytes

__all__ = ["Staging", "describe_swept", "remove_dead_staging"]

logger = logging.getLogger("h5pack")

# A staging directory's run holds the flock of its ``.lock``: one whose lock can be taken
# is a dead run's (NOTE [ Telling a dead owner ] in write/leftovers.py).
_STAGING_PREFIX = "h5pack-staging-"
_LOCK_NAME = ".lock"


class Staging:
    """A private local directory where packs bound for a bucket are written, then uploaded.

    A context manager: creates and locks ``h5pack-staging-<pid>-<random>`` under ``root``
    (default ``TMPDIR``) after removing dead runs' ones, and removes it on exit. ``what``
    (the target URL) is named in errors.

    Raises:
        OptionsError: ``root`` is not a directory.
        H5PackError: the directory cannot be created.
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._remove()

    def file(self, name: str) -> Path:
        """Return where the pack ``name`` is staged."""
        return self.path / name

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


def keys_text(keys: Sequence[str], *, shown: int = 3) -> str:
    """Return a short list of keys for a message."""
    listed = ", ".join(keys[:shown])
    return listed + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def describe_swept(swept: Sequence[str]) -> str:
    """Return the note that tells a user which killed uploads were aborted."""
    count = len(swept)
    noun = "upload" if count == 1 else "uploads"
    return (
        f"aborted {count} incomplete multipart {noun} that a killed conversion left: "
        f"{keys_text(sorted(set(swept)))}"
    )
