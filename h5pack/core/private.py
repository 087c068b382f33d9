"""Directories only this user can use: where h5pack keeps data between runs, checked first.

NOTE [ Private directories ]

A directory h5pack keeps a user's data in (the disk cache of downloaded chunks, the staging
of uploads) is created 0700, its files 0600, and is checked before use: a real directory
(not a symbolic link), owned by this user, not writable by group or others; otherwise
another local user could read the data or redirect h5pack's writes (docs/decisions/0110),
and it is refused with a message naming it. The default cache lies under
``$XDG_CACHE_HOME`` (else ``~/.cache``), as pip's and torch.hub's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from h5pack.errors import H5PackError

__all__ = ["UnsafeDirectoryError", "owned_by_me", "private_directory", "user_cache_dir"]


class UnsafeDirectoryError(H5PackError, PermissionError):
    """A directory h5pack would keep data in could be read or redirected by another user."""


def user_cache_dir() -> Path:
    """Return ``$XDG_CACHE_HOME/h5pack``, else ``~/.cache/h5pack`` (the default disk cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(root) if os.path.isabs(root) else Path.home() / ".cache"
    return base / "h5pack"


def owned_by_me(path: Path) -> bool:
    """Return whether ``path`` is this user's own (a symbolic link never is)."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return not stat.S_ISLNK(found.st_mode) and found.st_uid == os.geteuid()


def private_directory(path: Path, *, what: str, hint: str) -> Path:
    """Create ``path`` (0700) unless it exists, and return it once checked (see the NOTE).

    ``what`` names it and ``hint`` says what the user can do instead, for messages.

    Raises:
        UnsafeDirectoryError: a symbolic link, not a directory, another user's, or writable
            by group or others (the message names it and why).
        OSError: it cannot be created (the caller may read on without it).
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = os.lstat(path)
    me = os.geteuid()
    problem = ""
    if stat.S_ISLNK(found.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)})"
    elif not stat.S_ISDIR(found.st_mode):
        problem = "is not a directory"
    elif found.st_uid != me:
        problem = f"belongs to uid {found.st_uid}, not to this user (uid {me})"
    elif found.st_mode & 0o022:
        problem = f"is writable by other users (mode {stat.S_IMODE(found.st_mode):o})"
    if problem:
        raise UnsafeDirectoryError(
            f"{what} {path} {problem}: refused, another user could read or redirect what "
            f"h5pack keeps there; {hint}"
        )
    return path
