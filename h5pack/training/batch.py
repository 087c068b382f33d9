"""What the datasets and the loader share: the source check, ``SampleBatch``, collation."""

from __future__ import annotations

import copy
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from types import SimpleNamespace
from typing import Any, overload

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from h5pack.core.fields import IMAGE, KEY, LABEL, Field, fields_of, selected, stored_fields
from h5pack.core.format import PackMeta
from h5pack.core.vocabulary import Output
from h5pack.errors import OptionsError
from h5pack.training.geometry import as_value, collate_records, pad_batch
from h5pack.training.ring import batch_buffer


def check_source(name: str, source: object) -> str | tuple[str, ...]:
    """Return ``source`` as plain strings: a path, or a tuple of pack paths; else raise."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    if isinstance(source, list | tuple) and all(isinstance(p, str | os.PathLike) for p in source):
        return tuple(os.fspath(p) for p in source)
    raise OptionsError(
        f"{name} should be a pack path, a pack set (its directory or packset.json) or a "
        f"list of pack paths, but got {name}={source!r}"
    )


def fields_for(
    meta: PackMeta, names: Sequence[str] | None, *, return_path: bool
) -> tuple[str, ...] | None:
    """The fields a dataset delivers as dicts, or None: image + label tuples."""
    if names is None and not stored_fields(fields_of(meta)):
        return None
    return selected(meta, names, key=return_path)


def batch_labels(
    raw: np.ndarray, target_transform: Callable[[int], Any] | None
) -> tuple[list[Any], torch.Tensor | None]:
    """A batch's labels one by one, and as a tensor when no ``target_transform`` maps them."""
    if target_transform is None:
        return raw.tolist(), torch.from_numpy(raw.copy())
    return [target_transform(int(v)) for v in raw], None


def as_output(hwc: np.ndarray, output: Output) -> Any:
    """One (H, W, C) image as ``output`` asks: the array, a PIL image, a (C, H, W) tensor."""
    if output == "hwc":
        return hwc
    if output == "pil":
        return Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc)
    return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))


class SampleBatch(Sequence[tuple[Any, ...]]):
    """The samples of one ``__getitems__`` call, and the whole batch when already built.

    A sequence of ``(image, label[, path])`` like any dataset's batch, so any collate works;
    ``collate_batch`` takes ``images`` and ``labels`` directly. Built at once, the
    per-sample tuples are views made on access.

    Attributes:
        images: ``(B, C, H, W)`` uint8 tensor (channels-last) or ``(B, H, W, C)`` array, or
            None when the samples were produced one by one.
        labels: ``(B,)`` int64 tensor, or None (with a ``target_transform``).
        paths: Source paths with ``return_path``, else None.
        sources: ``(B,)`` each sample's source in a mix with ``return_source``, else None.
        fields: The field names delivered (each sample and batch a dict), or None.
        values: The values of each stored field delivered, per sample.
        records: What a ``transform=`` returned for each sample's dict, or None.
    """

    def __init__(
        self,
        samples: list[tuple[Any, ...]] | None = None,
        *,
        images: Any = None,
        labels: torch.Tensor | None = None,
        label_values: list[Any] | None = None,
        paths: list[str] | None = None,
        sources: torch.Tensor | None = None,
        fields: tuple[str, ...] | None = None,
        values: Mapping[str, list[Any]] | None = None,
    ) -> None:
        self._samples = samples
        self.fields = fields
        self.values = dict(values or {})
        self.kinds: dict[str, Field] = {}  # the fields by name (their ``collate``)
        self.records: list[Any] | None = None
        self.sources = sources
        self.images = images
        self.labels = labels
        self._label_values = label_values or []
        self.paths = paths

    def __len__(self) -> int:
        return len(self._samples) if self._samples is not None else len(self._label_values)

    @overload
    def __getitem__(self, j: int) -> Any: ...  # a tuple, or a dict of fields

    @overload
    def __getitem__(self, j: slice) -> list[tuple[Any, ...]]: ...

    def __getitem__(self, j: int | slice) -> Any:
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        if self.records is not None:
            return self.records[j]
        if self.fields is not None:
            return self._record(j)
        return self._tuple(j)

    def _tuple(self, j: int) -> tuple[Any, ...]:
        if self._samples is not None:
            return self._samples[j]
        label = self._label_values[j]
        extra: tuple[Any, ...] = () if self.paths is None else (self.paths[j],)
        if self.sources is not None:
            extra = (*extra, int(self.sources[j]))
        return (None if self.images is None else self.images[j], label, *extra)

    def _record(self, j: int) -> dict[str, Any]:
        """Sample ``j`` as a dict of its fields (image, label and key from the tuple)."""
        image, label, *rest = self._tuple(j)
        known = {IMAGE: image, LABEL: label, KEY: rest[0] if self.paths is not None else None}
        assert self.fields is not None  # the caller checked
        return {n: known[n] if n in known else self.values[n][j] for n in self.fields}

    def records_of(self, transform: Callable[[Any], Any] | None) -> list[Any] | None:
        """``transform`` of each sample's dict: arrays as tensors, numbers plain (``as_value``)."""
        if transform is None:
            return None
        return [
            transform({n: as_value(v) for n, v in self._record(j).items()})
            for j in range(len(self))
        ]

    def without_fields(self) -> SampleBatch:
        """This batch as image + label tuples (what ``collate_batch`` stacks)."""
        plain = copy.copy(self)
        plain.fields = None
        return plain


