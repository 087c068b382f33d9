"""The datasets: map-style ``H5ImageDataset`` (``training.mapstyle``) and ``H5IterableDataset``.

Importing this module also imports ``training.mixed``, which ``weights=`` builds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from h5pack.core.vocabulary import OUTPUTS as OUTPUTS  # re-exported
from h5pack.core.vocabulary import Output as Output  # re-exported
from h5pack.errors import OptionsError
from h5pack.read.packset import PackSource
from h5pack.training.batch import SampleBatch as SampleBatch  # re-exported
from h5pack.training.batch import SharedEpoch
from h5pack.training.batch import check_source as check_source  # re-exported
from h5pack.training.epochs import distributed_defaults, plan_epoch, samples_per_rank
from h5pack.training.mapstyle import H5ImageDataset as H5ImageDataset  # re-exported
from h5pack.training.mixed import H5MixDataset as H5MixDataset  # what weights= builds
from h5pack.training.sampler import ChunkSampler, EpochSpec

# NOTE [ Resuming a stream ]
#
# The DataLoader hands out its workers' batches in turn, and the plan gives worker w the
# batches w, w + W, ... of the rank's epoch (``plan_epoch``); so what the training loop has
# taken is always the first ``position`` samples of the plan's batches laid end to end: a
# ``ChunkSampler`` state (unit "samples"), kept with this dataset's own spec and order.
# Resumed with the same ranks and workers, the rest is cut again into batches from
# ``position`` and dealt to the workers in turn; with others, the samples not taken are
# re-planned (``training.elastic``). The main process cannot see what its workers yielded,
# so with workers ``state_dict`` needs ``position``. A state loaded before the workers start
# reaches them, and holds for its epoch until ``set_epoch`` selects another (shared flag).


class H5IterableDataset(IterableDataset[tuple[Any, ...]]):
    """Iterable-style dataset over a pack: the chunk-aware epoch as a stream of samples.

    Chunks are split across ranks and DataLoader workers inside ``__iter__`` exactly as
    ``ChunkBatchSampler`` splits them; ``set_epoch`` reaches running workers (shared
    memory); ``state_dict`` / ``load_state_dict`` resume mid-epoch, also on other ranks or
    workers (NOTE [ Resuming a stream ]).

    Args:
        dataset: A pack path, a pack set, a list of packs, or an ``H5ImageDataset``; with
            ``spec.weights``, a list of sources to mix.
        spec: How epochs are cut; ``batch_size`` should be the DataLoader's.
    """

    def __init__(self, dataset: PackSource | H5ImageDataset, spec: EpochSpec) -> None:
        if not isinstance(dataset, H5ImageDataset):
            dataset = H5ImageDataset(dataset, weights=spec.weights)
        self.dataset = dataset
        num_replicas, rank = distributed_defaults(spec.num_replicas, spec.rank)
        self.spec = replace(spec, num_replicas=num_replicas, rank=rank)
        self._epoch = SharedEpoch()
        self._windowed: H5ImageDataset | None = None  # the dataset configured for the window
        # the state loaded last and its number (shared: 0 once set_epoch has moved on), the
        # DataLoader workers of the last iteration (shared), this process's yielded samples
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
        """Select the epoch of the next iteration (a state loaded for another one lapses)."""
        if self._state is not None and int(epoch) != int(self._state["epoch"]):
            self._live_state.value = 0
        self._epoch.value = epoch

    def __len__(self) -> int:
        sampler = self._sampler(self._workers.value)
        if sampler.resume_position or sampler.pool_samples != sampler.order.num_samples:
            return sum(len(b) for b in sampler.plan()) - sampler.resume_position
        return samples_per_rank(sampler.order.num_samples, self.spec)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (0, 0)
        if worker == 0:
            self._workers.value = workers
        sampler = self._sampler(workers)
        batches = self._rest(sampler)
        dataset = self._dataset_for(sampler.spec.window_chunks)
        dataset.set_epoch(self.epoch)  # its random crops and flips follow this epoch
        dataset.planner = partial(plan_epoch, sampler.order, sampler.spec)  # remote read-ahead
        self._yielded = 0
        detach = dataset.output == "tensor"
        for batch in batches[worker :: max(1, workers)]:
            samples = dataset.__getitems__(batch.tolist())
            detach_these = detach and samples.images is not None  # views of a batch buffer
            for sample in samples:
                self._yielded += 1
                yield (sample[0].contiguous(), *sample[1:]) if detach_these else sample

    def state_dict(self, *, position: int | None = None) -> dict[str, Any]:
        """Return the resumable state: the epoch, the samples taken, the settings they assume.

        ``position``: the samples the training loop has taken this epoch (batches x batch
        size), needed after an iteration by DataLoader workers; default: this process's own.
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

        Load it before the DataLoader starts its workers (persistent workers keep theirs).
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
        sampler = ChunkSampler(self.dataset, spec)
        sampler.set_epoch(self.epoch)
        state = self._state
        live = state is not None and self._live_state.value == self._state_number
        if live and state is not None and int(state["epoch"]) == self.epoch:
            sampler.load_state_dict(state)
        return sampler

    @staticmethod
    def _rest(sampler: ChunkSampler) -> list[np.ndarray]:
        """The batches still to serve: the epoch's, or from the resumed sample on."""
        batches, start = sampler.plan(), sampler.resume_position
        if not start:
            return batches
        rest = np.concatenate(batches)[start:] if batches else np.zeros(0, dtype=np.int64)
        size = sampler.spec.batch_size
        return [rest[i : i + size] for i in range(0, rest.size, size)]

    def _dataset_for(self, window_chunks: int | None) -> H5ImageDataset:
        """The dataset reading with the sampler's window (its own, when it has one)."""
        if self.dataset.options.window_chunks is not None:
            return self.dataset
        if self._windowed is None or self._windowed.options.window_chunks != window_chunks:
            options = replace(self.dataset.options, window_chunks=window_chunks)
            self._windowed = self.dataset.configured(options)
        return self._windowed
