"""Find the images under a source folder, with their labels and class names.

Two layouts are recognised (a manifest, ``write.manifest``, covers any other)::

    root/cat/001.jpg, root/cat/kittens/002.png -> label 0 (nested files: top-level class)
    root/dog/003.JPG                           -> label 1
    root/0001.jpg (flat: images only in root)  -> label -1

``layout="auto"`` picks ImageFolder when images sit only in subfolders, flat when only in
the root; with both, loose images fewer than the nested ones are stray files (reported in
``problems``), else the scan refuses. Classes are the sorted top-level folders holding at
least one image. Hidden names, OS litter, other extensions and special files are never
samples; symlinks are followed, loops are not. Files sort by ``os.fsencode(relative)``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from h5pack._types import StrPath
from h5pack.core.fields import StoredField
from h5pack.core.format import SkippedFile
from h5pack.errors import SourceError

FolderLayout = Literal["auto", "imagefolder", "flat"]
FOLDER_LAYOUTS: tuple[FolderLayout, ...] = get_args(FolderLayout)
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
_IGNORED_NAMES = frozenset({"thumbs.db", "desktop.ini", "__macosx"})
LOOSE_REASON = (
    "image directly in the source folder, beside the class folders: it belongs to no class "
    "(move it into a class folder to pack it)"
)

T = TypeVar("T")


def has_image_extension(name: str) -> bool:
    """Return whether a file name ends with one of ``IMAGE_EXTENSIONS`` (any case)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def is_ignored_name(name: str) -> bool:
    """Return whether a file or folder name is hidden or OS litter, never a sample."""
    return name.startswith(".") or name.lower() in _IGNORED_NAMES


def path_sort_key(relative: str) -> bytes:
    """Return the key that orders relative paths (and class names): their file-system bytes."""
    return os.fsencode(relative)


@dataclass(frozen=True)
class SourceFile:
    """One image found: the path to open, its ``/``-separated relative path, its label."""

    path: Path
    relative: str
    label: int


@dataclass(frozen=True)
class ScanResult:
    """The images under a root, sorted, with their classes, problems and (manifest) fields."""

    root: Path
    files: tuple[SourceFile, ...]
    classes: tuple[str, ...]
    problems: tuple[SkippedFile, ...] = ()
    unlisted: tuple[str, ...] = ()
    fields: tuple[StoredField, ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)


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


def walk(root: Path) -> tuple[list[tuple[str, Path]], list[SkippedFile]]:
    """Return every image candidate under ``root`` as ``(relative, path)``, and the problems.

    A folder that is one of its own ancestors (by device and inode) is a loop, not entered.
    """
    found: list[tuple[str, Path]] = []
    problems: list[SkippedFile] = []
    root_stat = os.stat(root)
    stack = [(os.fspath(root), "", frozenset({(root_stat.st_dev, root_stat.st_ino)}))]
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
                elif entry.is_file(follow_symlinks=False):  # no stat call
                    if has_image_extension(name):
                        found.append((relative, Path(entry.path)))
                    continue
                else:
                    st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                if entry.is_symlink():
                    problems.append(SkippedFile(relative, "dangling symlink"))
                continue  # else it vanished meanwhile
            except OSError as err:
                loop = err.errno == errno.ELOOP
                reason = "symlink loop" if loop else f"cannot stat: {err.strerror}"
                problems.append(SkippedFile(relative, reason))
                continue
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    reason = "symlink loop: leads back to an enclosing folder"
                    problems.append(SkippedFile(relative, reason))
                else:
                    stack.append((entry.path, relative + "/", ancestors | {key}))
            elif stat.S_ISREG(st.st_mode):
                if has_image_extension(name):
                    found.append((relative, Path(entry.path)))
            elif has_image_extension(name):
                kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
                problems.append(SkippedFile(relative, f"{kind}, not an image file"))
    return found, problems


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device"}
_KINDS[stat.S_IFBLK] = "a device"


