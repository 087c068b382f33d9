"""``H5IterableDataset``: the chunk-aware epoch of a pack (or a mix) as a stream of samples."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from h5pack.errors import OptionsError
from h5pack.read.packset import PackSource
from h5pack.training.batch import SharedEpoch
from h5pack.training.mapstyle import H5ImageDataset
from h5pack.training.mixed import H5MixDataset  # noqa: F401  # what weights= builds
from h5pack.training.orders import Order
from h5pack.training.sampler import (
    ChunkSampler,
    EpochSpec,
    distributed_defaults,
    order_for,
    plan_epoch,
    resolve_data,
    samples_per_rank,
)


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
