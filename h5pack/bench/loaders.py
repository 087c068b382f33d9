"""The loaders the benchmarks time: every access pattern through one dataset and loader.

# NOTE [ One loader for every pattern ]
#
# Patterns compare fairly only when they differ in their order alone: each is one
# ``H5ImageDataset`` (with the training read) through ``make_loader``'s settings, ``random``
# with ``FullShuffleBatchSampler``, ``chunk`` with ``ChunkBatchSampler``, ``sequential`` in
# pack order.
#
# NOTE [ Fresh epochs ]
#
# A small pack would sit whole in the windows of decompressed chunks after one epoch, so
# each timed epoch over a *compressed* pack starts from a new loader over a closed dataset;
# an uncompressed pack is read by one loader with persistent workers, as training reads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import numpy as np

from h5pack.bench.access import Pattern, random_order
from h5pack.bench.reading import TrainingRead
from h5pack.bench.timing import Count
from h5pack.read.options import ReaderOptions
from h5pack.read.packset import PackSource


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return int(value.numel() * value.element_size())


def count_batch(batch: Any) -> Count:
    """Return the images in a collated batch and their bytes."""
    images = batch[0]
    if isinstance(images, list):
        return Count(len(images), sum(_nbytes(image) for image in images))
    return Count(int(images.shape[0]), _nbytes(images))


def run_epoch(
    loader: Iterable[Any], *, max_batches: int | None = None, budget_s: float | None = None
) -> Count:
    """Iterate ``loader`` once (at most ``max_batches``, or ``budget_s`` seconds) and count."""
    images = nbytes = 0
    started = time.perf_counter()
    for number, batch in enumerate(loader):
        counted = count_batch(batch)
        images, nbytes = images + counted.images, nbytes + counted.nbytes
        if max_batches is not None and number + 1 >= max_batches:
            break
        if budget_s is not None and time.perf_counter() - started > budget_s:
            break
    return Count(images, nbytes)


class FullShuffleBatchSampler:
    """A full shuffle of every sample each epoch in batches, a pure function of (seed, epoch)."""

    def __init__(self, num_samples: int, batch_size: int, *, seed: int = 0) -> None:
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration."""
        self.epoch = int(epoch)

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """Return the batches of ``epoch`` (default: the current one)."""
        order = random_order(
            self.num_samples, seed=self.seed, epoch=self.epoch if epoch is None else epoch
        )
        return [order[i : i + self.batch_size] for i in range(0, order.size, self.batch_size)]

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        yield from (batch.tolist() for batch in self.plan())


def open_dataset(
    path: PackSource,
    train: TrainingRead,
    *,
    seed: int = 0,
    cache: Literal["decoded"] | None = None,
    cache_bytes: int | None = None,
    reader: ReaderOptions | None = None,
) -> Any:
    """Return the ``H5ImageDataset`` every pattern of a measurement reads.

    ``cache="decoded"`` reads an encoded pack at a training size through a decoded cache
    (``make_loader(cache="decoded")``'s) that lives as long as the dataset.
    """
    from h5pack.training.cache import DecodedCache, default_cache_bytes
    from h5pack.training.dataset import H5ImageDataset

    crop = train.crop_spec()
    dataset = H5ImageDataset(path, reader=reader, pipeline=crop, seed=seed)
    if cache is None or crop is None or dataset.meta.mode != "encoded":
        return dataset
    budget = default_cache_bytes() if cache_bytes is None else cache_bytes
    dataset.close()
    decoded = DecodedCache(max(1, dataset.meta.num_samples), budget)
    return H5ImageDataset(path, reader=reader, pipeline=crop, cache=decoded, seed=seed)


class PatternLoader:
    """Epochs of one access pattern over one dataset (see "One loader for every pattern").

    Each call runs the next epoch (at most ``max_batches``, or ``budget_s`` seconds) and
    returns what it delivered; unless ``batchable``, batches are lists of images.
    """

    def __init__(
        self,
        dataset: Any,
        pattern: Pattern,
        *,
        batch_size: int,
        workers: int | Literal["auto"] = "auto",
        seed: int = 0,
        batchable: bool = True,
        max_batches: int | None = None,
        budget_s: float | None = None,
    ) -> None:
        self.dataset, self.pattern, self.batch_size = dataset, pattern, batch_size
        self.requested_workers, self.seed, self.batchable = workers, seed, batchable
        self.max_batches, self.budget_s = max_batches, budget_s
        # see "Fresh epochs"; a decoded cache must outlive the epoch to be of any use
        self.fresh = bool(dataset.compressed) and getattr(dataset, "cache", None) is None
        self.epoch = 0
        self.images_per_epoch = 0
        self._probe = self._make(persistent=False)  # settings and plans; never iterated
        self.workers = int(self._probe.num_workers)
        self.threads = int(self._probe.dataset.options.threads or 0)
        self.window_chunks = int(self._probe.dataset.options.window_chunks or 0)
        self._loader: Any = None

    def _make(self, *, persistent: bool) -> Any:
        import torch
        from torch.utils.data import DataLoader

        from h5pack.training.batch import collate_batch, collate_list
        from h5pack.training.loader import make_loader, seed_worker

        loader = make_loader(
            self.dataset,
            self.batch_size,
            shuffle=self.pattern != "sequential",
            num_workers=self.requested_workers,
            seed=self.seed,
            persistent_workers=persistent,
            collate="stack" if self.batchable else "list",
        )
        if self.pattern != "random":
            return loader
        # the same configured dataset, workers and collation; a full shuffle's batches
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        extra: dict[str, Any] = {}
        if loader.num_workers:
            extra = {
                "persistent_workers": persistent,
                "prefetch_factor": 2,
                "worker_init_fn": seed_worker,
            }
        return DataLoader(
            loader.dataset,
            batch_sampler=FullShuffleBatchSampler(
                len(self.dataset), self.batch_size, seed=self.seed
            ),
            num_workers=loader.num_workers,
            collate_fn=collate_batch if self.batchable else collate_list,
            pin_memory=loader.pin_memory,
            generator=generator,
            **extra,
        )

    def plan(self, epoch: int = 0) -> list[np.ndarray]:
        """Return the batches of ``epoch``, in the order the loader delivers them."""
        if self.pattern == "random":
            sampler = FullShuffleBatchSampler(len(self.dataset), self.batch_size, seed=self.seed)
            return sampler.plan(epoch)
        plan: list[np.ndarray] = self._probe.chunk_sampler.plan(epoch)
        return plan

    def __call__(self) -> Count:
        """Run the next epoch and return what it delivered."""
        if self.fresh:
            loader = self._make(persistent=False)
        else:
            if self._loader is None:
                self._loader = self._make(persistent=True)
            loader = self._loader
        if self.pattern == "random":
            loader.batch_sampler.set_epoch(self.epoch)
            loader.dataset.set_epoch(self.epoch)  # crops and flips follow the epoch
        else:
            loader.set_epoch(self.epoch)
        self.epoch += 1
        try:
            count = run_epoch(loader, max_batches=self.max_batches, budget_s=self.budget_s)
        finally:
            if self.fresh:
                loader.dataset.close()
        self.images_per_epoch = max(self.images_per_epoch, count.images)
        return count

    def close(self) -> None:
        """Stop persistent workers, close the readers of this process and the decoded cache."""
        cache = getattr(self.dataset, "cache", None)
        if cache is not None:
            cache.close()
        if self._loader is not None:
            self._loader.dataset.close()
            self._loader = None  # its iterator, and the workers, go with it
        self._probe.dataset.close()
        self.dataset.close()

    def __enter__(self) -> PatternLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
