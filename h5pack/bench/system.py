"""The machine under a benchmark, the files of what it measures, CPU time.

What the benchmarks measure is a pack, or a pack set read as one pack (its directory or
manifest, or a list of packs: ``read.packset.PackSource``); what they do to files (size,
page cache) they do to every shard.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from h5pack._types import StrPath
from h5pack.core.machine import available_cores, memory_bytes
from h5pack.core.packset import MANIFEST_NAME, is_packset, pack_paths
from h5pack.core.store import Store, is_url, open_store
from h5pack.read.packset import PackSource, describe


def warm_page_cache(path: StrPath) -> int:
    """Read ``path`` once so that its pages are cached; return the bytes read."""
    total = 0
    with open(path, "rb", buffering=0) as handle:
        view = memoryview(bytearray(8 * 2**20))
        while got := handle.readinto(view):
            total += got
    return total


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
    """The type of the file system holding ``path`` (the deepest mount over it), else ``"?"``."""
    import psutil

    real = os.path.realpath(path)
    over = [
        part
        for part in psutil.disk_partitions(all=True)
        if real == part.mountpoint or real.startswith(part.mountpoint.rstrip("/") + "/")
    ]
    return max(over, key=lambda part: len(part.mountpoint)).fstype if over else "?"


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

    return Machine(
        cpu=_cpu_model(),
        cores=available_cores(),
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

    Descendants that ended (DataLoader workers, a ``pipe:`` command) count through their
    parent's children times once reaped. ``exclude``: pids left out (e.g. a server).
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
    """Return the files of ``source``: a pack's, every shard's of a set (URLs when remote)."""
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


def warm_source(source: PackSource, store: Store | None = None) -> int:
    """Read every local file of ``source`` once into the page cache; return the bytes."""
    if (store or open_store(source)).remote:
        return 0
    return sum(warm_page_cache(path) for path in pack_files(source))


def unique_names(paths: Sequence[Path | str]) -> list[str]:
    """Return how reports name ``paths``: their short names, or their paths when those clash."""
    names = [_short_name(p) for p in paths]
    return names if len(set(names)) == len(names) else [os.fspath(p) for p in paths]


def _short_name(path: Path | str) -> str:
    """A pack's stem, a set's folder name; a URL's last key part likewise."""
    if isinstance(path, str):  # a URL
        parts = [part for part in path.split("/") if part]
        last = parts[-1] if parts else path
        if last == MANIFEST_NAME or path.endswith("/"):
            return parts[-2] if last == MANIFEST_NAME and len(parts) > 1 else last
        return Path(last).stem
    return path.parent.name if is_set_path(path) and not path.is_dir() else path.stem
