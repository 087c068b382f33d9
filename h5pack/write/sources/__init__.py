"""Where a conversion's samples come from: one ``SampleSource`` per kind of input.

A new kind is a ``PathSource`` subclass (``kind``, ``matches``, ``find``) and a line in ``KINDS``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.core.store import Store, is_url, open_store
from h5pack.errors import OptionsError
from h5pack.write.sources.archive import ImageNetTarSource, TarSource, ZipSource
from h5pack.write.sources.arrays import ArraySource
from h5pack.write.sources.base import (
    FileRange,
    Listing,
    PathSource,
    Sample,
    SampleSource,
)
from h5pack.write.sources.coco import CocoSource
from h5pack.write.sources.folder import FolderSource
from h5pack.write.sources.masks import MaskSource
from h5pack.write.sources.objects import url_kind
from h5pack.write.sources.parquet import ParquetSource
from h5pack.write.sources.tgz import GzipTarSource
from h5pack.write.sources.webdataset import WebDatasetSource

__all__ = [
    "KINDS",
    "ArraySource",
    "CocoSource",
    "FileRange",
    "FolderSource",
    "GzipTarSource",
    "ImageNetTarSource",
    "Listing",
    "MaskSource",
    "ParquetSource",
    "PathSource",
    "Sample",
    "SampleSource",
    "TarSource",
    "WebDatasetSource",
    "ZipSource",
    "sample_source",
]

KINDS: dict[str, type[PathSource]] = {
    "folder": FolderSource,
    "tar": TarSource,
    "tgz": GzipTarSource,
    "zip": ZipSource,
    "imagenet": ImageNetTarSource,
    "webdataset": WebDatasetSource,
    "parquet": ParquetSource,
}
"""The sources a path can name, by ``--from`` name, in detection order (``detect_first`` first)."""


def sample_source(
    source: StrPath | SampleSource,
    *,
    kind: str = "auto",
    labels_csv: StrPath | None = None,
    annotations: StrPath | None = None,
    masks: StrPath | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> SampleSource:
    """Return the source that ``source`` names (a ``SampleSource`` is returned as it is).

    Args:
        source: A path (a folder...), or a source.
        kind: One of ``KINDS``, or ``"auto"``: the first kind that ``matches`` the path
            (else a folder, which then says what is wrong with the path).
        labels_csv: A labels CSV for the source's samples.
        annotations: A COCO instances file for the image folder ``source`` (``CocoSource``).
        masks: A folder of masks for the image folder ``source`` (``MaskSource``).
        storage_options: For URLs: the bucket's settings (NOTE [ Sources in a bucket ]).
        store: Where the source is kept (instead of ``storage_options``).

    Raises:
        OptionsError: ``kind`` is not known, or the extra inputs do not go together.
    """
    if isinstance(source, SampleSource):
        return source
    given = [n for n, v in (("--annotations", annotations), ("--masks", masks)) if v]
    if given and (len(given) > 1 or labels_csv is not None or kind not in ("auto", "folder")):
        raise OptionsError(
            "--annotations and --masks each describe the images of a folder SOURCE: give one, "
            f"without --labels or --from {kind}"
        )
    named = [p for p in (source, annotations, masks, labels_csv) if p is not None]
    store = store or open_store(named, storage_options)
    if annotations is not None:
        return CocoSource(source, annotations, store=store)
    if masks is not None:
        return MaskSource(source, masks, store=store)
    if kind == "auto" and is_url(source):
        kind = url_kind(os.fspath(source), store)
    if kind == "auto":
        path = Path(source)
        order = sorted(KINDS, key=lambda name: not KINDS[name].detect_first)
        kind = next((name for name in order if KINDS[name].matches(path)), "folder")
    if kind not in KINDS:
        raise OptionsError(f"--from should be one of auto, {', '.join(KINDS)}, but got {kind!r}")
    return KINDS[kind](source, labels_csv=labels_csv, store=store)
