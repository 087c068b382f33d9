"""Packs published in a bucket: staged locally, uploaded whole under their final key.

A conversion (or merge) into ``s3://bucket/key.h5`` writes the pack exactly as it writes a
local one, into a staging directory on local disk (``Staging``), then uploads the finished
file under its final key (``Bucket.upload``); a pack set's manifest goes up last.

NOTE [ Publishing in a bucket ]: an object appears under its key only when its upload
completes (a PUT whole; a multipart upload on CompleteMultipartUpload), so a killed
conversion never leaves part of a pack under the final key. A killed multipart upload
leaves its parts (billed, listed by no ordinary listing): the store aborts the upload on
any error, Ctrl-C and SIGTERM included, and every run first sweeps the incomplete uploads
under the keys it is about to write (``Store.sweep``), as a local conversion removes what a
killed one left beside its target (``write/leftovers.py``). A lifecycle rule
(``AbortIncompleteMultipartUpload``) is still worth setting (docs/object-storage.md).
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

# -- the local staging directory --------------------------------------------------------

# Staging directories are named ``h5pack-staging-<pid>-<random>`` and hold ``.lock``, which
# their run locks (flock) for as long as it lives: a directory whose lock can be taken is a
# dead run's (NOTE [ Telling a dead owner ] in write/leftovers.py).
_STAGING_PREFIX = "h5pack-staging-"
_LOCK_NAME = ".lock"


class Staging:
    """A private local directory where packs bound for a bucket are written, then uploaded.

    A context manager: it creates ``h5pack-staging-<pid>-<random>`` under ``root`` (default:
    the system's temporary directory, ``TMPDIR``), locks it, first removes what dead runs
    left there (``remove_dead_staging``), and removes itself with everything in it on exit.

    Args:
        root: Where to create the directory.
        what: What the staged files are for (said in errors), e.g. the target URL.

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
        """Refuse to go on when the staging directory has less than ``nbytes`` free.

        Raises:
            H5PackError: it has less (the message names the directory and how to change it).
        """
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
    """Remove this user's staging directories under ``root`` whose run is gone; return them.

    Never raises: a directory that cannot be removed is left for the next run.
    """
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
