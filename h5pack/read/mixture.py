"""Several sources side by side: each a pack, a pack set or a list of packs (issue 18).

``describe_mix`` joins the sources' classes and folds their metadata into one ``PackMeta``
over global indices (source s's sample i is ``offsets[s] + i``). Unlike a set's shards, the
sources may differ in classes, mode, storage and size; ``check_batchable`` refuses what
cannot be one batch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

import numpy as np

from h5pack.core.fields import field_difference, fields_of, fields_text
from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap
from h5pack.core.store import Store
from h5pack.errors import OptionsError
from h5pack.read.packset import PackSource, PackView, concatenated_map, describe

ClassJoin: TypeAlias = "Literal['join', 'separate'] | Sequence[str]"
"""How sources' classes become one list: by name, kept apart, or an explicit list."""


def source_name(source: PackSource) -> str:
    """Return how messages name a source: its path, or its packs joined by '+'."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return "+".join(os.fspath(p) for p in source)


def joined_classes(
    class_lists: Sequence[tuple[str, ...]], names: Sequence[str], classes: ClassJoin = "join"
) -> tuple[tuple[str, ...], list[np.ndarray]]:
    """Return the mix's classes and, per source, the map from its labels to the mix's.

    ``classes``: ``"join"`` (one sorted list by name), ``"separate"`` (``"source/class"``, in
    source order) or the list of names (holding every source's classes).

    Example:
        >>> names, maps = joined_classes([("cat", "dog"), ("dog", "fox")], ["a", "b"])
        >>> names, [m.tolist() for m in maps]
        (('cat', 'dog', 'fox'), [[0, 1], [1, 2]])
    """
    if isinstance(classes, str):
        if classes == "join":
            result = tuple(sorted({c for cl in class_lists for c in cl}))
        elif classes == "separate":
            result = tuple(f"{n}/{c}" for n, cl in zip(names, class_lists, strict=True) for c in cl)
            maps, at = [], 0
            for cl in class_lists:
                maps.append(np.arange(at, at + len(cl), dtype=np.int64))
                at += len(cl)
            return result, maps
        else:
            raise OptionsError(
                "classes should be 'join', 'separate' or a list of class names, but got "
                f"classes={classes!r}"
            )
    else:
        result = tuple(str(c) for c in classes)
    index = {c: i for i, c in enumerate(result)}
    maps = []
    for name, cl in zip(names, class_lists, strict=True):
        missing = [c for c in cl if c not in index]
        if missing:
            raise OptionsError(
                f"{name} has classes {missing[:3]} that classes= does not list; add them, or "
                "use classes='join'"
            )
        maps.append(np.asarray([index[c] for c in cl], dtype=np.int64))
    return result, maps


@dataclass(frozen=True)
class MixView:
    """What a dataset or sampler needs to know of several sources, before reading."""

    sources: tuple[str | tuple[str, ...], ...]
    names: tuple[str, ...]
    views: tuple[PackView, ...]
    meta: PackMeta
    label_maps: tuple[np.ndarray, ...]
    chunk_map: ChunkMap

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """Global index of each source's first sample, and the total (read-only)."""
        sizes = [v.meta.num_samples for v in self.views]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        offsets.flags.writeable = False
        return offsets

    @property
    def chunk_maps(self) -> tuple[ChunkMap, ...]:
        """Each source's chunks, in its own indices."""
        return tuple(v.chunk_map for v in self.views)

    @property
    def group_bytes(self) -> int:
        """The largest source's bytes of one decompressed chunk."""
        return max(v.group_bytes for v in self.views)

    def source_of(self, indices: np.ndarray) -> np.ndarray:
        """Return the source of each global sample index."""
        found: np.ndarray = np.searchsorted(self.offsets, indices, side="right") - 1
        return found


def _plain(source: PackSource) -> str | tuple[str, ...]:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return tuple(os.fspath(p) for p in source)


def check_fields(view: MixView, names: Sequence[str] | None) -> None:
    """Refuse a field the mix delivers that some source lacks (fields are joined by name)."""
    common = [f.name for f in fields_of(view.meta)]
    listings = [fields_of(v.meta) for v in view.views]
    wanted = set(common) | {f.name for fields in listings for f in fields}
    if names is not None:
        wanted = set(names)
    for k, fields in enumerate(listings[1:], start=1):
        here = [f for f in listings[0] if f.name in wanted]
        there = [f for f in fields if f.name in wanted]
        difference = field_difference(here, there, view.names[0], view.names[k])
        if difference is not None:
            raise OptionsError(
                f"{difference}: the sources of a mix are joined by field name; pass fields= "
                f"naming the fields to keep, some of those every source holds {common}"
            )


def describe_mix(
    sources: Sequence[PackSource],
    *,
    classes: ClassJoin = "join",
    locking: bool | None = None,
    store_for: Callable[[PackSource], Store] | None = None,
) -> MixView:
    """Describe every source (packs, pack sets, lists of packs) and fold them into one view.

    ``classes``: as ``joined_classes``; ``store_for``: each source's store (None: local).
    """
    if isinstance(sources, str | os.PathLike) or len(sources) < 1:
        raise OptionsError(
            "a mix should be a list of sources (packs, pack sets, lists of packs), but got "
            f"{sources!r}"
        )
    plain = tuple(_plain(s) for s in sources)
    names = tuple(source_name(s) for s in plain)
    for i, name in enumerate(names):
        if name in names[:i]:
            raise OptionsError(f"{name} is given twice as a source of the mix")
    views = tuple(
        describe(s, locking=locking, store=store_for(s) if store_for else None) for s in plain
    )
    joined, maps = joined_classes([v.meta.classes for v in views], names, classes)
    labels = []
    for view, mapping in zip(views, maps, strict=True):
        own = view.meta.labels
        mapped = np.full(len(own), -1, dtype=np.int64)
        known = own >= 0
        mapped[known] = mapping[own[known]] if len(mapping) else -1
        labels.append(mapped)
    metas = [v.meta for v in views]
    first = metas[0]
    listings = [fields_of(m) for m in metas]
    common = [f for f in listings[0] if all(f in fields for fields in listings[1:])]
    num = sum(m.num_samples for m in metas)
    same_array = all(
        m.storage == "array" and m.images_shape[1:] == first.images_shape[1:] for m in metas
    )
    meta = replace(
        first,
        path=" + ".join(names),
        mode=first.mode if all(m.mode == first.mode for m in metas) else "encoded",
        storage="array" if same_array else "blob",
        num_samples=num,
        labels=np.concatenate(labels),
        classes=joined,
        shapes=np.concatenate([m.shapes for m in metas]),
        checksums=np.concatenate([m.checksums for m in metas]),
        source_index=np.concatenate([m.source_index for m in metas]),
        offsets=None,
        sizes=None,
        images_shape=(num, *first.images_shape[1:]) if same_array else (num,),
        skipped=tuple(s for m in metas for s in m.skipped),
        identity=None,
        sample_xxh3=None,
        field_listing=(
            first.field_listing if len(common) == len(listings[0]) else fields_text(common)
        ),
    )
    chunk_map = concatenated_map([v.chunk_map for v in views])
    return MixView(plain, names, views, meta, tuple(maps), chunk_map)


def check_batchable(view: MixView, *, one_size: bool) -> None:
    """Refuse sources whose images cannot be stacked into one batch, naming both."""
    first, first_name = view.views[0].meta, view.names[0]
    for name, source in zip(view.names[1:], view.views[1:], strict=True):
        meta = source.meta
        if meta.channels != first.channels:
            raise OptionsError(
                f"{name} and {first_name} cannot be batched together: their images have "
                f"{meta.channels} and {first.channels} channels (convert one of them with "
                "the other's channels, or collate='list')"
            )
        if one_size:
            continue
        shapes = np.unique(np.concatenate([first.shapes[:, :2], meta.shapes[:, :2]]), axis=0)
        if len(shapes) > 1:
            own = np.unique(meta.shapes[:, :2], axis=0)[0].tolist()
            other = np.unique(first.shapes[:, :2], axis=0)[0].tolist()
            raise OptionsError(
                f"{name} and {first_name} cannot be batched together: their images differ "
                f"in size (H x W {own[0]}x{own[1]} and {other[0]}x{other[1]}, "
                f"mode {meta.mode}/{first.mode}, storage {meta.storage}/{first.storage}); "
                "pass size= to cut every image to one size, or collate='list'"
            )
