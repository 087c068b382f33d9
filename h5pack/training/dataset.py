"""PyTorch datasets over a pack: map-style ``H5ImageDataset`` and ``H5IterableDataset``."""

from __future__ import annotations

import copy
import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from multiprocessing.context import get_spawning_popen
from typing import Any, overload

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from h5pack.core.arguments import check_seed
from h5pack.core.fields import (
    IMAGE,
    KEY,
    LABEL,
    Field,
    fields_of,
    selected,
    spatial,
    stored_fields,
)
from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap, checked_indices
from h5pack.core.vocabulary import OUTPUTS as OUTPUTS  # re-exported
from h5pack.core.vocabulary import Output as Output
from h5pack.errors import OptionsError
from h5pack.read.crop import CropSpec
from h5pack.read.cropplan import plan_crops
from h5pack.read.packset import PackSetReader, PackSource, PackView, describe, open_reader
from h5pack.read.planned import ReadPlan
from h5pack.read.pool import ReadPool
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.cache import CacheSpec, DecodedCache
from h5pack.training.fixed_size import FixedSizeReader
from h5pack.training.orders import Order
from h5pack.training.readplan import read_plan
from h5pack.training.ring import BatchRing, batch_buffer
from h5pack.training.sampler import (
    ChunkSampler,
    EpochSpec,
    distributed_defaults,
    order_for,
    plan_epoch,
    resolve_data,
    samples_per_rank,
    window_for,
)
from h5pack.training.stats import stage_times, timed_read

# NOTE [ h5py handles and fork ]
#
# An HDF5 handle must not cross ``fork`` (the child would share the parent's library state)
# and cannot be pickled for ``spawn``/``forkserver``. The datasets hold a path and open a
# ``PackReader`` lazily, once per process (keyed on the pid); ``__getstate__`` drops it, so
# every DataLoader start method works and each worker opens its own handle, with hdf5plugin
# registered by ``format.open_h5`` in that worker. A pack set is the same: the dataset
# holds its ``PackView`` (``read.packset.describe``: the combined metadata and each shard's
# checked identity) and each process opens a ``PackSetReader`` from it, which opens shards
# as it reads them and refuses any shard that is not the file the view checked.


def check_source(name: str, source: object) -> PackSource:
    """Return ``source`` if it can name a pack or a set, else raise ``OptionsError`` naming it.

    A path (``str`` or ``os.PathLike``), or a list or tuple of them (issue 20 F: a path of
    None or 5 raised a bare ``TypeError`` from deep inside).
    """
    if isinstance(source, str | os.PathLike):
        return source
    if isinstance(source, list | tuple) and all(isinstance(p, str | os.PathLike) for p in source):
        return source
    raise OptionsError(
        f"{name} should be a pack path, a pack set (its directory or packset.json) or a "
        f"list of pack paths, but got {name}={source!r}"
    )


def source_of(source: PackSource) -> str | tuple[str, ...]:
    """Return ``source`` as plain strings: a path, or a tuple of pack paths."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return tuple(os.fspath(p) for p in source)


def fields_for(
    meta: PackMeta, names: Sequence[str] | None, *, return_path: bool
) -> tuple[str, ...] | None:
    """The fields a dataset delivers as dicts, or None: image + label tuples.

    Raises:
        OptionsError: a name the pack does not list.
    """
    if names is None and not stored_fields(fields_of(meta)):
        return None
    return selected(meta, names, key=return_path)


def empty_uint8(shape: Sequence[int]) -> torch.Tensor:
    """Return an uninitialised uint8 tensor; in a DataLoader worker, in shared memory.

    A batch built in shared memory crosses to the main process without the extra copy
    the worker's pickler would otherwise make (``default_collate`` does the same).
    """
    return batch_buffer(None, shape)


class SampleBatch(Sequence[tuple[Any, ...]]):
    """The samples of one ``__getitems__`` call, and the whole batch when already built.

    A sequence of ``(image, label[, path])`` like any PyTorch dataset's batch, so any
    collate function works; ``h5pack.training.loader.collate_batch`` takes ``images`` and ``labels``
    directly instead of stacking the samples again. When the batch was built at once the
    per-sample tuples are views made on access, not before.

    Attributes:
        images: ``(B, C, H, W)`` uint8 tensor (channels-last memory) or ``(B, H, W, C)``
            array, or None when the samples were produced one by one.
        labels: ``(B,)`` int64 tensor, or None (with a ``target_transform``).
        paths: Source paths with ``return_path``, else None.
        sources: ``(B,)`` int64 tensor: each sample's source in a mix, with
            ``return_source`` (training/mixed.py), else None.
        fields: A dataset of fields (``H5ImageDataset.fields``): the names delivered, in
            order; each sample is then a dict, and the batch too (``collate_batch``).
        values: The values of each stored field delivered (``core.fields``), per sample.
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

    def without_fields(self) -> SampleBatch:
        """This batch as image + label tuples (what ``collate_batch`` stacks)."""
        plain = copy.copy(self)
        plain.fields = None
        return plain


