"""The option objects of a loader, and the one place its convenient keywords become them.

# NOTE [ Options at the public edge ]
#
# ``make_loader`` takes its settings as four frozen objects, each validated once in its own
# ``__post_init__``: ``epoch`` (``EpochSpec``: how epochs are cut), ``reader``
# (``ReaderOptions``: how each process reads), ``pipeline`` (``CropSpec``: the training
# image pipeline) and ``cache`` (``CacheSpec``: the decoded cache). A few everyday fields
# are also keywords under the same names (``KEYWORDS``); ``loader_spec`` replaces each in
# its object. A keyword of an older release names its new home (``moved_message``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from h5pack.core.decode import Backend
from h5pack.errors import OptionsError
from h5pack.read.crop import Crop, CropSpec
from h5pack.read.options import ReaderKeywords, renamed_message
from h5pack.read.reader import ReaderOptions
from h5pack.training.cache import CacheSpec
from h5pack.training.epochs import EpochSpec, epoch_spec

KEYWORDS: dict[str, frozenset[str]] = {
    "epoch": frozenset({"shuffle", "seed", "drop_last", "weights"}),
    "reader": ReaderKeywords.__optional_keys__,
    "pipeline": frozenset({"size", "crop", "flip"}),
}
"""Per option object, the fields ``make_loader`` also takes as keywords."""

_HOMES: dict[str, type] = {
    "epoch": EpochSpec,
    "reader": ReaderOptions,
    "pipeline": CropSpec,
    "cache": CacheSpec,
}


class SpecKeywords(ReaderKeywords, total=False):
    """``make_loader``'s convenient keywords: fields of its option objects, same names.

    ``size`` also takes one int for a square; ``crop`` defaults to ``"random-resized"``.
    """

    shuffle: bool | None
    seed: int | None
    drop_last: bool | None
    weights: Sequence[float] | None
    size: int | tuple[int, int] | None
    crop: Crop | None
    flip: bool | None


# Keywords of older releases that no option replaces, and why.
RETIRED = {"stratify": "stratify= is retired: every mix now holds its shares in every batch"}


def moved_message(name: str) -> str | None:
    """Return where the option ``name``, no longer a keyword of ``make_loader``, is set now.

    Example:
        >>> moved_message("locking")
        'locking= moved to reader=ReaderOptions(locking=...)'
    """
    if name in RETIRED:
        return RETIRED[name]
    if renamed := renamed_message(name):
        return renamed
    for home, cls in _HOMES.items():
        owned = {f.name for f in fields(cls)}
        if name in owned and name not in KEYWORDS.get(home, frozenset()):
            return f"{name}= moved to {home}={cls.__name__}({name}=...)"
    return None


@dataclass(frozen=True)
class LoaderSpec:
    """The option objects of one loader (NOTE [ Options at the public edge ])."""

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
    """Return the option objects of ``make_loader``'s arguments (a keyword of None: not given).

    Example:
        >>> spec = loader_spec(64, shuffle=False, size=224, cache="decoded")
        >>> spec.epoch.batch_size, spec.epoch.shuffle, spec.pipeline.size, spec.cache
        (64, False, (224, 224), CacheSpec(cache_bytes=None, cache_max_side=None))
    """
    unknown = sorted(set(keywords) - set().union(*KEYWORDS.values()))
    moved = [message for name in unknown if (message := moved_message(name))]
    if moved:
        raise OptionsError("; ".join(moved))
    if unknown:
        raise TypeError(f"make_loader() got unexpected keyword arguments {unknown}")
    keywords = {k: v for k, v in keywords.items() if v is not None}

    def mine(name: str) -> dict[str, Any]:
        return {k: v for k, v in keywords.items() if k in KEYWORDS.get(name, ())}

    if isinstance(batch_size, EpochSpec):
        epoch, batch_size = batch_size, None
    if epoch is not None and batch_size is not None:
        epoch = replace(epoch, batch_size=batch_size)
    built_epoch = epoch_spec(epoch if epoch is not None else batch_size, **mine("epoch"))
    built_reader = replace(reader or ReaderOptions(), **mine("reader"))
    built_pipeline = _pipeline(pipeline, mine("pipeline"), built_reader.backend)
    return LoaderSpec(
        epoch=built_epoch,
        reader=built_reader,
        pipeline=built_pipeline,
        cache=CacheSpec() if cache == "decoded" else _cache(cache),
    )


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


def _cache(cache: object) -> CacheSpec | None:
    if cache is not None and not isinstance(cache, CacheSpec):
        raise OptionsError(
            f"cache should be 'decoded', a CacheSpec or None, but got cache={cache!r}"
        )
    return cache
