"""What the archive sources share: which members are images, and their listing as a folder's.

An archive holds what a folder would (``write.scan``'s rules: ImageFolder classes from the
first folder of each path, or a flat folder); an archive made of the folder itself
(``tar -cf images.tar images/``), whose every path starts with one folder, is read as that
folder's content. Members whose path leaves the archive, that are no regular file, that
share their path with another member, or that the archive's end cuts, are problems named
by their path.
"""

from __future__ import annotations

import tarfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath

from h5pack.core.format import SkippedFile
from h5pack.write.scan import has_image_extension, is_ignored_name, label_by_folder
from h5pack.write.sources.base import FileRange, Listing, Sample, label_fields

CUT_SHORT = "cut short: the archive ends inside it"

Found = list[tuple[str, FileRange]]


def image_member(name: str, problems: list[SkippedFile], not_file: str | None = None) -> str | None:
    """Return the relative path of member ``name`` if it is an image to read, else None.

    A path that leaves the archive, or a member that is no regular file (``not_file`` says
    what it is: ``"a link"``), is added to ``problems``.
    """
    pure = PurePosixPath(name)
    parts = [part for part in pure.parts if part != "."]
    if not parts or any(is_ignored_name(part) for part in parts):
        return None
    if not has_image_extension(parts[-1]):
        return None
    relative = "/".join(parts)
    if pure.is_absolute() or ".." in parts:
        problems.append(SkippedFile(relative, "a path that leaves the archive"))
    elif not_file is not None:
        problems.append(SkippedFile(relative, f"{not_file} in the archive, not an image file"))
    else:
        return relative
    return None


def not_a_file(member: tarfile.TarInfo) -> str | None:
    """Return what a tar member is when it is no regular file (``"a link"``), else None."""
    if member.issparse():
        return "a sparse file"
    if member.issym() or member.islnk():
        return "a link"
    return None if member.isfile() else "a special file"


def take_tar_member(
    member: tarfile.TarInfo,
    where: FileRange,
    end: int,
    found: Found,
    problems: list[SkippedFile],
    prefix: str = "",
) -> None:
    """Add a tar member (its bytes at ``where``) to ``found``, to ``problems``, or to neither.

    ``end`` is where the archive's bytes end (a member beyond it is cut short); ``prefix``
    goes before the member's path (an inner archive's name).
    """
    if member.isdir():
        return
    relative = image_member(member.name, problems, not_a_file(member))
    if relative is None:
        return
    if where.offset + max(where.size, 0) > end:
        problems.append(SkippedFile(prefix + relative, CUT_SHORT))
    else:
        found.append((prefix + relative, where))


def archive_listing(
    root: str, found: Found, problems: list[SkippedFile], whole: Sequence[SkippedFile] = ()
) -> Listing:
    """Return the listing of the images ``found`` in the archive ``root``, labelled as a folder.

    ``whole`` are problems of the archive itself (named by its file name, not a member).

    Raises:
        SourceError: no images, or a layout that is no folder's (``label_by_folder``).
    """
    counts = Counter(rel for rel, _ in found)
    twice = sorted(rel for rel, count in counts.items() if count > 1)
    if twice:  # appended again (tar -r): which one was meant cannot be told
        problems.extend(
            SkippedFile(rel, f"{counts[rel]} members of the archive have this path")
            for rel in twice
        )
        found = [item for item in found if counts[item[0]] == 1]
    found, problems = _strip_top_folder(found, problems)
    labelled, classes = label_by_folder(root, found, problems, "auto")
    fields = label_fields([label for _, _, label in labelled])
    samples = [Sample(rel, where, fields[i]) for i, (rel, where, _) in enumerate(labelled)]
    total = sum(where.nbytes() for _, where, _ in labelled)
    return Listing(samples, classes, (*problems, *whole), nbytes=total)


def _strip_top_folder(found: Found, problems: list[SkippedFile]) -> tuple[Found, list[SkippedFile]]:
    """Drop the one folder that every path starts with (an archive made of a folder)."""
    paths = [rel for rel, _ in found] + [p.path for p in problems]
    tops = {rel.split("/", 1)[0] for rel in paths}
    if len(tops) != 1 or not all("/" in rel for rel in paths):
        return found, problems
    cut = len(tops.pop()) + 1
    return (
        [(rel[cut:], where) for rel, where in found],
        [SkippedFile(p.path[cut:], p.reason) for p in problems],
    )


def unread_tail(archive: tarfile.TarFile, end: int) -> str | None:
    """Return why a read tar stopped before its end (``tarfile`` stops at a bad header).

    ``end`` is where its bytes end; None when what follows its last member is its end.
    """
    offset = archive.offset
    if offset + tarfile.BLOCKSIZE > end:
        return None
    assert archive.fileobj is not None
    archive.fileobj.seek(offset)
    if not archive.fileobj.read(tarfile.BLOCKSIZE).strip(b"\0"):
        return None
    members = archive.getmembers()  # loaded already: no second pass
    last = members[-1].name if members else "its start"
    return f"unreadable after {last}: a corrupt member header at byte {offset}"


def tar_members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Yield a tar's members, up to where a cut archive ends, holding none of them.

    ``take_tar_member`` names the member it cuts.
    """
    try:
        while (member := archive.next()) is not None:
            yield member
            del vars(archive)["members"][:-1]  # the last kept, not a million
    except tarfile.ReadError as err:
        if str(err) != "unexpected end of data":
            raise