class _Epoch:
    """A stand-in for the shared epoch value once the dataset leaves its process tree."""

    def __init__(self, value: int) -> None:
        self.value = value


class SharedEpoch:
    """An epoch number that DataLoader workers already running see change (shared memory).

    It travels as shared memory only to processes being started (fork, spawn, forkserver);
    a copy or a pickle made elsewhere keeps the value.
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
            return {"_value": _Epoch(self.value)}
        return {"_value": self._value}


class H5ImageDataset(Dataset[tuple[Any, ...]]):
    """Map-style dataset over a pack: ``(image, label)`` or ``(image, label, path)``.

    Works with every mode and layout the converter writes. ``__getitems__`` (PyTorch's
    batched fetch) groups the requested indices by chunk and reads each chunk once; a
    compressed chunk is then kept in a window of ``window_chunks`` decompressed chunks, so
    with ``ChunkBatchSampler`` each chunk is decompressed once per epoch. The file is opened
    lazily once per process (see the note "h5py handles and fork").

    Args:
        path: The pack; or a pack set (its directory or ``packset.json``) or a list of packs,
            read as one pack: global indices run through the shards in order. URLs too:
            ``s3://bucket/pack.h5``, a set's prefix ``s3://bucket/set/`` or its
            ``packset.json``, a list of URLs (``ReaderOptions.store_for`` reaches them).
        transform: Any callable applied to each image (torchvision v2 transforms work).
        target_transform: Any callable applied to each label (an int, -1 when unlabeled).
        output: ``"tensor"``: (C, H, W) uint8 tensor; ``"hwc"``: (H, W, C) uint8 array;
            ``"pil"``: a PIL image.
        return_path: Also return the sample's source path.
        reader: How each process reads the pack (``ReaderOptions``): window of decompressed
            chunks (default: the sampler's, which ``make_loader`` sets, else
            ``sampler.window_for``), threads, checksums, decoder.
        pipeline: Deliver every image at ``pipeline.size`` (``read.crop.CropSpec``:
            random-resized or center crop, or a plain resize, and a horizontal flip),
            whatever its stored size: the training image pipeline (``training.fixed_size``).
            Boxes and flips are a pure function of (``seed``, epoch, sample); ``set_epoch``
            selects the epoch. The same object as ``make_loader(pipeline=...)``.
        cache: Decoded images shared by the main process and every worker, for encoded
            packs read with a pipeline: epochs after the first skip decoding what fits in
            its budget. A ``training.cache.CacheSpec`` (the dataset builds the cache, as
            ``make_loader(cache=...)`` does) or a ``DecodedCache`` built by the caller.
        seed: Seed of the random crops and flips.
        weights: Mix several sources by weight: ``path`` is then a list of sources (packs,
            pack sets, lists of packs) and the dataset an ``H5MixDataset``
            (training/mixed.py), which also takes ``classes=`` and ``return_source=``.
        crop: The older name of ``pipeline`` (give one of them).
        fields: The fields to deliver (``core.fields``): each sample is then a dict of
            them, as is each batch (``collate_batch``). Default: image + label packs give
            tuples; a pack of more fields gives every field (``key`` with ``return_path``).
            Spatial fields (masks) get the image's crop and flip.

    Raises:
        FileNotFoundError: the pack (a shard, a manifest) does not exist.
        FormatError: the file is not a pack, or of a newer format version; a shard is
            missing, truncated, changed since the manifest was written, or does not match
            the others (the message names the file).
        OptionsError: a path that is neither a path nor a list of them, an unknown
            ``output``, a cache without a pipeline, or a ``CacheSpec`` for a raw pack.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> H5ImageDataset:  # noqa: D102
        if cls is H5ImageDataset and kwargs.get("weights") is not None:
            from h5pack.training.mixed import H5MixDataset

            return super().__new__(H5MixDataset)
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
        crop: CropSpec | None = None,
        fields: Sequence[str] | None = None,
    ) -> None:
        if weights is not None:  # H5MixDataset's own __init__ takes them
            raise OptionsError("weights= makes an H5MixDataset (training/mixed.py)")
        if output not in OUTPUTS:
            raise OptionsError(f"output should be one of {', '.join(OUTPUTS)}, but got {output!r}")
        if crop is not None and pipeline is not None:
            raise OptionsError("give pipeline= (or its older name crop=), not both")
        pipeline = pipeline if pipeline is not None else crop
        if cache is not None and pipeline is None:
            raise OptionsError(
                "cache applies to the training image pipeline; give pipeline= (or size= to "
                "make_loader) with it"
            )
        check_seed("seed", seed)
        self.source = source_of(check_source("path", path))
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
        self.transform = transform
        self.target_transform = target_transform
        self.output: Output = output
        self.return_path = return_path
        self.fields = fields_for(self.meta, fields, return_path=return_path)
        self.crop = pipeline  # the training image pipeline (a CropSpec), None: as stored
        if pipeline is not None:
            # The pipeline's resize kernel, imported here, before DataLoader workers fork:
            # imported by each worker at its first batch instead, it cost every worker CPU
            # every epoch, a remote pack's the most (docs/decisions/0025)
            import cv2  # noqa: F401
        if isinstance(cache, CacheSpec):
            if self.meta.mode == "raw":
                raise OptionsError(
                    f"cache='decoded' applies to encoded packs; {self.path} stores decoded "
                    "pixels already (its chunks are the cache)"
                )
            cache = cache.build(self.meta.num_samples)
        self.cache = cache
        self.seed = seed
        self._epoch = SharedEpoch()
        self._reader: PackReader | PackSetReader | None = None
        self._fixed: FixedSizeReader | None = None
        self._pid = -1
        # The rank's batches of an epoch (``ChunkBatchSampler.plan``, set by make_loader): a
        # remote reader fetches each worker's chunks ahead by it (``training.readplan``).
        self.planner: Callable[[int], Sequence[np.ndarray]] | None = None
        self.ring: BatchRing | None = None  # the loader's worker buffers (NOTE [ Batch ring ])
        # threads shared with the other sources of a mix (NOTE [ One pool for a mix's sources ])
        self.pool: ReadPool | None = None
        self._planned: tuple[int, int] | None = None  # (epoch, worker) planned last

    def configured(self, options: ReaderOptions, *, seed: int | None = None) -> H5ImageDataset:
        """Return a copy of this dataset that reads with ``options`` (this one is unchanged).

        The copy has its own epoch (starting at this one's), and ``seed`` when given.
        """
        twin = copy.copy(self)
        twin.options = options
        twin.seed = self.seed if seed is None else seed
        twin._epoch = SharedEpoch(self.epoch)
        twin._reader = None
        twin._fixed = None
        twin._pid = -1
        twin._planned = None
        return twin

    @property
    def epoch(self) -> int:
        """The epoch whose random crops and flips are served."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the random crops and flips (seen by running workers too)."""
        self._epoch.value = epoch

    # -- process-local file ------------------------------------------------------------
    @property
    def reader(self) -> PackReader | PackSetReader:
        """This process's reader, opened on first use (see "h5py handles and fork").

        A ``PackSetReader`` for a pack set or a list of packs.

        Raises:
            FormatError: the pack at ``path`` (or a shard, when it is opened) is no longer
                the file this dataset was created on (replaced, e.g. by
                ``convert --overwrite``).
        """
        if self._reader is None or self._pid != os.getpid():
            options = self.options
            if options.window_chunks is None:
                window = window_for(
                    window_chunks=None,
                    window_bytes=None,
                    group_bytes=self.group_bytes,
                    num_workers=0,
                )
                options = replace(options, window_chunks=window)
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
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_fixed"] = None
        state["_pid"] = -1
        state["_planned"] = None
        return state

    # -- Dataset protocol ----------------------------------------------------------------
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
        """Return the samples ``indices``, reading each chunk once (PyTorch's batched fetch).

        Raises:
            IndexError: an index is out of range.
            DecodeError: an encoded sample does not decode.
        """
        times = stage_times()
        start = times.clock()
        idx = checked_indices(indices, self.meta.num_samples)
        reader = self.reader
        self._follow_plan(reader)
        keyed = self.return_path or (self.fields is not None and KEY in self.fields)
        paths = [reader.paths[i] for i in idx.tolist()] if keyed else None
        if self.fields is not None:
            return self._with_fields(idx, self._images(idx, paths, start), reader)
        return self._images(idx, paths, start)

    def _images(self, idx: np.ndarray, paths: list[str] | None, start: int) -> SampleBatch:
        """The images and labels of samples ``idx`` (``__getitems__`` without the fields)."""
        reader = self.reader
        times = stage_times()
        raw_labels = self.meta.labels[idx]
        if self.target_transform is None:
            labels: list[Any] = raw_labels.tolist()
            label_tensor: torch.Tensor | None = torch.from_numpy(raw_labels.copy())
        else:
            labels = [self.target_transform(int(v)) for v in raw_labels]
            label_tensor = None
        if self.fields is not None and IMAGE not in self.fields:  # none asked: none read
            return SampleBatch(labels=label_tensor, label_values=labels, paths=paths)
        if self.crop is not None:
            return self._cropped(idx, labels, label_tensor, paths, start)
        fixed = self.meta.fixed_shape
        if fixed is not None and self.transform is None and self.output != "pil":
            buffer = batch_buffer(self.ring, (idx.size, *fixed))
            _, working = timed_read(reader, lambda: reader.read_into(idx, buffer.numpy()))
            images: Any = buffer.permute(0, 3, 1, 2) if self.output == "tensor" else buffer.numpy()
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
        samples = []
        for j, array in enumerate(hwc):
            image = self._convert(array)
            if self.transform is not None:  # in this thread: user transforms may share state
                image = self.transform(image)
            samples.append(self._tuple(image, labels[j], paths, j))
        return SampleBatch(samples, paths=paths)

    def _with_fields(
        self, idx: np.ndarray, batch: SampleBatch, reader: PackReader | PackSetReader
    ) -> SampleBatch:
        """``batch`` with the values of its stored fields (``fields``), spatial ones cropped."""
        assert self.fields is not None  # the caller checked
        batch.fields = self.fields
        batch.values = self.field_values(idx, self.fields, reader)
        batch.kinds = {f.name: f for f in fields_of(self.meta)}
        return batch

    def field_values(
        self,
        idx: np.ndarray,
        names: Sequence[str],
        reader: PackReader | PackSetReader | None = None,
    ) -> dict[str, list[Any]]:
        """The values of the stored fields ``names`` of samples ``idx``, cropped as the images.

        The crop plan is the images' (``plan_crops``: a pure function of seed, epoch and
        index), so each spatial field is cut, resized and flipped as its image was.
        """
        found = (reader or self.reader).read_fields(idx, names)
        crop = self.crop
        if crop is None:
            return found
        moved = spatial(self.meta, names)
        if moved:
            shapes = self.meta.shapes[idx]
            plans = plan_crops(
                crop, shapes[:, 0], shapes[:, 1], seed=self.seed, epoch=self.epoch, indices=idx
            )
            for stored in moved:
                found[stored.name] = [
                    stored.transform(value, box, flip, crop.size)
                    for value, (box, flip) in zip(found[stored.name], plans, strict=True)
                ]
        return found

    def batch_shape(self) -> tuple[int, int, int] | None:
        """(H, W, C) of every image ``read_batch_into`` delivers, or None if it delivers none.

        The crop's size, or the pack's one stored shape; None with a transform, PIL output,
        or images of several sizes and no crop.
        """
        if self.transform is not None or self.output == "pil":
            return None
        if self.crop is not None:
            return (*self.crop.size, self.meta.channels)
        return self.meta.fixed_shape

    def read_batch_into(self, indices: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (B, H, W, C) with the images ``__getitems__`` would batch for ``indices``.

        Raises:
            OptionsError: this dataset delivers no batch of one shape (``batch_shape``).
        """
        shape = self.batch_shape()
        if shape is None or tuple(out.shape[1:]) != shape:
            raise OptionsError(
                f"{self.path} delivers images of shape {shape}, not a batch of {out.shape[1:]}"
            )
        reader = self.reader
        self._follow_plan(reader)
        if self.crop is not None:
            if self._fixed is None:
                self._fixed = FixedSizeReader(reader, self.crop, self.cache)
            self._fixed.read_into(indices, out, seed=self.seed, epoch=self.epoch)
        else:
            reader.read_into(indices, out)

    def _follow_plan(self, reader: PackReader | PackSetReader) -> None:
        """Tell a remote reader this worker's plan once per epoch (NOTE [ Planned read-ahead ])."""
        if self.planner is None or not reader.plans_reads:
            return
        plan = self._worker_plan()
        if plan is not None:
            reader.plan_reads(plan)

    def _worker_plan(self) -> ReadPlan | None:
        """This worker's read plan of the epoch the first time it is asked for, else None.

        ``planner`` must be set. A mix asks for it once and gives each source its part.
        """
        assert self.planner is not None
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self._planned == (self.epoch, worker):
            return None
        self._planned = (self.epoch, worker)
        return read_plan(self.planner, epoch=self.epoch, worker=worker, num_workers=workers)

    def _cropped(
        self,
        idx: np.ndarray,
        labels: list[Any],
        label_tensor: torch.Tensor | None,
        paths: list[str] | None,
        start: int,
    ) -> SampleBatch:
        """The samples ``idx`` through the training image pipeline, as one batch when possible.

        ``start``: when ``__getitems__`` began (``stage_times()``'s clock): what is not the
        pipeline's own stages is timed as "collation" (see the note "Stall report").
        """
        assert self.crop is not None  # the caller checked
        reader = self.reader
        if self._fixed is None:
            self._fixed = FixedSizeReader(reader, self.crop, self.cache)
        height, width = self.crop.size
        whole = self.transform is None and self.output != "pil"
        buffer = (
            batch_buffer(self.ring, (idx.size, height, width, self.meta.channels))
            if whole
            else None
        )
        out = (
            buffer.numpy()
            if buffer is not None
            else np.empty((idx.size, height, width, self.meta.channels), dtype=np.uint8)
        )
        times = stage_times()
        reading = times.clock()
        self._fixed.read_into(idx, out, seed=self.seed, epoch=self.epoch)
        working = times.clock() - reading
        if buffer is not None:
            images: Any = buffer.permute(0, 3, 1, 2) if self.output == "tensor" else out
            times.add("collation", times.clock() - start - working)
            return SampleBatch(images=images, labels=label_tensor, label_values=labels, paths=paths)
        samples = []
        for j in range(idx.size):
            image = self._convert(out[j])
            if self.transform is not None:  # in this thread: user transforms may share state
                image = self.transform(image)
            samples.append(self._tuple(image, labels[j], paths, j))
        return SampleBatch(samples, paths=paths)

    def _convert(self, hwc: np.ndarray) -> Any:
        if self.output == "hwc":
            return hwc
        if self.output == "pil":
            return Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc)
        return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))

    def _tuple(self, image: Any, label: Any, paths: list[str] | None, j: int) -> tuple[Any, ...]:
        return (image, label) if paths is None else (image, label, paths[j])


