"""The option objects of a loader, and the one place its convenient keywords become them.

# NOTE [ Options at the public edge ]
#
# ``make_loader`` takes its settings as four frozen objects, each validated once in its own
# ``__post_init__`` (a bad argument is one ``OptionsError`` naming the field, when the loader
# is built):
#
#     epoch     EpochSpec      how epochs are cut: batch size, shuffle, seed, window, ranks,
#                              a mix's weights
#     reader    ReaderOptions  how each process reads: locking, decoder, direct path, checks
#     pipeline  CropSpec       the training image pipeline: size, crop, scale, ratio, flip
#     cache     CacheSpec      the decoded cache shared by the loader's processes
#
# The convenient keywords (``make_loader(path, 64, shuffle=True, size=224, cache="decoded")``)
# are those objects' fields under the same names; ``loader_spec`` routes each keyword to the
# object that has a field of its name (the fields are read from the dataclasses, so nothing
# here lists them again) and replaces it there; a keyword given as None is not given.
# ``SpecKeywords`` types them for static checkers; tests/test_loader.py checks that it holds
# exactly the routed fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, TypedDict

from h5pack.core.decode import Backend
from h5pack.errors import OptionsError
from h5pack.read.crop import Crop, CropSpec
from h5pack.read.eviction import EvictionPolicy
from h5pack.read.readahead import ReadAheadOptions
from h5pack.read.reader import ReaderOptions
from h5pack.training.cache import CacheSpec
from h5pack.training.sampler import EpochSpec, epoch_spec

# Fields of ReaderOptions that make_loader does not take as keywords: the window is the
# sampler's (EpochSpec.window_chunks), the threads a loader setting (see "Loader defaults").
_READER_NOT_KEYWORDS = frozenset({"window_chunks", "chunk_cache_bytes", "threads"})
# Fields of EpochSpec that make_loader fills itself (workers) or from the labels (strata).
_EPOCH_NOT_KEYWORDS = frozenset({"batch_size", "num_workers", "min_window_chunks", "chunk_strata"})
_PIPELINE_NOT_KEYWORDS = frozenset({"backend", "reducing_gap"})  # the reader's; its default


class SpecKeywords(TypedDict, total=False):
    """``make_loader``'s convenient keywords: fields of its option objects, same names.

    See ``EpochSpec``, ``ReaderOptions``, ``CropSpec`` and ``CacheSpec`` for each one's
    meaning; ``size`` also takes one int for a square, and ``crop`` defaults to
    ``"random-resized"`` when ``size`` is given.
    """

    # EpochSpec
    shuffle: bool | None
    seed: int | None
    num_replicas: int | None
    rank: int | None
    drop_last: bool | None
    window_chunks: int | None
    window_bytes: int | None
    weights: Sequence[float] | None
    epoch_samples: int | None
    stratify: bool | None
    # ReaderOptions
    locking: bool | None
    backend: Backend | None
    direct: bool | None
    verify_checksums: bool | None
    storage_options: Mapping[str, Any] | None
    read_ahead: ReadAheadOptions | None
    cache_dir: str | os.PathLike[str] | None
    cache_disk_bytes: int | None
    cache_eviction: EvictionPolicy | None
    # CropSpec
    size: int | tuple[int, int] | None
    crop: Crop | None
    scale: tuple[float, float] | None
    ratio: tuple[float, float] | None
    flip: bool | None
    # CacheSpec
    cache_bytes: int | None
    cache_max_side: int | None


def keyword_fields() -> dict[str, frozenset[str]]:
    """Return, per option object, the fields ``make_loader`` takes as keywords."""

    def names(cls: type, left_out: frozenset[str]) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls)) - left_out

    return {
        "epoch": names(EpochSpec, _EPOCH_NOT_KEYWORDS),
        "reader": names(ReaderOptions, _READER_NOT_KEYWORDS),
        "pipeline": names(CropSpec, _PIPELINE_NOT_KEYWORDS),
        "cache": names(CacheSpec, frozenset()),
    }


@dataclass(frozen=True)
class LoaderSpec:
    """The option objects of one loader (see the note "Options at the public edge").

    Attributes:
        epoch: How epochs are cut (``num_workers`` is filled in when the loader is built).
        reader: How each process reads the pack.
        pipeline: The training image pipeline, or None (images as stored).
        cache: The decoded cache, or None.
    """

    epoch: EpochSpec
    reader: ReaderOptions
    pipeline: CropSpec | None
    cache: CacheSpec | None


def loader_spec(
    batch_size: int | EpochSpec | None = None,
    *,
    epoch: EpochSpec | None = None,
    reader: ReaderOptions | None = None,
    pipeline: CropSpec | None = None,
    cache: CacheSpec | Literal["decoded"] | None = None,
    **keywords: Any,
) -> LoaderSpec:
    """Return the option objects of ``make_loader``'s arguments: the objects, with keywords.

    Each keyword replaces the field of its name in the object that has it (see the note
    "Options at the public edge"); an object not given starts from its defaults. A keyword
    given as None counts as not given (the older signature's defaults).

    Raises:
        OptionsError: a field out of range (named), no batch size, ``crop``/``flip`` without
            ``size``, cache settings without a cache, or a cache without a pipeline.
        TypeError: a keyword that is no field of the option objects.

    Example:
        >>> spec = loader_spec(64, shuffle=False, size=224, cache="decoded")
        >>> spec.epoch.batch_size, spec.epoch.shuffle, spec.pipeline.size, spec.cache
        (64, False, (224, 224), CacheSpec(cache_bytes=None, cache_max_side=None))
    """
    routes = keyword_fields()
    # None means "not given", as it did for every keyword of the older signature
    keywords = {k: v for k, v in keywords.items() if v is not None}
    unknown = sorted(set(keywords) - set().union(*routes.values()))
    if unknown:
        raise TypeError(f"make_loader() got unexpected keyword arguments {unknown}")

    def mine(name: str) -> dict[str, Any]:
        return {k: v for k, v in keywords.items() if k in routes[name]}

    if isinstance(batch_size, EpochSpec):
        epoch, batch_size = batch_size, None
    if epoch is not None and batch_size is not None:
        epoch = replace(epoch, batch_size=batch_size)
    built_epoch = epoch_spec(epoch if epoch is not None else batch_size, **mine("epoch"))
    built_reader = _replaced(reader or ReaderOptions(), mine("reader"))
    built_pipeline = _pipeline(pipeline, mine("pipeline"), built_reader.backend)
    return LoaderSpec(
        epoch=built_epoch,
        reader=built_reader,
        pipeline=built_pipeline,
        cache=_cache(cache, mine("cache"), pipeline_given=built_pipeline is not None),
    )


def _replaced(options: ReaderOptions, changes: dict[str, Any]) -> ReaderOptions:
    return replace(options, **changes) if changes else options


def _pipeline(
    pipeline: CropSpec | None, changes: dict[str, Any], backend: Backend
) -> CropSpec | None:
    size = changes.pop("size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if size is not None:
        changes["size"] = size
    if pipeline is not None:
        return replace(pipeline, **changes) if changes else pipeline
    if size is None:
        if changes:
            given = ", ".join(f"{name}=" for name in sorted(changes))
            raise OptionsError(f"{given} need size=: the size every image is cut to")
        return None
    changes.setdefault("crop", "random-resized")
    return CropSpec(backend=backend, **changes)


def _cache(
    cache: CacheSpec | Literal["decoded"] | None, changes: dict[str, Any], *, pipeline_given: bool
) -> CacheSpec | None:
    if cache is None:
        if changes:
            raise OptionsError("cache_bytes= and cache_max_side= need cache='decoded'")
        return None
    if isinstance(cache, str) and cache != "decoded":
        raise OptionsError(
            f"cache should be 'decoded', a CacheSpec or None, but got cache={cache!r}"
        )
    if not isinstance(cache, CacheSpec | str):
        raise OptionsError(
            f"cache should be 'decoded', a CacheSpec or None, but got cache={cache!r}"
        )
    if not pipeline_given:
        raise OptionsError(
            "cache='decoded' keeps images before the random crop, so it needs size= (the "
            "size every image is cut to) or pipeline="
        )
    spec = CacheSpec() if isinstance(cache, str) else cache
    return replace(spec, **changes) if changes else spec
