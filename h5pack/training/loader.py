"""``make_loader``: a DataLoader over a pack with the settings users get wrong, and seeding."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from h5pack._types import StrPath
from h5pack.core.decode import Backend
from h5pack.core.machine import available_cores
from h5pack.errors import OptionsError
from h5pack.read.reader import ReaderOptions
from h5pack.training.dataset import H5ImageDataset, Output, SampleBatch, empty_uint8
from h5pack.training.sampler import ChunkBatchSampler, EpochSpec

# NOTE [ Loader defaults ]
#
# Each default of ``make_loader`` and the reason for it (docs/ARCHITECTURE.md, "Loader
# defaults", has the measurements):
# - sampler: ``ChunkBatchSampler`` told the real ``num_workers``, so every worker reads its
#   own windows and each chunk is decompressed once per epoch.
# - ``num_workers="auto"``: worker processes pay for every batch crossing a process
#   boundary (on 2 cores, ~6,700 raw 256x256 images/s through workers against ~15,000 read
#   in-process; scripts/bench_loader.py: 2 workers were slower than the main process for
#   every raw pack the direct path reads). A raw pack without a per-sample transform is
#   read in the main process by ``threads`` = cores threads (direct chunk path: ``preadv``
#   and the codecs release the GIL), never slower than reading in-process; only per-sample
#   work (decoding encoded packs, Python transforms) gets worker processes, one per core.
#   lzf and bitshuffle packs, which only h5py reads, may gain from explicit workers on a
#   quiet many-core machine.
# - ``pin_memory``: on when CUDA is available (faster, asynchronous host-to-device copies).
# - ``persistent_workers``: on with workers, so each epoch does not re-fork and re-open.
# - ``prefetch_factor``: 2 batches per worker, PyTorch's default: the window cache already
#   keeps the disk busy and more batches only hold memory.
# - seeding: a ``torch.Generator`` seeded with ``seed`` (reproducible base seeds for
#   workers), and ``worker_init_fn`` seeding ``random`` and ``numpy`` in each worker from
#   torch's per-worker seed (PyTorch seeds only torch itself), so random augmentations
#   differ across workers and repeat across runs.
# - ``collate``: one preallocated (B, C, H, W) uint8 tensor, never ``torch.stack`` of B
#   small tensors; the dataset usually hands over the finished batch.


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed ``random``, numpy's global RNG and torch (CPU and CUDA) with ``seed``.

    Args:
        seed: The seed.
        deterministic: Also make cuDNN deterministic and turn off its autotuner
            (``cudnn.deterministic = True``, ``cudnn.benchmark = False``) and ask torch for
            deterministic algorithms where they exist (``warn_only``: ops without one warn).
            Slower; use it to reproduce a run bit for bit.
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


def collate(batch: Sequence[Any]) -> Any:
    """Collate samples into ``(images, labels[, paths])``, with one preallocated tensor.

    A ``SampleBatch`` whose images are already one batch is returned as it is; equal-shape
    uint8 tensors are copied into one (B, ...) tensor (in shared memory inside a worker);
    anything else goes to ``torch.utils.data.default_collate``.
    """
    if isinstance(batch, SampleBatch) and batch.images is not None and batch.labels is not None:
        images = batch.images
        if isinstance(images, np.ndarray):
            images = torch.from_numpy(images)
        return (
            (images, batch.labels) if batch.paths is None else (images, batch.labels, batch.paths)
        )
    if not batch:
        return default_collate(list(batch))
    first = batch[0][0]
    same = isinstance(first, torch.Tensor) and all(
        isinstance(s[0], torch.Tensor) and s[0].shape == first.shape and s[0].dtype == first.dtype
        for s in batch
    )
    if not same or first.dtype != torch.uint8:
        return default_collate(list(batch))
    images = empty_uint8((len(batch), *first.shape))
    # NOTE [ numpy copies ]: copying through numpy views keeps torch's intra-op thread pool
    # asleep; ``Tensor.copy_`` wakes it for every image, and on a small machine its
    # spinning threads steal the cores that decode the next images (an in-process epoch of
    # an encoded pack ran ~1.2x faster this way on 2 cores).
    target = images.numpy()
    for j, sample in enumerate(batch):
        target[j] = sample[0].numpy()
    rest = [default_collate([s[k] for s in batch]) for k in range(1, len(batch[0]))]
    if len(batch[0]) == 3:  # paths stay a list of str
        rest[1] = [s[2] for s in batch]
    return (images, *rest)


def auto_workers(
    dataset: H5ImageDataset, num_workers: int | Literal["auto"] = "auto", cores: int | None = None
) -> tuple[int, int]:
    """Return ``(num_workers, threads)`` for a loader over ``dataset`` (see "Loader defaults").

    ``"auto"``: a raw pack without a per-sample transform is read in the main process,
    ``cores`` threads decompressing (direct chunk path) or copying; worker processes, one per
    core, only for per-sample work that holds the GIL: decoding an encoded pack, a
    transform. An explicit ``num_workers`` gets ``cores`` threads when it is 0, else none.

    Raises:
        OptionsError: ``num_workers`` is neither ``"auto"`` nor >= 0.
    """
    cores = cores or available_cores()
    if num_workers == "auto":
        if dataset.meta.mode == "raw" and dataset.transform is None:
            return 0, cores
        return cores, 0
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise OptionsError(f"num_workers should be 'auto' or >= 0, but got {num_workers!r}")
    return num_workers, cores if num_workers == 0 else 0


class H5Loader(DataLoader[Any]):
    """A DataLoader whose ``set_epoch`` reaches its sampler, and that can resume mid-epoch.

    ``state_dict()`` records the batches delivered to the training loop (not those the
    workers prefetched); ``load_state_dict()`` makes the next iteration deliver the rest of
    that epoch in the same order.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delivered = 0

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
        self._delivered = start
        for batch in super().__iter__():
            self._delivered += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Return the sampler's state with the batches delivered so far this epoch."""
        return self.chunk_sampler.state_dict(position=self._delivered)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``: the next iteration delivers the rest of the epoch."""
        self.chunk_sampler.load_state_dict(state)
        self._delivered = int(state["position"])


def make_loader(
    path_or_dataset: StrPath | H5ImageDataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    num_workers: int | Literal["auto"] = "auto",
    seed: int = 0,
    num_replicas: int | None = None,
    rank: int | None = None,
    drop_last: bool = False,
    window_chunks: int | None = None,
    window_bytes: int | None = None,
    threads: int | None = None,
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    multiprocessing_context: Any = None,
    collate_fn: Callable[[Any], Any] | None = None,
    transform: Callable[[Any], Any] | None = None,
    target_transform: Callable[[int], Any] | None = None,
    output: Output | None = None,
    return_path: bool | None = None,
    locking: bool | None = None,
    backend: Backend | None = None,
    direct: bool | None = None,
    verify_checksums: bool | None = None,
) -> H5Loader:
    """Return a DataLoader over a pack: chunk-aware sampling, workers, pinning and seeding.

    The public edge of the training side: its keywords become one ``EpochSpec`` (the
    sampler's), one ``ReaderOptions`` (each process's reader) and the dataset. A dataset
    passed in is never changed: the loader reads with a configured copy of it. Every
    default is explained in the module note "Loader defaults".

    Args:
        path_or_dataset: A pack path, or an ``H5ImageDataset``.
        batch_size: Samples per batch.
        shuffle: Shuffle chunks and windows (``ChunkBatchSampler``).
        num_workers: Worker processes, or ``"auto"`` (see ``auto_workers``).
        seed: Seed of the order, of the loader's generator and of the workers.
        num_replicas: Ranks (default from ``torch.distributed``).
        rank: This rank (default from ``torch.distributed``).
        drop_last: Drop the last incomplete batch (and the uneven tail across ranks).
        window_chunks: Chunks mixed at once per worker; default from ``window_bytes``.
        window_bytes: Memory budget of all workers' shuffle windows.
        threads: Decompression threads of the dataset; default: the dataset's own setting,
            else all cores when reading in the main process, else 0.
        pin_memory: Default: ``torch.cuda.is_available()``.
        persistent_workers: Default: on with workers.
        prefetch_factor: Batches prefetched per worker (PyTorch's default, 2).
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None.
        collate_fn: Default: ``collate`` (one preallocated uint8 tensor per batch).
        transform: As for ``H5ImageDataset`` (only when given a path).
        target_transform: As for ``H5ImageDataset`` (only when given a path).
        output: As for ``H5ImageDataset`` (only when given a path; default ``"tensor"``).
        return_path: As for ``H5ImageDataset`` (only when given a path).
        locking: As ``ReaderOptions.locking`` (only when given a path).
        backend: As ``ReaderOptions.backend`` (only when given a path).
        direct: As ``ReaderOptions.direct`` (only when given a path).
        verify_checksums: As ``ReaderOptions.verify_checksums`` (only when given a path).

    Returns:
        An ``H5Loader`` yielding ``(images, labels)`` (``(images, labels, paths)`` with
        ``return_path=True``); images are (B, C, H, W) uint8 tensors.

    Raises:
        OptionsError: a bad argument, or dataset options next to a dataset.
    """
    dataset_options = {
        "transform": transform,
        "target_transform": target_transform,
        "output": output,
        "return_path": return_path,
        "locking": locking,
        "backend": backend,
        "direct": direct,
        "verify_checksums": verify_checksums,
    }
    if isinstance(path_or_dataset, H5ImageDataset):
        given = sorted(name for name, value in dataset_options.items() if value is not None)
        if given:
            raise OptionsError(
                f"dataset options {given} apply only when make_loader opens the pack; set "
                "them on the H5ImageDataset instead"
            )
        dataset = path_or_dataset
    else:
        reader = ReaderOptions(
            locking=locking,
            backend=backend or "pillow",
            direct=True if direct is None else direct,
            verify_checksums=bool(verify_checksums),
        )
        dataset = H5ImageDataset(
            path_or_dataset,
            transform=transform,
            target_transform=target_transform,
            output=output or "tensor",
            return_path=bool(return_path),
            reader=reader,
        )
    num_workers, auto_threads = auto_workers(dataset, num_workers)
    spec = EpochSpec(
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        window_chunks=window_chunks,
        window_bytes=window_bytes,
        drop_last=drop_last,
        num_replicas=num_replicas,
        rank=rank,
        num_workers=num_workers,
    )
    sampler = ChunkBatchSampler.from_spec(dataset, spec)
    options = dataset.options
    if options.window_chunks is None and options.chunk_cache_bytes is None:
        options = replace(options, window_chunks=sampler.window_chunks)
    if threads is not None or options.threads is None:
        options = replace(options, threads=auto_threads if threads is None else threads)
    generator = torch.Generator()
    generator.manual_seed(seed)
    workers_kwargs: dict[str, Any] = {}
    if num_workers > 0:
        workers_kwargs = {
            "persistent_workers": True if persistent_workers is None else persistent_workers,
            "prefetch_factor": 2 if prefetch_factor is None else prefetch_factor,
            "worker_init_fn": seed_worker,
            "multiprocessing_context": multiprocessing_context,
        }
    return H5Loader(
        dataset.configured(options),
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate if collate_fn is None else collate_fn,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        generator=generator,
        **workers_kwargs,
    )


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple | list):
        return type(value)(_to_device(v, device) for v in value)
    return value


class DevicePrefetcher:
    """Iterate a loader with each batch already on ``device``, one batch ahead; echo batches.

    On CUDA the next batch is copied on a side stream while the current one is used
    (asynchronous from pinned memory, which ``make_loader`` turns on with CUDA), and the
    main stream waits for that copy only when it takes the batch. Elsewhere batches are
    moved with ``.to(device)``.

    Batch echoing (Choi et al., "Faster Neural Network Training with Data Echoing", 2019):
    with ``echo=k`` every batch is yielded k times in a row, for when the input pipeline,
    not the model, is the bottleneck; apply random augmentation on the device after this so
    that the repeats differ.

    Args:
        loader: Any iterable of batches (``make_loader``'s ``H5Loader`` included).
        device: Target device; default CUDA when available, else CPU.
        echo: Times each batch is yielded.

    Example:
        >>> batches = [(torch.zeros(2), torch.ones(2))]
        >>> [b[1].tolist() for b in DevicePrefetcher(batches, "cpu", echo=2)]
        [[1.0, 1.0], [1.0, 1.0]]
    """

    def __init__(
        self, loader: Any, device: str | torch.device | None = None, *, echo: int = 1
    ) -> None:
        if echo < 1:
            raise OptionsError(f"echo should be >= 1, but got echo={echo}")
        self.loader = loader
        default = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(default if device is None else device)
        self.echo = echo

    def __len__(self) -> int:
        return len(self.loader) * self.echo

    def set_epoch(self, epoch: int) -> None:
        """Forward to the loader's ``set_epoch``."""
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            for batch in self.loader:
                moved = _to_device(batch, self.device)
                for _ in range(self.echo):
                    yield moved
            return
        stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        iterator = iter(self.loader)

        def fetch() -> Any:
            try:
                batch = next(iterator)
            except StopIteration:
                return None
            with torch.cuda.stream(stream):
                return _to_device(batch, self.device)

        upcoming = fetch()
        while upcoming is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            current = upcoming
            for tensor in _tensors(current):
                tensor.record_stream(torch.cuda.current_stream(self.device))
            upcoming = fetch()
            for _ in range(self.echo):
                yield current


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _tensors(v)
