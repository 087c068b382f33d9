"""Walk a folder for image candidates: what is never a sample, symlinks, loops, special files.

The rules are those of ``write.scan``'s docstring; the walk finds the candidates and the
entries it cannot take (``SkippedFile``), and ``scan`` labels them.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from h5pack.core.format import SkippedFile
from h5pack.errors import SourceError

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
)
"""File extensions (lower case, with the dot) that make a file an image candidate."""

IGNORED_NAMES: frozenset[str] = frozenset({"thumbs.db", "desktop.ini", "__macosx"})
"""Operating-system litter, compared in lower case; hidden names (``.*``) are ignored too."""


def has_image_extension(name: str) -> bool:
    """Return whether a file name ends with one of :data:`IMAGE_EXTENSIONS` (any case)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def is_ignored_name(name: str) -> bool:
    """Return whether a file or folder name is hidden or OS litter, never a sample."""
    return name.startswith(".") or name.lower() in IGNORED_NAMES


def check_root(root: Path) -> None:
    """Refuse a root that is missing, unreadable or a file (``SourceError`` naming it)."""
    try:
        mode = os.stat(root).st_mode
    except FileNotFoundError as err:
        raise SourceError(f"source folder {root} does not exist") from err
    except OSError as err:
        raise SourceError(f"cannot access source folder {root}: {err.strerror}") from err
    if not stat.S_ISDIR(mode):
        raise SourceError(f"source {root} is a file, not a folder of images")


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def walk(root: Path) -> tuple[list[tuple[str, Path]], list[SkippedFile]]:
    """Return every image candidate under ``root`` as ``(relative, path)``, and the problems.

    Symlinks are followed. A folder whose ``(st_dev, st_ino)`` is one of its own ancestors'
    is a loop and is not entered again; the same folder reached by two different routes
    (two links to it) is walked under both names, as ``os.walk(followlinks=True)`` does.
    """
    found: list[tuple[str, Path]] = []
    problems: list[SkippedFile] = []
    root_stat = os.stat(root)
    stack: list[tuple[str, str, frozenset[tuple[int, int]]]] = [
        (os.fspath(root), "", frozenset({(root_stat.st_dev, root_stat.st_ino)}))
    ]
    while stack:
        folder, prefix, ancestors = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as err:
            if not prefix:
                raise SourceError(f"cannot list source folder {root}: {err.strerror}") from err
            problems.append(SkippedFile(prefix[:-1], f"cannot list folder: {err.strerror}"))
            continue
        for entry in entries:
            name = entry.name
            if is_ignored_name(name):
                continue
            relative = prefix + name
            try:
                if entry.is_symlink():
                    st = entry.stat()  # follows the link
                    mode = st.st_mode
                elif entry.is_file(follow_symlinks=False):
                    # The common case: known from the directory entry, no stat call.
                    if has_image_extension(name):
                        found.append((relative, Path(entry.path)))
                    continue
                else:
                    st = entry.stat(follow_symlinks=False)
                    mode = st.st_mode
            except FileNotFoundError:
                if entry.is_symlink():
                    problems.append(SkippedFile(relative, "dangling symlink"))
                continue  # else it vanished while we looked: not a sample either
            except OSError as err:
                reason = (
                    "symlink loop" if err.errno == errno.ELOOP else f"cannot stat: {err.strerror}"
                )
                problems.append(SkippedFile(relative, reason))
                continue
            if stat.S_ISDIR(mode):
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    problems.append(
                        SkippedFile(relative, "symlink loop: leads back to an enclosing folder")
                    )
                else:
                    stack.append((entry.path, relative + "/", ancestors | {key}))
            elif stat.S_ISREG(mode):
                if has_image_extension(name):
                    found.append((relative, Path(entry.path)))
            elif has_image_extension(name):
                problems.append(SkippedFile(relative, f"{_special_kind(mode)}, not an image file"))
    return found, problems
