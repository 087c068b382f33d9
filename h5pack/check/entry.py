"""The check package's public edge: ``verify_pack``, ``verify_packset``, ``pack_info``.

One pack is ``check.verify.check_pack``'s, a set is ``check.packset.verify_packset``'s, the
source folder ``check.source.compare_source``'s, a summary ``check.info.pack_info``'s. It
sits above them, so that none of them imports another that imports it back; the user's
``storage_options`` become a store here (NOTE [ Stores ]).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.check.info import PackInfo
from h5pack.check.info import pack_info as summarize
from h5pack.check.packset import verify_packset as verify_set
from h5pack.check.probe import probe_pack
from h5pack.check.report import DEFAULT_TOLERANCE, VerifyReport
from h5pack.check.source import SourceShard, compare_source
from h5pack.check.verify import check_pack
from h5pack.core.packset import is_packset
from h5pack.core.store import Store, open_store
from h5pack.read.packset import PackSource
from h5pack.write.sources import SampleSource


def verify_pack(
    path: PackSource,
    *,
    source: StrPath | SampleSource | None = None,
    labels_csv: StrPath | None = None,
    sample: int | None = None,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    progress: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> VerifyReport:
    """Check a pack: its metadata digests, structure, every sample; optionally its source.

    Samples are read chunk by chunk and checked against both their CRC32 and (format 1.1)
    their XXH3-64. A chunk that cannot be read (a corrupt compressed chunk) is reported for
    its range of samples; nothing raises for damaged data or damaged metadata that still
    locates the samples. A pack set (its directory or manifest, or a list of packs) is
    checked by ``verify_packset``.

    Args:
        path: The pack.
        source: The image folder it was made from (or its ``SampleSource``, e.g. a COCO
            one): every image there must be in the pack (or recorded as skipped) with the
            same class, content and fields, and nothing else.
        labels_csv: Labels CSV of the source (default: the one recorded in the pack, if it
            still exists).
        sample: Compare the content of this many samples, chosen at random with ``seed``,
            instead of all (presence and labels are always checked for every file).
        seed: Seed of that choice.
        tolerance: Raw packs: the largest mean absolute difference (levels) between the
            stored pixels and the source file decoded (and resized) again that counts as
            the same image.
        progress: Called with the number of samples just checked.
        timeout_s: Read the metadata in a child process first, under this time limit (see
            ``probe_pack``); ``None`` reads it in this process.
        storage_options: The remote client's settings for a URL. A remote pack's samples
            are read through HDF5 over ranged GETs (not from its compact index's chunk
            table), so verify also checks that HDF5's metadata and the index agree.
        store: Where the pack is kept (default: ``open_store(path, storage_options)``).

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, or its metadata is too damaged to locate the
            samples.
    """
    store = store or open_store(path, storage_options)
    if is_packset(path):
        return verify_set(
            path,
            source=source,
            labels_csv=labels_csv,
            sample=sample,
            seed=seed,
            tolerance=tolerance,
            progress=progress,
            timeout_s=timeout_s,
            store=store,
        )
    assert isinstance(path, str | os.PathLike)  # is_packset: one path
    text = os.fspath(path)
    if timeout_s is not None and not store.remote:
        probe_pack(text, timeout_s=timeout_s, strict=False)
    checked = check_pack(text, progress=progress, store=store)
    if source is None:
        return checked.report
    meta = checked.meta
    csv = labels_csv if labels_csv is not None else meta.options.get("labels_csv")
    if csv is not None and labels_csv is None and not Path(csv).exists():
        csv = None
    return compare_source(
        checked.report,
        [SourceShard(name="", path=text, meta=meta, paths=checked.paths)],
        source,
        labels_csv=csv,
        sample=sample,
        seed=seed,
        tolerance=tolerance,
    )


def verify_packset(
    packs: PackSource,
    *,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
    **checks: Any,
) -> VerifyReport:
    """Check every shard of a pack set and the set as a whole (``check.packset``'s).

    Args:
        packs: The pack set's directory, manifest or prefix, or a list of packs.
        storage_options: The remote client's settings for a remote set.
        store: Where the set is kept (instead of ``storage_options``).
        **checks: ``source``, ``sample``, ``timeout_s``... as ``verify_pack`` takes them.
    """
    store = store or open_store(packs, storage_options)
    return verify_set(packs, store=store, **checks)


def pack_info(
    path: StrPath,
    *,
    timeout_s: float | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> PackInfo:
    """Return a summary of the pack at ``path`` (``check.info.pack_info``).

    Args:
        path: The pack.
        timeout_s: Read the metadata in a child process first, under this time limit.
        storage_options: The remote client's settings for a URL.
        store: Where the pack is kept (instead of ``storage_options``).
    """
    store = store or open_store(path, storage_options)
    return summarize(path, timeout_s=timeout_s, store=store)
