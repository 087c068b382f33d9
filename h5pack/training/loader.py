"""``make_loader``: a DataLoader over a pack with the settings users get wrong, and seeding."""

from __future__ import annotations

import os
import random
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader
from typing_extensions import Unpack

from h5pack.core.arguments import check_bool, check_optional_int
from h5pack.core.machine import available_cores
from h5pack.core.vocabulary import COLLATES as COLLATES  # re-exported
from h5pack.errors import H5PackError, OptionsError
from h5pack.read.crop import CropSpec
from h5pack.read.mixture import ClassJoin, check_batchable
from h5pack.read.packset import PackSource
from h5pack.read.reader import ReaderOptions
from h5pack.training.advice import dataset_facts
from h5pack.training.batch import ContiguousCollate, collate_list, collate_padded
from h5pack.training.batch import collate_batch as collate_batch  # re-exported
from h5pack.training.cache import CacheSpec, DecodedCache
from h5pack.training.dataset import H5ImageDataset, Output, check_source
from h5pack.training.mixed import H5MixDataset, unmixed_sources
from h5pack.training.mixing import MixingWarning
from h5pack.training.options import KEYWORDS, SpecKeywords, loader_spec
from h5pack.training.prefetch import StallReports
from h5pack.training.ring import BatchRing, RingCollate
from h5pack.training.sampler import ChunkBatchSampler, EpochSpec, sampler_for_labels
from h5pack.training.stats import StallMonitor, TimedCollate

RING_SPARE_SLOTS = 3  # ring buffers per worker beyond its prefetched batches

