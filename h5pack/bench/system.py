"""The machine under a benchmark: its description, the page cache of a pack's files, CPU time.

What the benchmarks measure is a pack, or a pack set read as one pack (its directory or
manifest, or a list of packs: ``read.packset.PackSource``); what they do to files (size,
page cache) they do to every shard.

# NOTE [ Dropping the page cache ]
#
# A cold read needs the file's pages out of the OS page cache. Dropping every cache
# (``/proc/sys/vm/drop_caches``) needs root; ``posix_fadvise(POSIX_FADV_DONTNEED)`` on one
# file needs only a descriptor and drops that file's clean pages on Linux. It is advice:
# a file system may ignore it (tmpfs keeps its pages, they are the storage), so the result
# is checked with ``mincore`` and reported, never assumed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.core.machine import memory_bytes
from h5pack.core.packset import MANIFEST_NAME, is_packset, pack_paths
from h5pack.core.store import Store, is_url, open_store
from h5pack.read.packset import PackSource, describe

_PROT_READ = 1
_MAP_SHARED = 1
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    if not all(hasattr(libc, f) for f in ("mmap", "munmap", "mincore")):
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(path: StrPath) -> float | None:
    """Return the fraction of ``path``'s pages in the page cache, or None when unknown.

    Maps the file read-only and asks ``mincore`` (Linux, BSD, macOS); mapping reads
    nothing, so the answer does not disturb the cache.
    """
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = _libc()
    if libc is None:
        return None
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            return None
        try:
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(address, size, vector) != 0:
                return None
            return sum(v & 1 for v in vector) / pages
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class CacheDrop:
    """The outcome of dropping a file from the page cache.

    Attributes:
        dropped: Whether the file's pages left the cache (checked when possible).
        resident_after: Fraction of its pages still cached afterwards, None if unknown.
        message: One line saying what happened, for reports.
    """

    dropped: bool
    resident_after: float | None
    message: str


def drop_page_cache(path: StrPath) -> CacheDrop:
    """Ask the OS to drop ``path``'s pages from the page cache (see "Dropping the page cache").

    Never raises for a refusal: the result says whether it worked.
    """
    text = os.fspath(path)
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return CacheDrop(False, None, "posix_fadvise is not available on this system")
    fd = os.open(text, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as err:
        return CacheDrop(False, None, f"posix_fadvise(DONTNEED) failed on {text}: {err}")
    finally:
        os.close(fd)
    resident = resident_fraction(text)
    if resident is None:
        return CacheDrop(True, None, "dropped with posix_fadvise(DONTNEED) (not verified)")
    if resident > 0.05:
        return CacheDrop(
            False,
            resident,
            f"the OS kept {resident:.0%} of {text} cached after posix_fadvise(DONTNEED) "
            "(a file system such as tmpfs keeps its pages): cold numbers are warm",
        )
    return CacheDrop(True, resident, "dropped with posix_fadvise(DONTNEED), checked by mincore")


def warm_page_cache(path: StrPath, *, block_bytes: int = 8 * 2**20) -> int:
    """Read ``path`` once so that its pages are cached; return the bytes read."""
    total = 0
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(block_bytes)
        view = memoryview(buffer)
        while True:
            got = handle.readinto(view)
            if not got:
                return total
            total += got


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _filesystem(path: str) -> str:
    """Return the file system type of ``path`` from /proc/mounts (Linux), else ``"?"``."""
    try:
        with open("/proc/mounts", encoding="utf-8") as handle:
            mounts = [line.split() for line in handle]
    except OSError:
        return "?"
    real = os.path.realpath(path)
    best, kind = "", "?"
    for fields in mounts:
        if len(fields) < 3 or len(fields[1]) <= len(best):
            continue
        if real == fields[1] or real.startswith(fields[1].rstrip("/") + "/"):
            best, kind = fields[1], fields[2]
    return kind


@dataclass(frozen=True, kw_only=True)
class Machine:
    """Where a benchmark ran: what a reader needs to judge its numbers."""

    cpu: str
    cores: int
    memory_bytes: int | None
    system: str
    python: str
    numpy: str
    h5py: str
    hdf5: str
    filesystem: str
    native: str = ""  # native_routes(): the paths with a fallback this process takes

    def describe(self) -> str:
        """Return one line, e.g. ``"2 cores (Xeon...), 24 GiB, Linux, ext4"``."""
        memory = f", {self.memory_bytes / 2**30:.0f} GiB" if self.memory_bytes else ""
        return (
            f"{self.cores} cores ({self.cpu}){memory}, {self.system}, Python {self.python}, "
            f"h5py {self.h5py} / HDF5 {self.hdf5}, file system {self.filesystem}"
            + (f"; {self.native}" if self.native else "")
        )


def machine_info(where: StrPath = ".") -> Machine:
    """Describe this machine, and the file system holding ``where``."""
    import h5py
    import numpy as np

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return Machine(
        cpu=_cpu_model(),
        cores=cores,
        memory_bytes=memory_bytes(),
        system=f"{platform.system()} {platform.release()}",
        python=sys.version.split()[0],
        numpy=np.__version__,
        h5py=h5py.__version__,
        hdf5=h5py.version.hdf5_version,
        filesystem=_filesystem(os.fspath(where)),
        native=native_routes(),
    )


def native_routes() -> str:
    """The compiled or torch-internal paths this process takes; each has a fallback."""
    from h5pack.core import jpegbox
    from h5pack.training.resize import resize_route
    from h5pack.training.ring import reuse_route

    decoder = jpegbox.library() or "off, JPEGs decoded whole"
    return f"JPEG box decoder: {decoder}; resize: {resize_route()}; batch buffers: {reuse_route()}"


def tree_cpu_s(exclude: Collection[int] = ()) -> float:
    """CPU seconds (user + system) of this process and its descendants, live and ended.

    Descendants that ended (DataLoader workers of an epoch, a ``pipe:`` command) count
    through their parent's children times once it reaped them.

    Args:
        exclude: Pids left out, e.g. a server the benchmark started and measures apart.
    """
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        if process.pid in exclude:
            continue
        try:
            used = process.cpu_times()
        except psutil.Error:  # it ended meanwhile
            continue
        total += used.user + used.system + used.children_user + used.children_system
    return total


def is_set_path(path: str | os.PathLike[str]) -> bool:
    """Return whether ``path`` names a pack set (a directory holding a manifest, or one)."""
    found = Path(path)
    if found.is_dir():
        return (found / MANIFEST_NAME).is_file()
    return found.suffix == ".json" or found.name == MANIFEST_NAME


def pack_files(source: PackSource, store: Store | None = None) -> list[Path | str]:
    """Return the pack files of ``source`` (one for a pack, every shard of a set).

    A remote source's are URLs (its shards' for a set, read from ``store``).

    Raises:
        PackNotFoundError: a set without a manifest.
        FormatError: a manifest that is not valid.
    """
    if not is_packset(source):
        assert isinstance(source, str | os.PathLike)  # is_packset: one path
        return [os.fspath(source) if is_url(source) else Path(source)]
    store = store or open_store(source)
    if store.remote:
        view = describe(source, store=store)
        assert view.shards is not None  # a set
        return [shard.path for shard in view.shards]
    return list(pack_paths(source)[0])


def source_name(source: PackSource) -> str:
    """Return how reports name ``source``: its path, or its packs' paths for a list."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return ", ".join(os.fspath(p) for p in source)


