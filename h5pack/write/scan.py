"""Find the images under a source folder, with their labels and class names.

Two folder layouts are recognised, and a labels CSV covers any other::

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
refuses (pass a labels CSV, or move the images).
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

import csv
import io
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal, TypeVar, get_args

from h5pack._types import StrPath
from h5pack.core.format import SkippedFile
from h5pack.errors import OptionsError, SourceError
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
        unlisted: With a labels CSV, the images under the root that it does not list
            (sorted): not samples, and not problems either (a CSV may pick a split), but
            a user should hear how many were left out.
    """

    root: Path
    files: tuple[SourceFile, ...]
    classes: tuple[str, ...]
    problems: tuple[SkippedFile, ...] = ()
    unlisted: tuple[str, ...] = ()

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


def scan(
    root: StrPath,
    *,
    labels_csv: StrPath | None = None,
    layout: FolderLayout = "auto",
) -> ScanResult:
    """Find the images under ``root`` and label them (see the module docstring for the rules).

    Args:
        root: The source folder.
        labels_csv: A CSV of ``path,label`` rows (header optional) for any other layout:
            paths relative to ``root``; labels are class ids when every label is an integer
            (``classes`` are then ``"0"..str(max)``), else class names (numbered in sorted
            order). Only the listed files are samples.
        layout: ``"auto"``, ``"imagefolder"`` or ``"flat"``; must be ``"auto"`` with
            ``labels_csv``.

    Returns:
        The samples, classes and scan problems.

    Raises:
        SourceError: ``root`` is missing, is a file, holds no images, holds as many loose
            images as images in subfolders under ``layout="auto"`` or more, or
            ``labels_csv`` has a bad line.
        OptionsError: ``layout`` is not ``"auto"`` while ``labels_csv`` is given.
        ValueError: ``layout`` is not one of :data:`FOLDER_LAYOUTS`.
    """
    if layout not in FOLDER_LAYOUTS:
        raise ValueError(f"layout should be one of {FOLDER_LAYOUTS}, but got layout={layout!r}")
    root = Path(root)
    check_root(root)
    if labels_csv is not None:
        if layout != "auto":
            raise OptionsError(
                f"a labels CSV sets the labels itself: layout should be 'auto' with "
                f"labels_csv, but got layout={layout!r}"
            )
        return _scan_csv(root, Path(labels_csv))

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


def _scan_csv(root: Path, csv_path: Path) -> ScanResult:
    """Build the samples from a ``path,label`` CSV (see :func:`scan`)."""
    try:
        # utf-8-sig drops the byte-order mark spreadsheets write; surrogateescape keeps
        # file names that are not UTF-8 as os.fsdecode would.
        text = csv_path.read_text(encoding="utf-8-sig", errors="surrogateescape")
    except OSError as err:
        raise SourceError(f"cannot read labels CSV {csv_path}: {err.strerror}") from err

    rows: list[tuple[int, str, str]] = []
    seen: dict[str, int] = {}
    first = True
    reader = csv.reader(io.StringIO(text))
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        where = f"{csv_path}, line {line} ({','.join(row)!r})"
        if len(row) != 2:
            raise SourceError(f"{where}: expected 2 columns 'path,label', but got {len(row)}")
        path_text, label_text = row[0].strip(), row[1].strip()
        is_header = first and (path_text.lower(), label_text.lower()) == ("path", "label")
        first = False
        if is_header:
            continue
        if not path_text or not label_text:
            raise SourceError(f"{where}: the path and the label should both be non-empty")
        relative = _check_listed_file(root, path_text, where)
        if relative in seen:
            raise SourceError(f"{where}: {relative!r} is already listed on line {seen[relative]}")
        seen[relative] = line
        rows.append((line, relative, label_text))
    if not rows:
        raise SourceError(f"labels CSV {csv_path} lists no images")

    classes, labels = _labels_from_text(csv_path, rows)
    files = [
        SourceFile(root / relative, relative, label)
        for (_, relative, _), label in zip(rows, labels, strict=True)
    ]
    files.sort(key=lambda f: path_sort_key(f.relative))
    listed = {f.relative for f in files}
    found, _ = walk(root)
    unlisted = tuple(sorted((rel for rel, _ in found if rel not in listed), key=path_sort_key))
    return ScanResult(root=root, files=tuple(files), classes=classes, unlisted=unlisted)


def _check_listed_file(root: Path, path_text: str, where: str) -> str:
    """Return the normalised relative path of a CSV row, or raise naming the row."""
    pure = PurePosixPath(path_text)
    if pure.is_absolute() or ".." in pure.parts:
        raise SourceError(f"{where}: the path should be relative to {root} and stay inside it")
    relative = "/".join(pure.parts)
    if not relative or relative == ".":
        raise SourceError(f"{where}: the path names no file")
    try:
        mode = os.stat(root / relative).st_mode
    except FileNotFoundError as err:
        raise SourceError(f"{where}: {relative!r} does not exist under {root}") from err
    except OSError as err:
        raise SourceError(f"{where}: cannot access {relative!r}: {err.strerror}") from err
    if not stat.S_ISREG(mode):
        raise SourceError(f"{where}: {relative!r} is not a regular file")
    if not has_image_extension(relative):
        extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
        raise SourceError(f"{where}: {relative!r} is not an image file ({extensions})")
    return relative


def _labels_from_text(
    csv_path: Path, rows: list[tuple[int, str, str]]
) -> tuple[tuple[str, ...], list[int]]:
    """Return ``(classes, labels)``: integer ids when every label is an integer, else names."""
    try:
        ids = [int(text) for _, _, text in rows]
    except ValueError:
        names = tuple(sorted({text for _, _, text in rows}, key=path_sort_key))
        index = {name: i for i, name in enumerate(names)}
        return names, [index[text] for _, _, text in rows]
    for (line, _, text), label in zip(rows, ids, strict=True):
        if label < 0:
            raise SourceError(
                f"{csv_path}, line {line}: a class id should be >= 0, but got label={text}"
            )
    return tuple(str(i) for i in range(max(ids) + 1)), ids
