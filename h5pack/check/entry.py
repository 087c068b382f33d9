"""The check package's public edge: ``verify_pack``, ``verify_packset``, ``pack_info``.

It sits above the checks (``verify``, ``packset``, ``source``, ``info``), so that none of them
imports another that imports it back; ``storage_options`` become a store here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
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

    Nothing raises for damaged data, or damaged metadata that still locates the samples:
    each is a problem in the report. A pack set is checked by ``verify_packset``.

    Args:
        path: The pack (or a pack set: its directory, manifest or prefix, or a list).
        source: The folder (or ``SampleSource``) it was made from: every sample there must
            be in the pack (or recorded as skipped) with the same class, content and fields.
        labels_csv: Labels CSV of the source (default: the one the pack records).
        sample: Compare the content of this many samples, not all.
        seed: Seed of the samples compared.
        tolerance: Raw packs: the largest mean absolute difference (levels) between stored
            and re-decoded pixels that counts as the same image.
        progress: Called with the number of samples just checked.
        timeout_s: Probe the metadata in a child process first (``probe_pack``).
        storage_options: The remote client's settings for a URL.
        store: Where the pack is kept (instead of ``storage_options``).
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
    shard = SourceShard(name="", path=text, meta=checked.meta, paths=checked.paths)
    return compare_source(
        checked.report,
        [shard],
        source,
        labels_csv=labels_csv,
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
    """Check every shard of a pack set and the set as a whole (``checks`` as ``verify_pack``)."""
    store = store or open_store(packs, storage_options)
    return verify_set(packs, store=store, **checks)


def pack_info(
    path: StrPath,
    *,
    timeout_s: float | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> PackInfo:
    """Return a summary of the pack at ``path``; ``timeout_s``: probe it first (``probe_pack``)."""
    store = store or open_store(path, storage_options)
    return summarize(path, timeout_s=timeout_s, store=store)
