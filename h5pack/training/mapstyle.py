"""``H5ImageDataset``: the map-style PyTorch dataset over a pack or a pack set."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset, get_worker_info
from typing_extensions import Self

from h5pack.core.arguments import check_seed
from h5pack.core.fields import IMAGE, KEY, fields_of
from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap, checked_indices
from h5pack.core.vocabulary import OUTPUTS, Output
from h5pack.errors import OptionsError
from h5pack.read.crop import CropSpec
from h5pack.read.packset import PackSource, PackView, describe
from h5pack.read.planned import ReadPlan
from h5pack.read.pool import ReadPool
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.read.setreader import PackSetReader, open_reader
from h5pack.training.batch import (
    SampleBatch,
    SharedEpoch,
    as_output,
    batch_labels,
    check_source,
    fields_for,
)
from h5pack.training.cache import CacheSpec, DecodedCache
from h5pack.training.epochs import window_for
from h5pack.training.fixed_size import FixedSizeReader
from h5pack.training.geometry import crop_fields
from h5pack.training.ring import BatchRing, batch_buffer
from h5pack.training.stats import stage_times, timed_read

# NOTE [ h5py handles and fork ]
#
# An HDF5 handle must not cross ``fork`` nor be pickled for ``spawn``. A dataset holds its
# source and ``PackView`` (each shard's checked identity) and opens its reader lazily once
# per process (keyed on the pid); ``__getstate__`` drops it.


def check_delivery(output: Output, cache: object, pipeline: CropSpec | None, seed: int) -> None:
    """Refuse an unknown ``output``, a cache without a pipeline, a bad seed (before any read)."""
    if output not in OUTPUTS:
        raise OptionsError(f"output should be one of {', '.join(OUTPUTS)}, but got {output!r}")
    if cache is not None and pipeline is None:
        raise OptionsError(
            "cache='decoded' keeps images before the random crop, so it needs size= (the size "
            "every image is cut to) or pipeline="
        )
    check_seed("seed", seed)


class H5ImageDataset(Dataset[tuple[Any, ...]]):
    """Map-style dataset over a pack: ``(image, label)`` or ``(image, label, path)``.

    ``__getitems__`` (PyTorch's batched fetch) reads each chunk once; the file is opened
    lazily once per process (NOTE [ h5py handles and fork ]).

    Args:
        path: The pack, a pack set (directory or ``packset.json``) or a list of packs, read
            as one; URLs too (``s3://bucket/pack.h5``).
        transform: Applied to each image, or to each sample's dict with ``fields``.
        output: ``"tensor"`` (C, H, W) uint8, ``"hwc"`` (H, W, C) array, or ``"pil"``.
        reader: How each process reads (``ReaderOptions``); the window defaults to the
            sampler's (``make_loader`` sets it).
        pipeline: Deliver every image at ``pipeline.size`` (``CropSpec``: crop, resize,
            flip, a pure function of ``seed``, epoch and sample).
        cache: Decoded images shared by every worker (encoded packs, with a pipeline): a
            ``CacheSpec`` or a ``DecodedCache``.
        seed: Seed of the random crops and flips.
        weights: Mix several sources by weight: an ``H5MixDataset`` (``training.mixed``).
        fields: The fields to deliver as dicts (docs/fields.md); default: every field of a
            pack of more than image + label, else tuples.

    Raises:
        FileNotFoundError: the pack (a shard, a manifest) does not exist.
        FormatError: not a pack, or a shard missing, changed or unlike the others (named).
    """

    # what weights= builds: set by training.mixed (which training.dataset imports)
    mix_class: ClassVar[type[H5ImageDataset] | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> H5ImageDataset:  # noqa: D102
        if cls is H5ImageDataset and kwargs.get("weights") is not None:
            if H5ImageDataset.mix_class is None:
                raise OptionsError("weights= needs h5pack.training.mixed imported")
            return super().__new__(H5ImageDataset.mix_class)
        return super().__new__(cls)

    def __init__(
        self,
        path: PackSource,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        output: Output = "tensor",
        return_path: bool = False,
        reader: ReaderOptions | None = None,
        pipeline: CropSpec | None = None,
        cache: CacheSpec | DecodedCache | None = None,
        seed: int = 0,
        weights: Sequence[float] | None = None,
        fields: Sequence[str] | None = None,
    ) -> None:
        if weights is not None:  # H5MixDataset's own __init__ takes them
            raise OptionsError("weights= makes an H5MixDataset (training/mixed.py)")
        check_delivery(output, cache, pipeline, seed)
        self.source = check_source("path", path)
        self.options = reader or ReaderOptions()
        self.view: PackView = describe(
            self.source,
            locking=self.options.locking,
            store=self.options.store_for(self.source),
        )
        # the pack's path; a set's manifest (or a list's first pack), as its metadata says
        self.path = self.source if isinstance(self.source, str) else self.view.meta.path
        self.meta: PackMeta = self.view.meta
        self.chunk_map: ChunkMap = self.view.chunk_map
        self.group_bytes = self.view.group_bytes
        self.compressed = self.view.compressed
        self._deliver(transform, target_transform, output, return_path, fields, pipeline, seed)
        if pipeline is not None:  # imported before workers fork (docs/decisions/0025)
            import cv2  # noqa: F401
        if isinstance(cache, CacheSpec):
            if self.meta.mode == "raw":
                raise OptionsError(
                    f"cache='decoded' applies to encoded packs; {self.path} stores decoded "
                    "pixels already (its chunks are the cache)"
                )
            cache = cache.build(self.meta.num_samples)
        self.cache = cache

    def _deliver(
        self,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[int], Any] | None,
        output: Output,
        return_path: bool,
        fields: Sequence[str] | None,
        pipeline: CropSpec | None,
        seed: int,
    ) -> None:
        """Set what is delivered and how, and the per-process state (with a mix's too)."""
        self.transform = transform
        self.target_transform = target_transform
        self.output: Output = output
        self.return_path = return_path
        self.fields = fields_for(self.meta, fields, return_path=return_path)
        self.crop = pipeline  # the training image pipeline (a CropSpec), None: as stored
        self.seed = seed
        self._epoch = SharedEpoch()
        self._reader: PackReader | PackSetReader | None = None
        self._fixed: FixedSizeReader | None = None
        self._pid = -1
        # the rank's batches of an epoch (set by make_loader): a remote reader reads ahead by it
        self.planner: Callable[[int], Sequence[np.ndarray]] | None = None
        self.ring: BatchRing | None = None  # the loader's worker buffers (NOTE [ Batch ring ])
        # threads shared with the other sources of a mix (NOTE [ One pool for a mix's sources ])
        self.pool: ReadPool | None = None
        self._planned: tuple[int, int] | None = None  # (epoch, worker) planned last

    def configured(self, options: ReaderOptions, *, seed: int | None = None) -> Self:
        """A copy that reads with ``options``, with its own epoch (and ``seed`` when given)."""
        twin = copy.copy(self)
        twin.options = options
        twin.seed = self.seed if seed is None else seed
        twin._epoch = SharedEpoch(self.epoch)  # the copy's process-local state is reset
        return twin

    @property
    def epoch(self) -> int:
        """The epoch whose random crops and flips are served."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the random crops and flips (seen by running workers too)."""
        self._epoch.value = epoch

    @property
    def reader(self) -> PackReader | PackSetReader:
        """This process's reader, opened on first use (NOTE [ h5py handles and fork ])."""
        if self._reader is None or self._pid != os.getpid():
            options = self.options
            if options.window_chunks is None:
                options = replace(options, window_chunks=window_for(group_bytes=self.group_bytes))
            # the files this dataset's labels came from, or a FormatError: never a mix of two
            self._reader = open_reader(self.source, options, view=self.view)
            if self.pool is not None and isinstance(self._reader, PackReader):
                self._reader.use_pool(self.pool)
            self._fixed = None
            self._planned = None
            self._pid = os.getpid()
        return self._reader

    def close(self) -> None:
        """Close this process's reader (it reopens on the next read)."""
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None, "_fixed": None, "_pid": -1, "_planned": None}

    def __len__(self) -> int:
        return self.meta.num_samples

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; labels index into them."""
        return self.meta.classes

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label, in pack order."""
        return self.meta.labels

    def __getitem__(self, index: int) -> Any:
        sample = self.__getitems__([index])[0]
        if isinstance(sample, dict):  # a pack of fields: one sample's record
            return sample
        if self.output == "tensor" and self.transform is None:
            # one sample on its own: a plain contiguous (C, H, W) tensor
            return (sample[0].contiguous(), *sample[1:])
        return sample

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """Return the samples ``indices``, reading each chunk once (PyTorch's batched fetch)."""
        times = stage_times()
        start = times.clock()
        idx = checked_indices(indices, self.meta.num_samples)
        reader = self.reader
        self._follow_plan(reader)
        keyed = self.return_path or (self.fields is not None and KEY in self.fields)
        paths = [reader.paths[i] for i in idx.tolist()] if keyed else None
        batch = self._images(idx, paths, start)
        if self.fields is not None:  # the values of its stored fields, spatial ones cropped
            batch.fields = self.fields
            batch.values = self.field_values(idx, self.fields, reader)
            batch.kinds = {f.name: f for f in fields_of(self.meta)}
            batch.records = batch.records_of(self.transform)  # in this thread, as below
        return batch

    def _images(self, idx: np.ndarray, paths: list[str] | None, start: int) -> SampleBatch:
        """The images and labels of samples ``idx`` (``__getitems__`` without the fields)."""
        reader = self.reader
        times = stage_times()
        labels, label_tensor = batch_labels(self.meta.labels[idx], self.target_transform)
        if self.fields is not None and IMAGE not in self.fields:  # none asked: none read
            return SampleBatch(labels=label_tensor, label_values=labels, paths=paths)
        crop = None if self.crop is None else (*self.crop.size, self.meta.channels)
        one_shape = self.batch_shape() or crop  # the images' one shape, else None
        if one_shape is not None:
            shape = (idx.size, *one_shape)
            whole = self.transform is None and self.output != "pil"
            buffer = batch_buffer(self.ring, shape) if whole else None
            out = buffer.numpy() if buffer is not None else np.empty(shape, dtype=np.uint8)
            if self.crop is not None:  # the pipeline times its own stages
                reading = times.clock()
                self._fixed_reader().read_into(idx, out, seed=self.seed, epoch=self.epoch)
                working = times.clock() - reading
            else:
                _, working = timed_read(reader, lambda: reader.read_into(idx, out))
            if buffer is None:
                return self._samples(list(out), labels, paths)
            images: Any = buffer.permute(0, 3, 1, 2) if self.output == "tensor" else out
            times.add("collation", times.clock() - start - working)
            return SampleBatch(images=images, labels=label_tensor, label_values=labels, paths=paths)
        stored, working = timed_read(reader, lambda: reader.read_stored(idx))
        items = list(zip(idx.tolist(), stored, strict=True))
        decoding = times.clock()
        if self.meta.mode == "encoded":
            # Pillow and OpenCV release the GIL while decoding: threads decode in parallel.
            hwc = reader.map_threads(lambda item: reader.decode(*item), items)
        else:
            hwc = [reader.decode(i, data) for i, data in items]
        decoded = times.clock() - decoding
        times.add("decode", decoded)
        times.add("collation", times.clock() - start - working - decoded)
        return self._samples(hwc, labels, paths)

    def field_values(
        self,
        idx: np.ndarray,
        names: Sequence[str],
        reader: PackReader | PackSetReader | None = None,
    ) -> dict[str, list[Any]]:
        """The values of the stored fields ``names`` of samples ``idx``, cropped as the images."""
        found = (reader or self.reader).read_fields(idx, names, packed=self.crop is not None)
        crop_fields(found, idx, self)
        return found

    def batch_shape(self) -> tuple[int, int, int] | None:
        """(H, W, C) of the images ``read_batch_into`` delivers, or None (transform, PIL, sizes)."""
        if self.transform is not None or self.output == "pil":
            return None
        if self.crop is not None:
            return (*self.crop.size, self.meta.channels)
        return self.meta.fixed_shape

    def read_batch_into(self, indices: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (B, H, W, C) with the images ``__getitems__`` would batch."""
        shape = self.batch_shape()
        if shape is None or tuple(out.shape[1:]) != shape:
            raise OptionsError(
                f"{self.path} delivers images of shape {shape}, not a batch of {out.shape[1:]}"
            )
        reader = self.reader
        self._follow_plan(reader)
        if self.crop is not None:
            self._fixed_reader().read_into(indices, out, seed=self.seed, epoch=self.epoch)
        else:
            reader.read_into(indices, out)

    def _fixed_reader(self) -> FixedSizeReader:
        assert self.crop is not None
        if self._fixed is None:
            self._fixed = FixedSizeReader(self.reader, self.crop, self.cache)
        return self._fixed

    def _follow_plan(self, reader: PackReader | PackSetReader) -> None:
        """Tell a remote reader this worker's plan once per epoch (NOTE [ Planned read-ahead ])."""
        plan = self._worker_plan() if self.planner is not None and reader.plans_reads else None
        if plan is not None:
            reader.plan_reads(plan)

    def _worker_plan(self) -> ReadPlan | None:
        """This worker's read plan of the epoch the first time it is asked for, else None."""
        assert self.planner is not None
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self._planned == (self.epoch, worker):
            return None
        self._planned = (self.epoch, worker)
        return read_plan(self.planner, epoch=self.epoch, worker=worker, num_workers=workers)

    def _samples(
        self, hwc: list[np.ndarray], labels: list[Any], paths: list[str] | None
    ) -> SampleBatch:
        """One sample at a time: converted to ``output``, then ``transform`` (this thread)."""
        samples, transform = [], self.transform if self.fields is None else None
        for j, array in enumerate(hwc):
            image = as_output(array, self.output)
            if transform is not None:  # in this thread: user transforms may share state
                image = transform(image)
            samples.append((image, labels[j]) if paths is None else (image, labels[j], paths[j]))
        return SampleBatch(samples, paths=paths)


# What a worker tells its remote reader of the plan: its samples, and its rank's future. The
# rank's batches of this epoch and the next are pure functions of the seed and epoch, and the
# DataLoader gives batch b to worker b mod W; batch b of B in epoch e is used at time
# e + b / B (``read/planned.py``).


def _uses(batches: Sequence[np.ndarray], epoch: int) -> tuple[np.ndarray, np.ndarray]:
    if not batches:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    samples = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches])
    counts = np.array([len(b) for b in batches])
    times = np.repeat(epoch + np.arange(len(batches)) / len(batches), counts)
    return samples, times


def read_plan(
    plan: Callable[[int], Sequence[np.ndarray]],
    *,
    epoch: int,
    worker: int,
    num_workers: int,
) -> ReadPlan:
    """Return worker ``worker``'s read plan of ``epoch``; ``plan`` gives the rank's batches."""
    now, later = plan(epoch), plan(epoch + 1)
    workers = max(1, num_workers)
    all_samples, all_times = _uses(now, epoch)
    next_samples, next_times = _uses(later, epoch + 1)
    counts = np.array([len(b) for b in now], dtype=np.int64)
    owner = np.repeat(np.arange(len(now)) % workers, counts)
    mine = owner == worker
    return ReadPlan(
        samples=all_samples[mine],
        times=all_times[mine],
        future_samples=np.concatenate([all_samples, next_samples]),
        future_times=np.concatenate([all_times, next_times]),
    )
