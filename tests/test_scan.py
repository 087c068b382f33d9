"""Tests for h5pack.write.scan: layouts, labels, hostile file trees (manifests: elsewhere)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from h5pack.core.format import SkippedFile
from h5pack.errors import SourceError
from h5pack.write.scan import (
    IMAGE_EXTENSIONS,
    LOOSE_REASON,
    ScanResult,
    SourceFile,
    group_problems,
    has_image_extension,
    name_paths,
    scan,
)

# Scanning never opens images, so any bytes do; a real PNG signature keeps it honest.
PNG_BYTES = b"\x89PNG\r\n\x1a\n" + bytes(24)


def touch(root: Path, relative: str, data: bytes = PNG_BYTES) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def relatives(result: ScanResult) -> list[str]:
    return [f.relative for f in result.files]


def labelled(result: ScanResult) -> dict[str, str]:
    """Map each relative path to its class name, through the labels (checks they agree)."""
    return {f.relative: result.classes[f.label] for f in result.files}


@pytest.fixture
def imagefolder(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for rel in ["dog/b.png", "dog/a.jpg", "cat/1.jpg", "cat/kittens/deep/2.png", "bird/x.gif"]:
        touch(root, rel)
    return root


# --- layouts -----------------------------------------------------------------------------


def test_imagefolder_sorted_classes_dense_labels_nested_files(imagefolder: Path) -> None:
    result = scan(imagefolder)
    assert result.classes == ("bird", "cat", "dog")
    assert relatives(result) == [
        "bird/x.gif",
        "cat/1.jpg",
        "cat/kittens/deep/2.png",
        "dog/a.jpg",
        "dog/b.png",
    ]
    assert [f.label for f in result.files] == [0, 1, 1, 2, 2]
    assert result.classes
    assert result.problems == ()
    for f in result.files:
        assert f.path == imagefolder / f.relative
        assert f.path.is_file()


def test_scan_is_deterministic(imagefolder: Path) -> None:
    assert scan(imagefolder) == scan(str(imagefolder))


def test_flat_folder_is_unlabelled(tmp_path: Path) -> None:
    for name in ["b.png", "a.JPG", "c.webp"]:
        touch(tmp_path, name)
    result = scan(tmp_path)
    assert relatives(result) == ["a.JPG", "b.png", "c.webp"]
    assert {f.label for f in result.files} == {-1}
    assert result.classes == ()
    assert not result.classes


def test_as_many_loose_images_as_class_images_is_refused(tmp_path: Path) -> None:
    touch(tmp_path, "loose.jpg")
    touch(tmp_path, "cat/1.jpg")
    with pytest.raises(SourceError, match=r"1 image directly inside it.*--labels") as info:
        scan(tmp_path)
    assert "loose.jpg" in str(info.value)
    assert "cat/1.jpg" in str(info.value)
    assert "layout 'flat'" not in str(info.value)  # no flag gives it at the command line


@pytest.mark.parametrize("num_loose", [1, 2])
def test_a_few_stray_images_beside_class_folders_are_reported_not_fatal(
    tmp_path: Path, num_loose: int
) -> None:
    for name in ("preview.png", "notes.jpg")[:num_loose]:
        touch(tmp_path, name)
    for rel in ("cat/1.jpg", "cat/2.jpg", "dog/3.jpg"):
        touch(tmp_path, rel)
    result = scan(tmp_path)
    assert labelled(result) == {"cat/1.jpg": "cat", "cat/2.jpg": "cat", "dog/3.jpg": "dog"}
    loose = sorted(["preview.png", "notes.jpg"][:num_loose])
    assert [p.path for p in result.problems] == loose
    assert {p.reason for p in result.problems} == {LOOSE_REASON}
    assert "belongs to no class" in LOOSE_REASON


def test_problems_are_grouped_by_reason_for_one_warning_each() -> None:
    problems = [
        SkippedFile("a.png", LOOSE_REASON),
        SkippedFile("x/link.jpg", "dangling symlink"),
        SkippedFile("b.png", LOOSE_REASON),
    ]
    assert group_problems(problems) == [
        (LOOSE_REASON, ("a.png", "b.png")),
        ("dangling symlink", ("x/link.jpg",)),
    ]
    assert name_paths(["a", "b"]) == "a, b"
    assert name_paths([str(i) for i in range(8)], limit=3) == "0, 1, 2 and 5 more"


def test_explicit_flat_layout_takes_everything_unlabelled(tmp_path: Path) -> None:
    touch(tmp_path, "loose.jpg")
    touch(tmp_path, "cat/1.jpg")
    result = scan(tmp_path, layout="flat")
    assert relatives(result) == ["cat/1.jpg", "loose.jpg"]
    assert [f.label for f in result.files] == [-1, -1]
    assert result.classes == ()


def test_explicit_imagefolder_reports_loose_images(tmp_path: Path) -> None:
    touch(tmp_path, "loose.jpg")
    touch(tmp_path, "cat/1.jpg")
    result = scan(tmp_path, layout="imagefolder")
    assert labelled(result) == {"cat/1.jpg": "cat"}
    assert [p.path for p in result.problems] == ["loose.jpg"]
    assert result.problems[0].reason == LOOSE_REASON


def test_imagefolder_layout_without_class_folders_is_refused(tmp_path: Path) -> None:
    touch(tmp_path, "loose.jpg")
    with pytest.raises(SourceError, match="no class folders"):
        scan(tmp_path, layout="imagefolder")


def test_bad_layout_value(tmp_path: Path) -> None:
    touch(tmp_path, "a.jpg")
    with pytest.raises(ValueError, match="layout should be one of"):
        scan(tmp_path, layout="folders")  # type: ignore[arg-type]


def test_empty_class_folders_are_not_classes(tmp_path: Path) -> None:
    touch(tmp_path, "b/1.jpg")
    touch(tmp_path, "d/2.jpg")
    (tmp_path / "a_empty").mkdir()
    touch(tmp_path, "c_notes/readme.txt")  # holds files, but no image
    (tmp_path / "e_nested_empty" / "sub").mkdir(parents=True)
    result = scan(tmp_path)
    assert result.classes == ("b", "d")
    assert labelled(result) == {"b/1.jpg": "b", "d/2.jpg": "d"}
    assert sorted({f.label for f in result.files}) == [0, 1]


# --- what is never a sample ------------------------------------------------------------


def test_hostile_entries_are_not_samples(tmp_path: Path) -> None:
    touch(tmp_path, "cat/ok.jpg")
    touch(tmp_path, "cat/UPPER.JPEG")
    touch(tmp_path, "cat/Mixed.Png")
    touch(tmp_path, "cat/.hidden.jpg")
    touch(tmp_path, "cat/._ok.jpg")  # macOS resource fork
    touch(tmp_path, "cat/.DS_Store")
    touch(tmp_path, "cat/Thumbs.db")
    touch(tmp_path, "cat/desktop.ini")
    touch(tmp_path, "cat/notes.txt")
    touch(tmp_path, "cat/archive.jpg.zip")
    touch(tmp_path, "cat/noext")
    touch(tmp_path, "cat/.thumbnails/t.jpg")  # hidden folder
    touch(tmp_path, "__MACOSX/cat/._ok.jpg")
    touch(tmp_path, "__MACOSX/cat/real_looking.jpg")
    touch(tmp_path, ".git/objects/x.png")
    touch(tmp_path, "cat/folder.jpg/inner.png")  # a folder named like an image
    result = scan(tmp_path)
    assert result.classes == ("cat",)
    assert relatives(result) == [
        "cat/Mixed.Png",
        "cat/UPPER.JPEG",
        "cat/folder.jpg/inner.png",
        "cat/ok.jpg",
    ]
    assert result.problems == ()


@pytest.mark.parametrize("ext", sorted(IMAGE_EXTENSIONS))
def test_every_extension_in_any_case(tmp_path: Path, ext: str) -> None:
    touch(tmp_path, "lower" + ext)
    touch(tmp_path, "upper" + ext.upper())
    assert relatives(scan(tmp_path)) == ["lower" + ext, "upper" + ext.upper()]


def test_has_image_extension() -> None:
    assert has_image_extension("a.JPG")
    assert has_image_extension("dir/a.b.tiff")
    assert not has_image_extension("a.jpg.txt")
    assert not has_image_extension("jpg")


def test_fifo_named_like_an_image_is_reported_never_opened(tmp_path: Path) -> None:
    touch(tmp_path, "cat/ok.jpg")
    os.mkfifo(tmp_path / "cat" / "pipe.jpg")  # opening it for reading would block forever
    os.mkfifo(tmp_path / "cat" / "pipe.dat")
    result = scan(tmp_path)
    assert relatives(result) == ["cat/ok.jpg"]
    assert [(p.path, p.reason) for p in result.problems] == [
        ("cat/pipe.jpg", "a FIFO, not an image file")
    ]


def test_socket_named_like_an_image_is_reported(tmp_path: Path) -> None:
    touch(tmp_path, "ok.jpg")
    # AF_UNIX paths are limited to ~107 bytes; bind from inside the folder.
    cwd = Path.cwd()
    sock = socket.socket(socket.AF_UNIX)
    try:
        os.chdir(tmp_path)
        sock.bind("sock.png")
    finally:
        os.chdir(cwd)
        sock.close()
    result = scan(tmp_path)
    assert relatives(result) == ["ok.jpg"]
    assert [(p.path, p.reason) for p in result.problems] == [
        ("sock.png", "a socket, not an image file")
    ]


# --- symlinks ----------------------------------------------------------------------------


def test_symlinked_class_dir_and_file_are_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    touch(outside, "cats/1.jpg")
    touch(outside, "cats/sub/2.png")
    touch(outside, "lone.png")
    root = tmp_path / "src"
    touch(root, "dog/d.jpg")
    (root / "cat").symlink_to(outside / "cats", target_is_directory=True)
    (root / "dog" / "linked.png").symlink_to(outside / "lone.png")
    result = scan(root)
    assert labelled(result) == {
        "cat/1.jpg": "cat",
        "cat/sub/2.png": "cat",
        "dog/d.jpg": "dog",
        "dog/linked.png": "dog",
    }
    assert (result.files[0].path).read_bytes() == PNG_BYTES
    assert result.problems == ()


def test_symlink_loops_end_and_are_reported(tmp_path: Path) -> None:
    touch(tmp_path, "cat/1.jpg")
    (tmp_path / "cat" / "up").symlink_to(tmp_path, target_is_directory=True)  # -> root
    (tmp_path / "cat" / "self").symlink_to(tmp_path / "cat", target_is_directory=True)
    (tmp_path / "cat" / "ring.jpg").symlink_to(tmp_path / "cat" / "ring.jpg")  # ELOOP
    (tmp_path / "cat" / "ping.jpg").symlink_to(tmp_path / "cat" / "pong.jpg")
    (tmp_path / "cat" / "pong.jpg").symlink_to(tmp_path / "cat" / "ping.jpg")
    result = scan(tmp_path)
    assert relatives(result) == ["cat/1.jpg"]
    reasons = {p.path: p.reason for p in result.problems}
    assert set(reasons) == {"cat/up", "cat/self", "cat/ring.jpg", "cat/ping.jpg", "cat/pong.jpg"}
    assert all("loop" in reason for reason in reasons.values())


def test_two_links_to_one_folder_are_both_walked(tmp_path: Path) -> None:
    touch(tmp_path, "shared/1.jpg")
    root = tmp_path / "src"
    root.mkdir()
    (root / "a").symlink_to(tmp_path / "shared", target_is_directory=True)
    (root / "b").symlink_to(tmp_path / "shared", target_is_directory=True)
    assert labelled(scan(root)) == {"a/1.jpg": "a", "b/1.jpg": "b"}


def test_dangling_symlink_is_reported(tmp_path: Path) -> None:
    touch(tmp_path, "cat/1.jpg")
    (tmp_path / "cat" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (tmp_path / "gone_dir").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    result = scan(tmp_path)
    assert relatives(result) == ["cat/1.jpg"]
    assert [(p.path, p.reason) for p in result.problems] == [
        ("cat/gone.jpg", "dangling symlink"),
        ("gone_dir", "dangling symlink"),
    ]


def test_root_may_be_a_symlink(tmp_path: Path) -> None:
    touch(tmp_path, "real/cat/1.jpg")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    result = scan(tmp_path / "link")
    assert labelled(result) == {"cat/1.jpg": "cat"}
    assert result.files[0].path == tmp_path / "link" / "cat" / "1.jpg"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders whatever their mode")
def test_unreadable_folder_is_reported(tmp_path: Path) -> None:
    touch(tmp_path, "cat/1.jpg")
    touch(tmp_path, "dog/locked/2.jpg")
    touch(tmp_path, "dog/3.jpg")
    locked = tmp_path / "dog" / "locked"
    locked.chmod(0)
    try:
        result = scan(tmp_path)
    finally:
        locked.chmod(0o755)
    assert relatives(result) == ["cat/1.jpg", "dog/3.jpg"]
    assert [p.path for p in result.problems] == ["dog/locked"]


def test_unlistable_folder_is_reported_any_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same as above, for runs as root (which chmod cannot lock out).
    touch(tmp_path, "cat/1.jpg")
    touch(tmp_path, "dog/locked/2.jpg")
    touch(tmp_path, "dog/3.jpg")
    real_scandir = os.scandir
    locked = os.fspath(tmp_path / "dog" / "locked")

    def scandir(path: str) -> object:
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    result = scan(tmp_path)
    assert relatives(result) == ["cat/1.jpg", "dog/3.jpg"]
    assert [(p.path, p.reason) for p in result.problems] == [
        ("dog/locked", "cannot list folder: Permission denied")
    ]
    monkeypatch.setattr(os, "scandir", lambda path: scandir(locked))
    with pytest.raises(SourceError, match="cannot list source folder"):
        scan(tmp_path)


# --- names -------------------------------------------------------------------------------


def test_non_utf8_file_name_round_trips(tmp_path: Path) -> None:
    raw_name = b"caf\xe9-\xff.jpg"  # Latin-1 bytes: not valid UTF-8
    raw_class = b"cl\xe4ss"
    os.makedirs(os.path.join(os.fsencode(tmp_path), raw_class))
    with open(os.path.join(os.fsencode(tmp_path), raw_class, raw_name), "wb") as f:
        f.write(PNG_BYTES)
    touch(tmp_path, "plain/a.jpg")
    result = scan(tmp_path)
    assert result.classes == (os.fsdecode(raw_class), "plain")
    odd = result.files[0]
    assert os.fsencode(odd.relative) == raw_class + b"/" + raw_name
    assert odd.path.read_bytes() == PNG_BYTES
    assert result.files[1].relative == "plain/a.jpg"


def test_files_sort_by_bytes_not_by_locale(tmp_path: Path) -> None:
    for name in ["b.jpg", "B.jpg", "a.jpg", "é.jpg", "_.jpg", "10.jpg", "9.jpg"]:
        touch(tmp_path, name)
    got = relatives(scan(tmp_path))
    assert got == sorted(got, key=os.fsencode)
    assert got[:2] == ["10.jpg", "9.jpg"]
    assert got[-1] == "é.jpg"


# --- errors on the root ---------------------------------------------------------------


def test_missing_root(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SourceError, match="does not exist") as info:
        scan(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, FileNotFoundError)


def test_root_is_a_file(tmp_path: Path) -> None:
    path = touch(tmp_path, "a.jpg")
    with pytest.raises(SourceError, match="is a file") as info:
        scan(path)
    assert str(path) in str(info.value)


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no images found under") as info:
        scan(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert ".jpg" in message
    assert ".png" in message


def test_folder_of_litter_only_is_empty(tmp_path: Path) -> None:
    touch(tmp_path, ".DS_Store")
    touch(tmp_path, "cat/notes.txt")
    touch(tmp_path, "__MACOSX/a.jpg")
    (tmp_path / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(SourceError, match="no images found") as info:
        scan(tmp_path)
    assert "gone.jpg: dangling symlink" in str(info.value)


def test_source_file_is_frozen() -> None:
    item = SourceFile(Path("a.jpg"), "a.jpg", 0)
    with pytest.raises(AttributeError):
        item.label = 1  # type: ignore[misc]
