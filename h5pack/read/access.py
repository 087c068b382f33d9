"""Random access to a pack's samples by index or key: ``h5pack.open`` (decision 0041).

``pack[i]`` is one sample's fields as a dict, ``pack[a:b]`` (or a list) a list of them, read
a chunk group at a time and checked as the loader checks; ``pack.find(key)`` a key's index.
It holds a path, not a handle: it pickles into a DataLoader worker, which opens it again.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, overload

import numpy as np

from h5pack.core.fields import (
    IMAGE,
    KEY,
    LABEL,
    CategoryField,
    Field,
    MultiLabelField,
    fields_of,
    selected,
    stored_fields,
)
from h5pack.core.layout import checked_indices
from h5pack.core.store import Store
from h5pack.read.mixture import source_name
from h5pack.read.packset import PackSource, PackView
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.read.setreader import PackSetReader, open_reader

Sample = dict[str, Any]


class Pack:
    """A pack (or a pack set) read sample by sample; a context manager, read-only.

    Args:
        source: A pack's path or URL, a pack set's directory, prefix or ``packset.json``, or
            a list of packs.
        fields: The fields each sample holds (default: every field listed, with ``key``);
            without ``image`` no image is read.
        storage_options: The remote client's settings for a URL (as ``make_loader``'s).
        store: The store the pack is kept in (instead of ``storage_options``).
        options: How to read (its ``storage_options`` and ``store`` replaced by these).
    """

    def __init__(
        self,
        source: PackSource,
        *,
        fields: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        store: Store | None = None,
        options: ReaderOptions | None = None,
    ) -> None:
        options = options or ReaderOptions()
        if store is None:
            store = options.store_for(source) if storage_options is None else None
        self._options = replace(options, store=store, storage_options=storage_options)
        self._source = source if isinstance(source, str | os.PathLike) else list(source)
        self._reader: PackReader | PackSetReader | None = open_reader(source, self._options)
        meta = self._reader.meta
        self._view = (
            self._reader.view if isinstance(self._reader, PackSetReader) else PackView.of(meta)
        )
        self._names = selected(meta, fields, key=True)
        self._keys: dict[str, int] | None = None

    def __len__(self) -> int:
        return self._view.meta.num_samples

    @property
    def fields(self) -> dict[str, Field]:
        """The fields each sample holds, by name (their kind, dtype and shape)."""
        listed = {f.name: f for f in fields_of(self._view.meta)}
        return {name: listed[name] for name in self._names}

    @property
    def classes(self) -> list[str] | dict[int, str]:
        """The class names: ``label`` ``k`` is ``classes[k]``."""
        meta = self._view.meta
        listed = fields_of(meta)
        named = next((f for f in listed if isinstance(f, CategoryField)), None)
        if named is not None:
            return dict(named.categories)
        multi = next((f for f in listed if isinstance(f, MultiLabelField)), None)
        return list(multi.classes if multi is not None and not meta.classes else meta.classes)

    @property
    def keys(self) -> Sequence[str]:
        """Every sample's key (its name in the source), in pack order."""
        return self._open().paths

    def find(self, key: str) -> int:
        """Return the index of the sample whose key is ``key``."""
        if self._keys is None:
            self._keys = {}
            for index, name in enumerate(self.keys):
                self._keys.setdefault(name, index)
        try:
            return self._keys[key]
        except KeyError:
            raise KeyError(f"no sample of {self.name} has the key {key!r}") from None

    @property
    def name(self) -> str:
        """How messages name the pack: its path or URL."""
        return source_name(self._source)

    @overload
    def __getitem__(self, index: int | np.integer) -> Sample: ...

    @overload
    def __getitem__(self, index: slice | Sequence[int] | np.ndarray) -> list[Sample]: ...

    def __getitem__(
        self, index: int | np.integer | slice | Sequence[int] | np.ndarray
    ) -> Sample | list[Sample]:
        """Return sample ``index`` (negative: from the end), or a list for a slice or list."""
        if isinstance(index, int | np.integer):
            return self._read(np.array([int(index)]))[0]
        if isinstance(index, slice):
            return self._read(np.arange(*index.indices(len(self))))
        idx = np.asarray(index)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(
                "a pack is indexed by an int, a slice or a list of ints, but got "
                f"{type(index).__name__}"
            )
        return self._read(idx)

    def __iter__(self) -> Iterator[Sample]:
        """Yield every sample in pack order, read a chunk group at a time."""
        starts = self._view.chunk_map.starts.tolist()
        for lo, hi in itertools.pairwise(starts):
            yield from self._read(np.arange(lo, hi))

    def _read(self, indices: np.ndarray) -> list[Sample]:
        reader = self._open()
        meta = self._view.meta
        idx = checked_indices(indices, meta.num_samples, self.name)
        if not idx.size:
            return []
        columns: dict[str, Sequence[Any]] = {}
        if IMAGE in self._names:
            columns[IMAGE] = reader.read_images(idx)
        if LABEL in self._names:
            columns[LABEL] = meta.labels[idx].tolist()
        if KEY in self._names:
            columns[KEY] = [reader.paths[i] for i in idx.tolist()]
        others = [f.name for f in stored_fields(fields_of(meta)) if f.name in self._names]
        if others:
            columns.update(reader.read_fields(idx, others))
        return [{name: columns[name][k] for name in self._names} for k in range(idx.size)]

    def _open(self) -> PackReader | PackSetReader:
        if self._reader is None:
            self._reader = open_reader(self._source, self._options, view=self._view)
        return self._reader

    def close(self) -> None:
        """Close the pack (a later read opens it again)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> Pack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None, "_keys": None}

    def __repr__(self) -> str:
        return f"Pack({self.name!r}, {len(self)} samples, fields: {', '.join(self._names)})"