def source_bytes(source: PackSource, store: Store | None = None) -> int:
    """Return the size of every file of ``source`` (a remote one's objects, as opened)."""
    store = store or open_store(source)
    if store.remote:
        view = describe(source, store=store)
        metas = [view.meta] if view.shards is None else view.shards
        return sum(m.identity.size for m in metas if m.identity is not None)
    return sum(Path(path).stat().st_size for path in pack_files(source))


def drop_source(source: PackSource, store: Store | None = None) -> CacheDrop:
    """Drop every file of ``source`` from the page cache (see ``drop_page_cache``)."""
    if (store or open_store(source)).remote:
        return CacheDrop(False, None, "a remote pack: its reads are requests, no page cache")
    outcomes = [drop_page_cache(path) for path in pack_files(source)]
    failed = [o for o in outcomes if not o.dropped]
    if failed:
        return failed[0]
    if len(outcomes) == 1:
        return outcomes[0]
    return CacheDrop(True, None, f"{outcomes[0].message} ({len(outcomes)} shards)")


def warm_source(source: PackSource, store: Store | None = None) -> int:
    """Read every file of ``source`` once so that its pages are cached; return the bytes.

    A remote source has no local pages: nothing is read (0).
    """
    if (store or open_store(source)).remote:
        return 0
    return sum(warm_page_cache(path) for path in pack_files(source))


def unique_names(paths: Sequence[Path | str]) -> list[str]:
    """Return how reports name ``paths``: their short names, or their paths when those clash."""
    names = [_short_name(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [os.fspath(p) for p in paths]


def _short_name(path: Path | str) -> str:
    """A pack's stem, a set's folder name; a URL's last key part likewise."""
    if isinstance(path, str):  # a URL
        parts = [part for part in path.split("/") if part]
        last = parts[-1] if parts else path
        if last == MANIFEST_NAME or path.endswith("/"):
            return parts[-2] if last == MANIFEST_NAME and len(parts) > 1 else last
        return Path(last).stem
    return path.parent.name if is_set_path(path) and not path.is_dir() else path.stem
