"""What the benchmarks measure: a pack, or a pack set read as one pack.

A pack set is its directory or manifest (``packset.json``), or a list of packs, as
everywhere in h5pack (``read.packset.PackSource``). The loader reads a set through
``make_loader``'s own support; what the benchmarks do to files (size, page cache) they do
to every shard.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from h5pack.bench.system import CacheDrop, drop_page_cache, warm_page_cache
from h5pack.core.packset import MANIFEST_NAME, is_packset, pack_paths
from h5pack.core.source import is_url
from h5pack.read.packset import PackSource, describe, is_remote


def is_set_path(path: str | os.PathLike[str]) -> bool:
    """Return whether ``path`` names a pack set (a directory holding a manifest, or one)."""
    found = Path(path)
    if found.is_dir():
        return (found / MANIFEST_NAME).is_file()
    return found.suffix == ".json" or found.name == MANIFEST_NAME


def pack_files(
    source: PackSource, storage_options: Mapping[str, Any] | None = None
) -> list[Path | str]:
    """Return the pack files of ``source`` (one for a pack, every shard of a set).

    A remote source's are URLs (its shards' for a set, read with ``storage_options``).

    Raises:
        PackNotFoundError: a set without a manifest.
        FormatError: a manifest that is not valid.
    """
    if not is_packset(source):
        assert isinstance(source, str | os.PathLike)  # is_packset: one path
        return [os.fspath(source) if is_url(source) else Path(source)]
    if is_remote(source):
        view = describe(source, storage_options=storage_options)
        assert view.shards is not None  # a set
        return [shard.path for shard in view.shards]
    return list(pack_paths(source)[0])


def source_name(source: PackSource) -> str:
    """Return how reports name ``source``: its path, or its packs' paths for a list."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return ", ".join(os.fspath(p) for p in source)


def source_bytes(source: PackSource, storage_options: Mapping[str, Any] | None = None) -> int:
    """Return the size of every file of ``source`` (a remote one's objects, as opened)."""
    if is_remote(source):
        view = describe(source, storage_options=storage_options)
        metas = [view.meta] if view.shards is None else view.shards
        return sum(m.identity.size for m in metas if m.identity is not None)
    return sum(Path(path).stat().st_size for path in pack_files(source))


def drop_source(source: PackSource) -> CacheDrop:
    """Drop every file of ``source`` from the page cache (see ``drop_page_cache``)."""
    if is_remote(source):
        return CacheDrop(False, None, "a remote pack: its reads are requests, no page cache")
    outcomes = [drop_page_cache(path) for path in pack_files(source)]
    failed = [o for o in outcomes if not o.dropped]
    if failed:
        return failed[0]
    if len(outcomes) == 1:
        return outcomes[0]
    return CacheDrop(True, None, f"{outcomes[0].message} ({len(outcomes)} shards)")


def warm_source(source: PackSource) -> int:
    """Read every file of ``source`` once so that its pages are cached; return the bytes.

    A remote source has no local pages: nothing is read (0).
    """
    if is_remote(source):
        return 0
    return sum(warm_page_cache(path) for path in pack_files(source))
