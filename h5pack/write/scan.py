"""Find the images under a source folder, with their labels and class names.

Two folder layouts are recognised, and a manifest (``write.manifest``) covers any other::

    ImageFolder (labelled)                    flat (unlabelled)

    root/                                     root/
    ├── cat/                 label 0          ├── 0001.jpg        label -1
    │   ├── 001.jpg                           ├── 0002.png        label -1
    │   └── kittens/                          └── ...
    │       └── 002.png      label 0 (nested files belong to their top-level class)
    ├── dog/                 label 1
    │   └── 003.JPG
    └── empty/               not a class (holds no image)

``layout="auto"`` picks ImageFolder when images sit only in subfolders, flat when they sit
only directly in the root. A root that has both is taken as an ImageFolder tree with stray
files when the loose images are fewer than those in class folders (a ``preview.png`` beside
a million class images): the loose ones are reported in :attr:`ScanResult.problems`, so a
conversion skips and records them (and refuses them under ``--strict``). When loose images
are as many as the others or more, which layout was meant cannot be guessed and the scan
refuses (pass a manifest, or move the images).
``layout="flat"`` packs every image of the tree, nested or not, unlabelled;
``layout="imagefolder"`` ignores (and reports) images directly in the root, as torchvision's
``ImageFolder`` does.

Class ids are dense: the classes are the sorted top-level folders that hold at least one
image, numbered 0..K-1. A class folder that holds no image is not a class, so that every
class id has samples and ``classes`` always agrees with the labels (torchvision's
``ImageFolder`` raises on such a folder instead).

What is never a sample: hidden files and folders (a name starting with ``.``, which covers
``.DS_Store`` and macOS ``._*`` resource forks), ``Thumbs.db``, ``desktop.ini``,
``__MACOSX/``, files whose extension is not in :data:`IMAGE_EXTENSIONS` (compared without
case), folders whose name looks like an image (``x.jpg/`` is walked as a folder), and special
files (FIFOs, sockets, devices: recognised from ``stat``, never opened). Symbolic links to
files and folders are followed; a link back to an enclosing folder is not followed again
(loops end), and dangling links, link loops and unreadable folders are reported in
:attr:`ScanResult.problems` instead of failing the scan.

Order is deterministic: files sort by the bytes of their relative path
(``os.fsencode``), and class names sort the same way. Names that are not valid UTF-8 keep
their bytes as surrogate escapes (``os.fsdecode``), so ``os.fsencode(relative)`` gives the
original name back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from h5pack._types import StrPath
from h5pack.core.fields import StoredField
from h5pack.core.format import SkippedFile
from h5pack.errors import SourceError
from h5pack.write.walk import IMAGE_EXTENSIONS as IMAGE_EXTENSIONS  # re-exported
from h5pack.write.walk import check_root, walk
from h5pack.write.walk import has_image_extension as has_image_extension
from h5pack.write.walk import is_ignored_name as is_ignored_name

FolderLayout = Literal["auto", "imagefolder", "flat"]
FOLDER_LAYOUTS: tuple[FolderLayout, ...] = get_args(FolderLayout)

T = TypeVar("T")

LOOSE_REASON = (
    "image directly in the source folder, beside the class folders: it belongs to no class "
    "(move it into a class folder to pack it)"
)
"""Why an image directly in an ImageFolder root is not a sample (see :func:`scan`)."""


@dataclass(frozen=True)
class SourceFile:
    """One image found by :func:`scan`.

    Attributes:
        path: Path to open: the root joined with ``relative`` (symlinks are followed when
            opening).
        relative: Path relative to the root, ``/``-separated; bytes that are not UTF-8 are
            kept as surrogate escapes, so ``os.fsencode(relative)`` round-trips.
        label: Class id in ``0..K-1``, or ``-1`` when the source is unlabelled.
    """

    path: Path
    relative: str
    label: int


@dataclass(frozen=True)
class ScanResult:
    """The images under a root, in deterministic order, with their classes.

    Attributes:
        root: The scanned root.
        files: The samples, sorted by ``os.fsencode(relative)``.
        classes: Class names; labels index into it (empty when unlabelled).
        problems: Entries that could not be scanned (dangling symlinks, symlink loops,
            unreadable folders, special files named like images, images outside any class
            folder), sorted by path. Reported, not fatal.
        unlisted: With a manifest, the images under the root that it does not list
            (sorted): not samples, and not problems either (a manifest may pick a split),
            but a user should hear how many were left out.
        fields: With a manifest, the stored fields its columns give (``core.fields``).
        columns: Their values, a column per field in the order of ``files``.
    """

    root: Path
    files: tuple[SourceFile, ...]
    classes: tuple[str, ...]
    problems: tuple[SkippedFile, ...] = ()
    unlisted: tuple[str, ...] = ()
    fields: tuple[StoredField, ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)

    @property
    def labelled(self) -> bool:
        """Whether the samples carry class labels."""
        return bool(self.classes)


def path_sort_key(relative: str) -> bytes:
    """Return the key that orders relative paths (and class names): their file-system bytes."""
    return os.fsencode(relative)


def classes_of(relatives: Iterable[str]) -> tuple[str, ...]:
    """Return the sorted top-level folder names of the nested paths among ``relatives``."""
    names = {rel.split("/", 1)[0] for rel in relatives if "/" in rel}
    return tuple(sorted(names, key=path_sort_key))


def scan(root: StrPath, *, layout: FolderLayout = "auto") -> ScanResult:
    """Find the images under ``root`` and label them (see the module docstring for the rules).

    Args:
        root: The source folder.
        layout: ``"auto"``, ``"imagefolder"`` or ``"flat"``.

    Returns:
        The samples, classes and scan problems.

    Raises:
        SourceError: ``root`` is missing, is a file, holds no images, holds as many loose
            images as images in subfolders under ``layout="auto"`` or more.
        ValueError: ``layout`` is not one of :data:`FOLDER_LAYOUTS`.
    """
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
    """Label the images ``found`` under ``root`` by their top-level folder (the module's rules).

    Args:
        root: The folder (or archive) named in messages.
        found: ``(relative path, where it is)`` of every image candidate.
        problems: The listing's problems; loose images of an ImageFolder tree are added, and
            the list is sorted.
        layout: ``"auto"``, ``"imagefolder"`` or ``"flat"``.

    Returns:
        ``(relative, where, label)`` sorted by path, and the class names.

    Raises:
        SourceError: no images, no class folders, or as many loose images as nested ones.
    """
    if not found:
        raise SourceError(_no_images_message(root, problems))
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
        classes = classes_of(nested)
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
    return (
        f"{root} has {_count(len(loose), 'image')} directly inside it (e.g. {first_loose!r}) "
        f"and {len(nested)} in subfolders (e.g. {first_nested!r}), so it is neither a flat "
        "folder nor an ImageFolder tree of class folders with a few stray files; move the "
        "loose images into class folders (or the subfolders' images up), or give every "
        "image's label in a CSV (--labels)"
    )


def _count(num: int, noun: str) -> str:
    return f"{num} {noun}" if num == 1 else f"{num} {noun}s"


def group_problems(problems: Iterable[SkippedFile]) -> list[tuple[str, tuple[str, ...]]]:
    """Return ``(reason, paths)`` for each distinct reason, in order of first appearance.

    A conversion warns once per kind of problem (one line for a hundred loose images)
    while recording every file.
    """
    groups: dict[str, list[str]] = {}
    for problem in problems:
        groups.setdefault(problem.reason, []).append(problem.path)
    return [(reason, tuple(paths)) for reason, paths in groups.items()]


def name_paths(paths: Sequence[str], *, limit: int = 5) -> str:
    """Return ``paths`` as one phrase, e.g. ``"a.png, b.png and 3 more"``."""
    shown = ", ".join(paths[:limit])
    rest = len(paths) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


def _no_images_message(root: object, problems: list[SkippedFile]) -> str:
    extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
    message = (
        f"no images found under {root} (looked for {extensions}, in any case; hidden files "
        "and OS litter are ignored)"
    )
    if problems:
        first = min(problems, key=lambda p: path_sort_key(p.path))
        message += f"; {len(problems)} entries could not be scanned, e.g. {first.path}: "
        message += first.reason
    return message