class SharedEpoch:
    """An epoch number that running DataLoader workers see change (shared memory).

    Shared only with processes being started; a copy or a pickle made elsewhere keeps the value.
    """

    def __init__(self, value: int = 0) -> None:
        self._value: Any = multiprocessing.get_context().RawValue("q", value)

    @property
    def value(self) -> int:
        """The epoch."""
        return int(self._value.value)

    @value.setter
    def value(self, epoch: int) -> None:
        self._value.value = int(epoch)

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is None:
            return {"_value": SimpleNamespace(value=self.value)}  # outside its process tree
        return {"_value": self._value}


def collate_fields(batch: SampleBatch, collate: Callable[[Any], Any]) -> Any:
    """Collate a batch of fields into a dict: image, label, key by ``collate``, the rest by kind."""
    assert batch.fields is not None  # the caller checked
    if batch.records is not None:  # what transform= returned for each sample
        return collate_records(batch.records)
    if IMAGE in batch.fields:
        image, label, *rest = collate(batch.without_fields())
        known = {IMAGE: image, LABEL: label, KEY: rest[0] if batch.paths is not None else None}
    else:  # no image was read (``H5ImageDataset.fields``)
        plain = batch.without_fields()
        label = plain.labels if plain.labels is not None else [s[1] for s in plain]
        known = {LABEL: label, KEY: batch.paths}
    return {
        name: known[name] if name in known else batch.kinds[name].collate(batch.values[name])
        for name in batch.fields
    }


def collate_list(batch: Sequence[Any]) -> Any:
    """Collate samples into ``(list of images, labels[, paths])``: images keep their sizes."""
    if isinstance(batch, SampleBatch) and batch.fields is not None:
        return collate_fields(batch, collate_list)
    images = [sample[0] for sample in batch]
    return (images, *_collate_rest(batch))


def _collate_rest(batch: Sequence[Any]) -> list[Any]:
    """The fields after the image: labels (and sources) as tensors, paths as a list."""
    rest = []
    for k in range(1, len(batch[0])):
        values = [s[k] for s in batch]
        rest.append(values if isinstance(values[0], str) else default_collate(values))
    return rest


def collate_padded(batch: Sequence[Any]) -> Any:
    """``collate_batch``, then each variable-length field zero-padded with ``NAME_lengths``."""
    return pad_batch(collate_batch(batch))


def collate_batch(batch: Sequence[Any]) -> Any:
    """Collate samples into ``(images, labels[, paths])``, with one preallocated tensor.

    A ``SampleBatch`` already one batch is returned as it is; equal-shape uint8 tensors are
    copied into one; anything else goes to ``default_collate``.
    """
    if isinstance(batch, SampleBatch) and batch.fields is not None:
        return collate_fields(batch, collate_batch)
    if isinstance(batch, SampleBatch) and batch.images is not None and batch.labels is not None:
        images = batch.images
        if isinstance(images, np.ndarray):
            images = torch.from_numpy(images)
        out: tuple[Any, ...] = (images, batch.labels)
        if batch.paths is not None:
            out = (*out, batch.paths)
        return out if batch.sources is None else (*out, batch.sources)
    if not batch:
        return default_collate(list(batch))
    first = batch[0][0]
    same = isinstance(first, torch.Tensor) and all(
        isinstance(s[0], torch.Tensor) and s[0].shape == first.shape and s[0].dtype == first.dtype
        for s in batch
    )
    if not same or first.dtype != torch.uint8:
        return default_collate(list(batch))
    images = batch_buffer(None, (len(batch), *first.shape))
    # NOTE [ numpy copies ]: numpy views keep torch's intra-op threads asleep; ``copy_`` wakes
    # them for every image and they steal the decoding cores (docs/decisions/0025).
    target = images.numpy()
    for j, sample in enumerate(batch):
        target[j] = sample[0].numpy()
    return (images, *_collate_rest(batch))


class ContiguousCollate:
    """Collate, then make the image batch contiguous (in the worker: picklable)."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, samples: Any) -> Any:
        """Return the collated batch with a contiguous image tensor."""
        batch = self.collate(samples)
        if isinstance(batch, tuple) and batch and isinstance(batch[0], torch.Tensor):
            return (batch[0].contiguous(), *batch[1:])
        if isinstance(batch, dict) and isinstance(batch.get(IMAGE), torch.Tensor):
            return {**batch, IMAGE: batch[IMAGE].contiguous()}
        return batch
