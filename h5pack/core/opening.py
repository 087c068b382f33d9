"""Opening a pack and reading its metadata, with messages that name the file (``core.format``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py

from h5pack._types import StrPath
from h5pack.core.description import HDF5Index, PackIndex
from h5pack.core.integrity import PackIdentity
from h5pack.core.names import (
    DAMAGED,
    FORMAT_MARKER,
    FORMAT_MARKER_KEY,
    FORMAT_VERSION,
    FORMAT_VERSION_KEY,
    PACK_ID_KEY,
    VIRTUAL_SOURCES_KEY,
)
from h5pack.errors import FormatError, H5PackError, PackNotFoundError, PackReplacedError

if TYPE_CHECKING:
    from h5pack.core.store import Store


@contextmanager
def reading(path: str, what: str) -> Iterator[None]:
    """Turn any error HDF5 (or a damaged JSON text) raises reading ``what`` into ``FormatError``.

    h5pack's own errors pass through.
    """
    try:
        yield
    except H5PackError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError) as err:
        raise FormatError(f"{path}: {what} cannot be read ({err}); {DAMAGED}") from err


def as_text(value: Any) -> str:
    """Return an attribute's text (bytes decoded as UTF-8, undecodable bytes kept)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def attr_text(attrs: Any, key: str, path: str) -> str:
    """Return text attribute ``key``; a missing one raises ``FormatError`` naming ``path``."""
    if key not in attrs:
        raise FormatError(f"{path}: pack attribute {key!r} is missing")
    return as_text(attrs[key])


def check_is_pack(handle: h5py.File | PackIndex, path: str) -> int:
    """Return the format version of an open file.

    Raises:
        FormatError: no h5pack marker, a newer format version, or damaged root attributes.
    """
    with reading(path, "the pack's root attributes"):
        attrs = handle.attrs
        marker = attrs.get(FORMAT_MARKER_KEY)
        if isinstance(marker, bytes):
            marker = marker.decode("utf-8", "replace")
        if marker != FORMAT_MARKER:
            raise FormatError(
                f"{path} is an HDF5 file but not an h5pack pack (no {FORMAT_MARKER_KEY!r} "
                f"attribute); create one with `h5pack convert IMAGES {path}`"
            )
        version = int(attrs.get(FORMAT_VERSION_KEY, -1))
        if VIRTUAL_SOURCES_KEY in attrs:  # docs/decisions/0160-no-virtual-packs.md
            raise FormatError(
                f"{path} is a virtual pack (h5pack merge --virtual), which h5pack no longer "
                f"reads: merge its sources again without --virtual (h5pack merge SOURCES "
                f"{path} --overwrite), or read their directory (packset.json) as a pack set"
            )
    if version > FORMAT_VERSION:
        raise FormatError(
            f"{path} is a pack of format version {version}, but this h5pack reads up to "
            f"version {FORMAT_VERSION}; upgrade h5pack"
        )
    if version < 1:
        raise FormatError(f"{path}: invalid pack format version {version}")
    return version


def _plain(err: OSError) -> str:
    """Return a sentence before HDF5's words for the failures a user can act on."""
    text = str(err)
    if "truncated file" in text:
        return (
            "the file is shorter than its header says: it was cut off (an interrupted copy "
            f"or download?); re-create it or copy it again ({text})"
        )
    if "signature" in text:
        return f"no HDF5 signature where one should be ({text})"
    return text


# A conversion's hidden temporary file (write.publish.temp_path): ".NAME.PID[TAG].tmp".
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)[^.]*\.tmp$")


def _locked_message(path: Path) -> str:
    """Say what a user can do about a file that a writer holds, on the CLI and in Python."""
    temp = _TEMP_NAME.match(path.name)
    if temp is not None:
        return (
            f"{path} is the hidden temporary file of a conversion still running (process "
            f"{temp['pid']}): the pack appears as {path.parent / temp['name']} when it is "
            "complete; read that"
        )
    return (
        f"{path} is locked by a process writing it: wait for it to finish, or read anyway "
        "with file locking off (HDF5_USE_FILE_LOCKING=FALSE in the environment of the "
        "command, or locking=False in Python)"
    )


def open_h5(path: StrPath, *, locking: bool | None = None, **kwargs: Any) -> h5py.File:
    """Open ``path`` read-only with h5pack's plugins registered; clear errors for bad paths.

    Args:
        path: The file to open.
        locking: HDF5 file locking (``False``: network file systems, a file a writer holds);
            None keeps HDF5's default.
        **kwargs: Passed to ``h5py.File`` (e.g. ``rdcc_nbytes``).

    Raises:
        FileNotFoundError: the path does not exist.
        FormatError: the path is not an HDF5 file, or one too damaged to open.
    """
    import hdf5plugin  # noqa: F401  (registers the LZ4/Zstd/Blosc/Bitshuffle filters)

    text = os.fspath(path)
    if not Path(text).exists():
        raise PackNotFoundError(f"{text}: no such pack")
    if Path(text).is_dir():
        raise FormatError(f"{text} is a directory, not a pack")
    if not Path(text).is_file():  # HDF5 would wait forever on a FIFO nobody writes
        raise FormatError(
            f"{text} is not a regular file (a FIFO, a socket or a device): a pack is a file"
        )
    if locking is not None:
        kwargs["locking"] = locking
    try:
        return h5py.File(text, "r", **kwargs)
    except BlockingIOError as err:
        raise FormatError(_locked_message(Path(text))) from err
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        if isinstance(err, OSError) and "file signature not found" in str(err):
            raise FormatError(f"{text} is not a readable HDF5 file ({err})") from err
        detail = _plain(err) if isinstance(err, OSError) else str(err)
        raise FormatError(f"{text} is not a readable HDF5 file: {detail}") from err


def open_index(
    path: StrPath, *, store: Store | None = None, locking: bool | None = None, **kwargs: Any
) -> PackIndex:
    """Describe the pack at ``path`` (NOTE [ Compact index ]); close the description after.

    Args:
        path: A local path, or a URL of a remote ``store`` (its compact index: 1-2 requests).
        store: The store ``path`` is in; None: a local path.
        locking: HDF5 file locking of a local pack (see ``open_h5``).
        **kwargs: Passed to ``h5py.File`` where HDF5 opens the pack (the chunk cache).
    """
    text = os.fspath(path)
    if store is not None and store.remote:
        from h5pack.core.remote import open_remote

        return open_remote(store.source(text), **kwargs)
    return HDF5Index(open_h5(text, locking=locking, **kwargs), text)


def described(handle: h5py.File | PackIndex, path: str | None) -> PackIndex:
    """Return ``handle``'s description (an open HDF5 file's, read as asked)."""
    if isinstance(handle, PackIndex):
        return handle
    return HDF5Index(handle, path or handle.filename)


def identity_of(handle: h5py.File | PackIndex, path: str) -> PackIdentity:
    """Return the identity (pack id and status) of the file ``handle`` has open.

    The status is the open descriptor's (a URL's: the size and ETag its first answer told),
    so it names the file actually read even if the path was replaced meanwhile.
    """
    index = described(handle, path)
    with reading(path, f"the pack attribute {PACK_ID_KEY!r}"):
        raw = index.attrs.get(PACK_ID_KEY)
    pack_id = as_text(raw) if raw is not None else None
    found = index.identity(pack_id)
    if found is not None:
        return found
    try:
        stat = os.fstat(int(index.hdf5().id.get_vfd_handle()))
    except (OSError, ValueError, TypeError, RuntimeError):
        stat = os.stat(path)  # a driver without a descriptor
    return PackIdentity.of(stat, pack_id)


def check_identity(path: str, expected: PackIdentity | None, found: PackIdentity | None) -> None:
    """Raise ``PackReplacedError`` unless ``found`` is the file ``expected`` describes."""
    if expected is None or found is None:
        return
    changes = expected.changes(found)
    if changes:
        raise PackReplacedError(
            f"{path} was replaced since the dataset was created ({'; '.join(changes)}); "
            "rebuild the loader (a dataset never mixes the labels of one file with the "
            "images of another)"
        )