class EpochPlanner:
    """A rank's batches of an epoch, ``plan_epoch(order, spec, epoch=...)``, as one callable.

    What ``H5ImageDataset.planner`` holds for ``H5IterableDataset`` (picklable, unlike a
    closure).
    """

    def __init__(self, order: Any, spec: EpochSpec) -> None:
        self.order = order
        self.spec = spec

    def __call__(self, epoch: int) -> list[np.ndarray]:
        """Return the rank's batches of ``epoch``."""
        return plan_epoch(self.order, self.spec, epoch=epoch)


# NOTE [ Resuming a stream ]
#
# A DataLoader over an iterable dataset hands out its workers' batches in turn: batch b of
# the DataLoader is the b-th of worker b mod W, and the plan gives worker w the batches
# w, w + W, ... of the rank's epoch, each of ``batch_size`` samples but the epoch's last
# (``plan_epoch``). So what the training loop has taken is always the first ``position``
# samples of the plan's batches laid end to end, whatever the workers prefetched: the
# state of a ``ChunkSampler`` (unit "samples"), which this class keeps with its own spec and
# order (``ChunkSampler.of_order``). Resumed with the same ranks and workers, the rest of
# that sequence is cut again into batches from ``position`` and dealt to the workers in
# turn, so the DataLoader yields exactly the samples an uninterrupted run would have; with
# others, the samples not taken are re-planned (``training.elastic``, each position once).
# A resumed worker reads other chunks than planned (some twice), never other samples.
#
# The main process cannot see what its workers yielded, so with workers ``state_dict``
# needs ``position`` (batches taken x batch size); in-process it counts its own yields.
# The DataLoader pickles or forks the dataset when its workers start, so a state loaded
# before reaches them; it applies to every iteration of its epoch until ``set_epoch``
# selects another (a shared flag, which persistent workers see too).