def scan(root: StrPath, *, layout: FolderLayout = "auto") -> ScanResult:
    """Find the images under ``root`` and label them (the module docstring's rules)."""
    if layout not in FOLDER_LAYOUTS:
        raise ValueError(f"layout should be one of {FOLDER_LAYOUTS}, but got layout={layout!r}")
    root = Path(root)
    check_root(root)
    found, problems = walk(root)
    labelled, classes = label_by_folder(root, found, problems, layout)
    files = [SourceFile(path, rel, label) for rel, path, label in labelled]
    return ScanResult(root=root, files=tuple(files), classes=classes, problems=tuple(problems))


def label_by_folder(
    root: object, found: list[tuple[str, T]], problems: list[SkippedFile], layout: FolderLayout
) -> tuple[list[tuple[str, T, int]], tuple[str, ...]]:
    """Label ``(relative, where)`` images by their top-level folder; return them sorted, classes.

    Loose images of an ImageFolder tree are added to ``problems``, which is sorted.
    """
    if not found:
        extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
        message = (
            f"no images found under {root} (looked for {extensions}, in any case; hidden "
            "files and OS litter are ignored)"
        )
        if problems:
            first = min(problems, key=lambda p: path_sort_key(p.path))
            message += f"; {len(problems)} entries could not be scanned, e.g. {first.path}: "
            raise SourceError(message + first.reason)
        raise SourceError(message)
    loose = [rel for rel, _ in found if "/" not in rel]
    nested = [rel for rel, _ in found if "/" in rel]
    if layout == "auto":
        if loose and len(loose) >= len(nested):
            if nested:
                raise SourceError(_ambiguous_message(root, loose, nested))
            layout = "flat"
        else:
            layout = "imagefolder"
    if layout == "flat":
        labelled = [(rel, where, -1) for rel, where in found]
        classes: tuple[str, ...] = ()
    else:
        problems.extend(SkippedFile(rel, LOOSE_REASON) for rel in loose)
        classes = tuple(sorted({rel.split("/", 1)[0] for rel in nested}, key=path_sort_key))
        if not classes:
            raise SourceError(
                f"no class folders with images under {root}: an ImageFolder tree keeps each "
                "class's images in a folder named after the class"
            )
        ids = {name: i for i, name in enumerate(classes)}
        labelled = [(rel, where, ids[rel.split("/", 1)[0]]) for rel, where in found if "/" in rel]
    labelled.sort(key=lambda item: path_sort_key(item[0]))
    problems.sort(key=lambda p: path_sort_key(p.path))
    return labelled, classes


def _ambiguous_message(root: object, loose: list[str], nested: list[str]) -> str:
    first_loose = min(loose, key=path_sort_key)
    first_nested = min(nested, key=path_sort_key)
    images = "1 image" if len(loose) == 1 else f"{len(loose)} images"
    return (
        f"{root} has {images} directly inside it (e.g. {first_loose!r}) "
        f"and {len(nested)} in subfolders (e.g. {first_nested!r}), so it is neither a flat "
        "folder nor an ImageFolder tree of class folders with a few stray files; move the "
        "loose images into class folders (or the subfolders' images up), or give every "
        "image's label in a CSV (--labels)"
    )


def group_problems(problems: Iterable[SkippedFile]) -> list[tuple[str, tuple[str, ...]]]:
    """Return ``(reason, paths)`` for each distinct reason, in order of first appearance."""
    groups: dict[str, list[str]] = {}
    for problem in problems:
        groups.setdefault(problem.reason, []).append(problem.path)
    return [(reason, tuple(paths)) for reason, paths in groups.items()]


def name_paths(paths: Sequence[str], *, limit: int = 5) -> str:
    """Return ``paths`` as one phrase, e.g. ``"a.png, b.png and 3 more"``."""
    shown = ", ".join(paths[:limit])
    rest = len(paths) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown
