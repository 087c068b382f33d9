"""The target file of a conversion: checks, a hidden temporary name, publishing, signals.

A pack is written to ``.<name>.<pid>.tmp`` beside the target and published only when
complete, so a killed conversion never leaves a half-written pack under the target's name;
the next one removes what it left (``leftovers``; docs/ARCHITECTURE.md, "Crash safety").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.core.index import append_index
from h5pack.core.units import binary_bytes
from h5pack.errors import H5PackError, OptionsError, TargetExistsError
from h5pack.write.leftovers import OwnerLock, lock_path

logger = logging.getLogger("h5pack")


def check_target(target: StrPath, *, overwrite: bool) -> Path:
    """Return the target path; refuse a directory, no parent, or a file (unless ``overwrite``)."""
    path = Path(target)
    # "out/" names a directory whether or not it exists yet (Path drops the slash)
    if path.is_dir() or os.fspath(target).endswith(("/", os.sep)):
        what = "is a directory" if path.is_dir() else "names a directory (the trailing slash)"
        raise OptionsError(
            f"{path} {what}; give the pack's file name, e.g. {path}/out.h5 (to write a "
            "pack set of shards into a directory, convert with --shards N)"
        )
    if not path.parent.is_dir():
        raise OptionsError(f"{path.parent} is not a directory; create it first")
    if path.exists() and not overwrite:
        raise TargetExistsError(f"{path} already exists; pass --overwrite to replace it")
    return path


def check_not_a_source(target: Path, sources: Iterable[Path]) -> None:
    """Refuse (``OptionsError``) a target that is one of the files to be packed, however named."""
    try:
        own = os.stat(target)
    except OSError:
        return  # not there: it is no source
    for source in sources:
        try:
            st = os.stat(source)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino):
            continue
        if os.path.abspath(target) == os.path.abspath(source):
            relation = "is"
        elif os.path.realpath(target) == os.path.realpath(source):
            relation = "is, through a symbolic link,"
        else:
            relation = "is a hard link to"
        raise OptionsError(
            f"the target {target} {relation} {source}, one of the images being packed; "
            f"writing the pack there would destroy it: choose another target"
        )


def temp_path(target: Path, tag: str = "") -> Path:
    """Return the hidden temporary name beside ``target`` for this process."""
    return target.parent / f".{target.name}.{os.getpid()}{tag}.tmp"


class TempFiles:
    """Temporary files of one conversion, removed unless published.

    As a context manager, holds the ``target``'s lock file (``leftovers.OwnerLock``) from
    before any temporary file exists until every one is removed.
    """

    def __init__(self, target: Path | None = None) -> None:
        self.paths: list[Path] = []
        self.target = target
        self._lock: OwnerLock | None = None
        self._reserved = 0

    def __enter__(self) -> TempFiles:
        if self.target is not None:
            self._lock = OwnerLock(lock_path(self.target))
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove_all()

    def add(self, path: Path) -> Path:
        """Track ``path``; return it. The first file added is the pack."""
        self.paths.append(path)
        return path

    def reserve(self, nbytes: int, *, what: str) -> None:
        """Reserve ``nbytes`` in the pack's file for ``what`` (NOTE [ Room for the metadata ])."""
        if self.paths and self.paths[0].exists():
            self._reserved = reserve_room(self.paths[0], nbytes, what=what)

    def release_reserved(self, published: Path) -> None:
        """Give back the room that the published pack ``published`` did not use."""
        release_reserved(published, self._reserved)
        self._reserved = 0

    def remove_all(self) -> None:
        """Remove every tracked file that still exists, then the lock file (never raises)."""
        for path in self.paths:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as err:
                logger.warning("could not remove %s: %s", path, err.strerror or err)
        if self._lock is not None:
            self._lock.release()
            self._lock = None


# NOTE [ Room for the metadata ]: HDF5 writes most metadata when the file is closed, and a
# disk full then left objects that could not be closed (and a SIGSEGV at exit). So once
# every sample is decoded, the room the rest needs is reserved in the pack's own file
# (fallocate KEEP_SIZE), or the conversion stops with one clean error; what HDF5 did not
# use is given back after publishing. Without fallocate the free space is only checked.

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_LIBC: dict[str, Any] = {}


def _libc(name: str, argtypes: list[Any], *args: Any) -> None:
    """Call the C library's ``name``: OSError(ENOSYS) where it has none, OSError on failure."""
    function = _LIBC.get(name)
    if function is None:
        try:
            function = getattr(ctypes.CDLL(None, use_errno=True), name)
        except (OSError, AttributeError) as err:  # not Linux, or an old C library
            raise OSError(errno.ENOSYS, f"{name} is not available") from err
        function.argtypes = argtypes
        function.restype = ctypes.c_int
        _LIBC[name] = function
    if function(*args):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    _libc("fallocate64", [ctypes.c_int] * 2 + [ctypes.c_int64] * 2, fd, mode, offset, length)


def reserve_room(path: Path, nbytes: int, *, what: str) -> int:
    """Reserve ``nbytes`` past the end of ``path`` or refuse; return them (0: only checked)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        check_room(path.parent, nbytes, what=what)
        return 0
    try:
        size = os.fstat(fd).st_size
        _fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, size + nbytes)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise _no_room(path.parent, nbytes, what) from None
        check_room(path.parent, nbytes, what=what)  # no fallocate here
        return 0
    finally:
        os.close(fd)
    return nbytes


def release_reserved(path: Path, nbytes: int) -> None:
    """Give back what is still reserved past the end of ``path`` (never raises)."""
    if nbytes <= 0:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        os.ftruncate(fd, size)  # frees the blocks past the end (ext4, xfs, tmpfs)
        with contextlib.suppress(OSError):  # and where that does not, punching does
            _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, size, nbytes)
    except OSError as err:
        logger.debug("could not release the room reserved past the end of %s: %s", path, err)
    finally:
        os.close(fd)


def free_bytes(directory: Path) -> int | None:
    """Return the bytes this process may still write on ``directory``'s file system."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    # root may also use the blocks reserved for it (ext4: 5%)
    blocks = st.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


def check_room(directory: Path, nbytes: int, *, what: str) -> None:
    """Refuse to go on (``H5PackError``) when ``directory`` has less than ``nbytes`` free."""
    free = free_bytes(directory)
    if free is not None and free < nbytes:
        raise _no_room(directory, nbytes, what)


def _no_room(directory: Path, nbytes: int, what: str) -> H5PackError:
    free = free_bytes(directory)
    left = f", {binary_bytes(free)} are free" if free is not None else ""
    return H5PackError(
        f"no space left on the device of {directory} for {what}: it needs about "
        f"{binary_bytes(nbytes)}{left}"
    )


def publish(temp: Path, target: Path, *, overwrite: bool) -> None:
    """Append the compact index; move the pack into place (without overwrite, never clobbering)."""
    try:
        append_index(temp)  # NOTE [ Compact index ]: remote readers open it in 1-2 GETs
        if overwrite:
            os.replace(temp, target)
            return
        try:
            os.link(temp, target)  # fails if the target appeared meanwhile
        except FileExistsError as err:
            raise _appeared(target) from err
        except OSError:  # no hard links on this file system
            _rename_noreplace(temp, target)
            return
        temp.unlink()
    except H5PackError:
        raise
    except OSError as err:
        raise H5PackError(f"cannot move {temp} to {target}: {err.strerror or err}") from err


def _appeared(target: Path) -> TargetExistsError:
    return TargetExistsError(f"{target} appeared during the conversion; not replaced")


# renameat2(2) flag and the "relative to the working directory" descriptor (Linux).
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
# What renameat2 says when the kernel, the C library or the file system lacks the flag.
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}


def _rename_noreplace(temp: Path, target: Path) -> None:
    """Rename ``temp`` to ``target`` unless it exists: atomic with renameat2, else checked first."""
    try:
        _renameat2(temp, target, _RENAME_NOREPLACE)
    except FileExistsError as err:
        raise _appeared(target) from err
    except OSError as err:
        if err.errno not in _UNSUPPORTED:
            raise
    else:
        return
    if target.exists():
        raise _appeared(target)
    os.replace(temp, target)


def _renameat2(source: Path, target: Path, flags: int) -> None:
    types = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    where = (os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags)
    try:
        _libc("renameat2", types, _AT_FDCWD, *where)
    except OSError as err:
        raise OSError(err.errno, err.strerror, os.fspath(target)) from None


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(143)`` so that ``finally`` blocks clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