# NOTE [ Loader defaults ]
#
# Why each default of ``make_loader`` (docs/ARCHITECTURE.md "Loader defaults"; measured in
# docs/decisions/0014, 0015):
# - ``ChunkBatchSampler`` told the real ``num_workers``: each worker reads its own windows.
# - ``num_workers="auto"``: a raw pack read as stored, without a transform, is read in the
#   main process by one thread per core; per-sample work gets one worker per core.
# - ``pin_memory`` on with CUDA; ``persistent_workers`` on with workers; ``prefetch_factor`` 2.
# - a ``torch.Generator`` seeded with ``seed``; ``seed_worker`` seeds ``random`` and numpy
#   from torch's per-worker seed, so augmentations differ across workers, repeat across runs.


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed ``random``, numpy's global RNG and torch (CPU and CUDA) with ``seed``.

    ``deterministic``: also make cuDNN deterministic (no autotuner) and ask torch for
    deterministic algorithms (``warn_only``): slower, reproduces a run bit for bit.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002  (seeding the global RNG is this helper's job)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def seed_worker(worker_id: int) -> None:
    """Seed ``random`` and numpy in a DataLoader worker from torch's per-worker seed."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002  (user augmentations use the global RNG)


def _check_batchable(dataset: H5ImageDataset) -> None:
    """Refuse a pack of several image sizes that neither a crop nor a transform makes one."""
    if isinstance(dataset, H5MixDataset):
        if dataset.transform is None and dataset.output != "pil":
            check_batchable(dataset.mix, one_size=dataset.crop is not None)
        return
    if dataset.crop is not None or dataset.transform is not None or dataset.output == "pil":
        return
    shapes = dataset.meta.shapes
    if len(shapes) < 2 or bool(np.all(shapes == shapes[0])):
        return
    distinct = np.unique(shapes[:, :2], axis=0)
    examples = ", ".join(f"{w}x{h}" for h, w in distinct[:3].tolist())
    raise OptionsError(
        f"{dataset.path} holds images of {len(distinct)} sizes (W x H: {examples}, ...), "
        "which cannot be stacked into one batch: pass size= (e.g. size=224, with "
        "crop='random-resized' or 'center') to cut every image to one size, collate='list' "
        "to get them as they are, or convert with --size N (or H,W) to store one size"
    )


def auto_workers(
    dataset: H5ImageDataset, num_workers: int | Literal["auto"] = "auto", cores: int | None = None
) -> tuple[int, int]:
    """Return ``(num_workers, threads)`` over ``dataset`` (NOTE [ Loader defaults ])."""
    cores = cores or available_cores()
    if num_workers == "auto":
        if dataset.meta.mode == "raw" and dataset.transform is None and dataset.crop is None:
            return 0, cores
        return cores, 0
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise OptionsError(f"num_workers should be 'auto' or >= 0, but got {num_workers!r}")
    return num_workers, cores if num_workers == 0 else 0


# torch re-raises a worker's exception as ``type(err)(text)``, text "Caught X in DataLoader
# worker process N." and the traceback, h5pack's message last: it is raised again whole.
_WORKER_CAUGHT = re.compile(r"\ACaught \w+ in (?P<where>DataLoader worker process \d+)\.")


@contextmanager
def worker_errors_unwrapped() -> Iterator[None]:
    """Re-raise an ``H5PackError`` that torch wrapped in a worker's traceback as the original."""
    try:
        yield
    except H5PackError as err:
        text = str(err)
        caught = _WORKER_CAUGHT.match(text)
        marker = f"{type(err).__module__}.{type(err).__qualname__}: "
        if caught is None or marker not in text:
            raise
        original = text[text.rindex(marker) + len(marker) :].strip()
        unwrapped = type(err)(original)
        if hasattr(unwrapped, "add_note"):  # Python 3.11+
            unwrapped.add_note(
                f"(raised in {caught['where']}; num_workers=0 raises it where it happens)"
            )
        raise unwrapped from None


class H5Loader(DataLoader[Any], StallReports):
    """A DataLoader whose ``set_epoch`` reaches its sampler, that resumes mid-epoch.

    ``state_dict()`` records the batches delivered to the training loop (not those the
    workers prefetched).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delivered = 0
        threads = getattr(getattr(self.dataset, "options", None), "threads", 0) or 1
        self.stall = StallMonitor(parallel=max(1, self.num_workers or int(threads)))
        if isinstance(self.dataset, H5ImageDataset):
            dataset, workers = self.dataset, self.num_workers
            self.stall.facts = lambda: dataset_facts(dataset, workers=workers)

    @property
    def chunk_sampler(self) -> ChunkBatchSampler:
        """The loader's ``ChunkBatchSampler``."""
        sampler = self.batch_sampler
        if not isinstance(sampler, ChunkBatchSampler):
            raise OptionsError("this loader has no ChunkBatchSampler")
        return sampler

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (sampler and iterable dataset alike)."""
        if isinstance(self.batch_sampler, ChunkBatchSampler):
            self.batch_sampler.set_epoch(epoch)
        set_dataset_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_dataset_epoch):
            set_dataset_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # counts delivered batches
        sampler = self.batch_sampler
        start = sampler.resume_position if isinstance(sampler, ChunkBatchSampler) else 0
        if isinstance(sampler, ChunkBatchSampler) and isinstance(self.dataset, H5ImageDataset):
            # random crops and flips follow the sampler's epoch, also after load_state_dict
            self.dataset.set_epoch(sampler.epoch)
        self._delivered = start
        with worker_errors_unwrapped():
            for batch in self.stall.timed(super().__iter__()):
                self._delivered += 1
                yield batch

    def state_dict(self) -> dict[str, Any]:
        """Return the sampler's state with the batches delivered so far this epoch."""
        return self.chunk_sampler.state_dict(position=self._delivered)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``: the next iteration delivers the rest of the epoch."""
        self.chunk_sampler.load_state_dict(state)
        self._delivered = self.chunk_sampler.resume_position

    @property
    def cache(self) -> DecodedCache | None:
        """The decoded cache shared by this loader's processes, if it has one."""
        return getattr(self.dataset, "cache", None)

    def close(self) -> None:
        """Release the decoded cache's shared memory; the loader is not iterated afterwards."""
        cache = self.cache
        if cache is not None:
            cache.close()
        for each in getattr(self.dataset, "caches", []):
            each.close()

    def __enter__(self) -> H5Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def make_loader(
    path_or_dataset: PackSource | Sequence[PackSource] | H5ImageDataset,
    batch_size: int | EpochSpec | None = None,
    *,
    epoch: EpochSpec | None = None,
    reader: ReaderOptions | None = None,
    pipeline: CropSpec | None = None,
    cache: CacheSpec | Literal["decoded"] | None = None,
    num_workers: int | Literal["auto"] = "auto",
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    multiprocessing_context: Any = None,
    collate: Literal["stack", "list"] = "stack",
    collate_fn: Callable[[Any], Any] | None = None,
    memory_format: torch.memory_format = torch.channels_last,
    transform: Callable[[Any], Any] | None = None,
    target_transform: Callable[[int], Any] | None = None,
    output: Output | None = None,
    return_path: bool | None = None,
    classes: ClassJoin | None = None,
    return_source: bool | None = None,
    fields: Sequence[str] | None = None,
    **keywords: Unpack[SpecKeywords],
) -> H5Loader:
    """Return a DataLoader over a pack or a pack set: chunk-aware sampling, workers, seeding.

    ``path_or_dataset``: a pack path or URL, a pack set, a list of packs (one pool), a list
    of sources with ``weights`` (a mix, docs/mixing.md), or an ``H5ImageDataset`` (never
    changed: the loader reads with a configured copy). Settings are four option objects,
    each checked once (``training.options``): ``epoch`` (``EpochSpec``, which
    ``batch_size`` may be), ``reader`` (``ReaderOptions``), ``pipeline`` (``CropSpec``) and
    ``cache`` (``"decoded"`` or a ``CacheSpec``: decoded images shared by every worker); the
    keywords (``SpecKeywords``: ``shuffle``, ``seed``, ``size``, the reader's settings of a
    remote pack...) replace their fields (a keyword of an older release
    raises ``OptionsError`` naming its new home). ``transform``, ``target_transform``,
    ``output``, ``return_path`` and ``fields`` are ``H5ImageDataset``'s, ``classes`` and
    ``return_source`` a mix's. ``num_workers``, ``pin_memory``, ``persistent_workers``,
    ``prefetch_factor``: NOTE [ Loader defaults ]. ``collate``: ``"stack"`` (B, C, H, W)
    tensors, ``"list"`` tensors of their own sizes, ``"padded"`` variable-length fields
    zero-padded beside ``NAME_lengths``; ``collate_fn`` replaces it. ``memory_format``:
    ``torch.channels_last`` (views of the stored pixels, no copy) or
    ``torch.contiguous_format`` (each batch copied contiguous in the worker).

    Raises:
        FileNotFoundError: the pack, a shard or the manifest does not exist.
        FormatError: not a pack, or a shard missing, changed or unlike the others (named).
        OptionsError: a bad argument, dataset options next to a dataset, or a pack of mixed
            sizes read without ``size`` (its message names ``size=`` and ``--size``).
    """
    spec = loader_spec(
        batch_size, epoch=epoch, reader=reader, pipeline=pipeline, cache=cache, **keywords
    )
    if collate not in COLLATES:
        raise OptionsError(f"collate should be one of {COLLATES}, but got collate={collate!r}")
    check_optional_int("prefetch_factor", prefetch_factor, minimum=1)
    check_bool("pin_memory", pin_memory, optional=True)
    check_bool("persistent_workers", persistent_workers, optional=True)
    seed, weights = spec.epoch.seed, spec.epoch.weights
    mix_options = {"classes": classes, "return_source": return_source}
    if weights is None and any(v is not None for v in mix_options.values()):
        raise OptionsError("classes= and return_source= apply to a mix: give weights= too")
    own: dict[str, Any] = {
        "transform": transform,
        "target_transform": target_transform,
        "output": output,
        "return_path": return_path,
        "fields": fields,
    }
    if isinstance(path_or_dataset, H5ImageDataset):
        opening = KEYWORDS["reader"] | KEYWORDS["pipeline"]
        objects = {"reader": reader, "pipeline": pipeline, "cache": cache}
        given = sorted(
            [name for name, value in {**own, **mix_options, **objects}.items() if value is not None]
            + [name for name in keywords if name in opening]
        )
        if given:
            raise OptionsError(
                f"dataset options {given} apply only when make_loader opens the "
                "pack; set them on the H5ImageDataset instead"
            )
        dataset = path_or_dataset
    else:
        common = {
            **own,
            "output": output or "tensor",
            "return_path": bool(return_path),
            "reader": spec.reader,
            "pipeline": spec.pipeline,
            "cache": spec.cache,
            "seed": seed,
        }
        if weights is not None:
            if isinstance(path_or_dataset, str | os.PathLike):
                raise OptionsError(
                    "weights= mixes several sources: give a list of sources (packs, pack "
                    f"sets, lists of packs), but got one: {os.fspath(path_or_dataset)!r}"
                )
            if not isinstance(path_or_dataset, list | tuple):
                check_source("path_or_dataset", path_or_dataset)  # raises, naming it
            sources = [
                check_source(f"path_or_dataset[{i}]", each)
                for i, each in enumerate(path_or_dataset)
            ]
            dataset = H5MixDataset(
                sources,
                weights=weights,
                classes=classes,
                return_source=bool(return_source),
                **common,
            )
        else:
            # without weights a list is one pool of packs (a list of lists is refused there)
            dataset = H5ImageDataset(check_source("path_or_dataset", path_or_dataset), **common)
    if collate != "list":
        _check_batchable(dataset)
    num_workers, auto_threads = auto_workers(dataset, num_workers)
    sampler, mixing = sampler_for_labels(
        dataset, replace(spec.epoch, num_workers=num_workers), dataset.meta
    )
    if mixing is not None and mixing.warns:
        warnings.warn(mixing.message, MixingWarning, stacklevel=2)
    if isinstance(dataset, H5MixDataset) and spec.epoch.shuffle:
        for message in unmixed_sources(dataset, sampler.window_chunks):
            warnings.warn(message, MixingWarning, stacklevel=2)
    options = dataset.options
    if options.window_chunks is None and options.chunk_cache_bytes is None:
        options = replace(options, window_chunks=sampler.window_chunks)
    if options.threads is None:
        options = replace(options, threads=auto_threads)
    workers_kwargs: dict[str, Any] = {}
    if num_workers > 0:
        workers_kwargs = {
            "persistent_workers": True if persistent_workers is None else persistent_workers,
            "prefetch_factor": 2 if prefetch_factor is None else prefetch_factor,
            "worker_init_fn": seed_worker,
            "multiprocessing_context": multiprocessing_context,
        }
    if collate_fn is None:
        collate_fn = {"list": collate_list, "padded": collate_padded}.get(collate, collate_batch)
    if memory_format == torch.contiguous_format:
        collate_fn = ContiguousCollate(collate_fn)
    elif memory_format != torch.channels_last:
        raise OptionsError(
            "memory_format should be torch.channels_last (the default, no copy) or "
            f"torch.contiguous_format, but got memory_format={memory_format!r}"
        )
    configured = dataset.configured(options, seed=seed)
    configured.planner = sampler.plan  # a remote reader fetches ahead by the plan
    timed: Callable[[Any], Any] = TimedCollate(collate_fn)  # stage times travel with batches
    if num_workers > 0:  # batches cross in reused buffers (NOTE [ Batch ring ])
        slots = workers_kwargs["prefetch_factor"] + RING_SPARE_SLOTS
        # a batch of fields may take two slots: its images and its instance masks
        configured.ring = BatchRing(num_workers, slots * (1 if dataset.fields is None else 2))
        timed = RingCollate(timed, configured.ring)
    return H5Loader(
        configured,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=timed,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        generator=torch.Generator().manual_seed(seed),
        **workers_kwargs,
    )