class H5IterableDataset(IterableDataset[tuple[Any, ...]]):
    """Iterable-style dataset over a pack: the chunk-aware epoch as a stream of samples.

    Inside ``__iter__`` the chunks are split across ranks and DataLoader workers (no
    ``worker_init_fn`` needed) exactly as ``ChunkBatchSampler`` splits them, windows of
    chunks are shuffled, and every sample comes once per epoch (padding and dropping across
    ranks as described in the sampler's note "Chunk-aware epoch order"). ``set_epoch``
    reaches workers that are already running (persistent workers): the epoch lives in
    shared memory. ``state_dict`` / ``load_state_dict`` resume mid-epoch exactly, also on
    another number of ranks or workers (NOTE [ Resuming a stream ]).

    Args:
        dataset: A pack path, a pack set (directory or manifest), a list of packs, or an
            ``H5ImageDataset`` (with its transform, output...); with ``spec.weights``, a list
            of sources to mix (an ``H5MixDataset``).
        spec: How epochs are cut: ``batch_size`` should be the DataLoader's, so that each
            worker's stream divides into whole batches and only the last batch of an epoch
            is short; ``num_workers`` is taken from the DataLoader at iteration.
    """

    def __init__(self, dataset: PackSource | H5ImageDataset, spec: EpochSpec) -> None:
        if not isinstance(dataset, H5ImageDataset):
            dataset = H5ImageDataset(dataset, weights=spec.weights)
        self.dataset = dataset
        num_replicas, rank = distributed_defaults(spec.num_replicas, spec.rank)
        self.spec = replace(spec, num_replicas=num_replicas, rank=rank)
        self._epoch = SharedEpoch()
        self._windowed: H5ImageDataset | None = None  # the dataset configured for the window
        self._order: Order | None = None
        # NOTE [ Resuming a stream ]: the state loaded last and its number (shared: 0 once
        # set_epoch has moved on), the DataLoader workers of the last iteration (shared),
        # the samples this process's own iteration has yielded
        self._state: dict[str, Any] | None = None
        self._state_number = 0
        self._live_state = SharedEpoch()
        self._workers = SharedEpoch()
        self._yielded = 0

    @property
    def epoch(self) -> int:
        """The epoch of the next iteration."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (seen by running workers too).

        A state loaded for another epoch no longer applies (NOTE [ Resuming a stream ]).
        """
        if self._state is not None and int(epoch) != int(self._state["epoch"]):
            self._live_state.value = 0
        self._epoch.value = epoch

    @property
    def order(self) -> Order:
        """The epoch order (a weighted mix for an ``H5MixDataset``)."""
        if self._order is None:
            _, _, _, mix = resolve_data(self.dataset)
            self._order = order_for(self.dataset.chunk_map, self.spec, mix)
        return self._order

    def __len__(self) -> int:
        sampler = self._sampler(self._workers.value)
        if sampler.resume_position or sampler.batches.pool_samples != self.order.num_samples:
            return sum(len(b) for b in sampler.batches.plan()) - sampler.resume_position
        return samples_per_rank(self.order.num_samples, self.spec)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (0, 0)
        if worker == 0:
            self._workers.value = workers
        sampler = self._sampler(workers)
        spec = sampler.batches.spec
        batches = self._rest(sampler)
        dataset = self._dataset_for(spec.window_chunks)
        dataset.set_epoch(self.epoch)  # its random crops and flips follow this epoch
        dataset.planner = EpochPlanner(self.order, spec)  # a remote reader reads ahead by it
        self._yielded = 0
        for batch in batches[worker :: max(1, workers)]:
            samples = dataset.__getitems__(batch.tolist())
            if samples.images is not None and dataset.output == "tensor":
                # detach the samples from the batch buffer: each is collated on its own
                for sample in samples:
                    self._yielded += 1
                    yield (sample[0].contiguous(), *sample[1:])
            else:
                for sample in samples:
                    self._yielded += 1
                    yield sample

    def state_dict(self, *, position: int | None = None) -> dict[str, Any]:
        """Return the resumable state: the epoch, the samples taken, the settings they assume.

        Args:
            position: Samples of this epoch the training loop has taken since it began
                iterating it (the DataLoader's batches taken x its batch size; after a
                resume, those taken since). Default: the samples this process's own
                iteration has yielded, which is exact without DataLoader workers.

        Raises:
            OptionsError: no ``position`` after an iteration by DataLoader workers (this
                process cannot know what the training loop has taken from them).
        """
        workers = self._workers.value
        if position is None:
            if workers:
                raise OptionsError(
                    "the dataset was iterated by DataLoader workers: give position=, the "
                    "samples of this epoch the training loop has taken (batches x batch_size)"
                )
            position = self._yielded
        sampler = self._sampler(workers)
        return sampler.state_dict(position=sampler.resume_position + int(position))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: iterations of the saved epoch yield the rest of it, for any workers.

        A state of ``state_dict`` (of this class, or a ``ChunkSampler``'s): the same ranks
        and workers continue the saved order where it stopped; others re-plan the samples
        not yet taken (``training.elastic``), each once. The state holds for the saved epoch
        until ``set_epoch`` selects another; load it before the DataLoader starts its
        workers (persistent workers keep the state they started with).

        Raises:
            OptionsError: the state was saved on other data, or with another order (shuffle,
                seed, weights), or is not a state in samples.
        """
        if state.get("unit") != "samples":
            raise OptionsError(
                "a stream's state counts samples (H5IterableDataset.state_dict), but got "
                f"unit={state.get('unit')!r}"
            )
        self._sampler(0).load_state_dict(state)  # refused here, not in the workers
        self._state_number += 1
        self._state = dict(state)
        self._live_state.value = self._state_number
        self._epoch.value = int(state["epoch"])

    def _sampler(self, workers: int) -> ChunkSampler:
        """The epoch's order for ``workers`` DataLoader workers, at the loaded state if live."""
        spec = replace(self.spec, num_workers=workers).resolved(self.dataset.group_bytes)
        sampler = ChunkSampler.of_order(
            self.dataset.chunk_map, spec, self.order, meta=self.dataset.meta
        )
        sampler.set_epoch(self.epoch)
        state = self._state
        if (
            state is not None
            and self._live_state.value == self._state_number
            and int(state["epoch"]) == self.epoch
        ):
            sampler.load_state_dict(state)
        return sampler

    @staticmethod
    def _rest(sampler: ChunkSampler) -> list[np.ndarray]:
        """The batches still to serve: the epoch's, or from the resumed sample on."""
        batches = sampler.batches.plan()
        start = sampler.resume_position
        if not start:
            return batches
        rest = np.concatenate(batches)[start:] if batches else np.zeros(0, dtype=np.int64)
        size = sampler.batches.spec.batch_size
        return [rest[i : i + size] for i in range(0, rest.size, size)]

    def _dataset_for(self, window_chunks: int | None) -> H5ImageDataset:
        """Return the dataset reading with the sampler's window (its own, when it has one)."""
        if self.dataset.options.window_chunks is not None:
            return self.dataset
        if self._windowed is None or self._windowed.options.window_chunks != window_chunks:
            options = replace(self.dataset.options, window_chunks=window_chunks)
            self._windowed = self.dataset.configured(options)
        return self._windowed
