"""``bench``: loader throughput for given settings, and where the time goes (``diagnose``).

# NOTE [ Diagnosing a loader ]
#
# After DS-Analyzer (Mohan et al., "Analyzing and Mitigating Data Stalls in DNN
# Training", VLDB 2021), the same loader settings run three times:
# 1. ceiling: batches of the pack's own images held in memory, through the same
#    DataLoader, workers, batch size and transforms: the loader's own cost (worker IPC,
#    collation, transforms);
# 2. warm: the pack with its pages in the OS page cache: adds decompression and decoding;
# 3. cold: the pack dropped from the page cache before each epoch (see "Dropping the page
#    cache"): adds the storage.
# The time per image of each stage is the difference between consecutive stages
# (1/warm - 1/ceiling, 1/cold - 1/warm); the bottleneck is the stage that adds the most.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.bench.access import (
    ReadCount,
    check_pattern,
    random_order,
    replay_reader,
    storage_layout,
)
from h5pack.bench.loading import TrainTransform, collate_any, run_epoch
from h5pack.bench.system import CacheDrop, drop_page_cache, warm_page_cache
from h5pack.bench.timing import Count, Timing, time_repeats
from h5pack.errors import OptionsError
from h5pack.training.shuffle_quality import jump_entropy

BOTTLENECKS: tuple[str, ...] = ("loader", "decode", "storage")
STAGE_TITLES = {
    "ceiling": "in-memory batches (loader ceiling)",
    "warm": "pack, warm page cache",
    "cold": "pack, cold page cache",
}
BOTTLENECK_TEXT = {
    "loader": "the loader itself (worker IPC, collation, transforms): more workers or "
    "lighter transforms, not a different layout, would help",
    "decode": "decompression and decoding: a faster codec (lz4, none), raw instead of "
    "encoded, or more workers would help",
    "storage": "the storage: a better compression ratio, larger chunks or faster disks would help",
}


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """Loader settings of ``bench``.

    Attributes:
        batch_size: Samples per batch.
        workers: DataLoader workers, or ``"auto"`` (``make_loader``'s choice).
        order: ``"chunk"`` (h5pack's sampler), ``"random"`` (a full shuffle, batches read
            through the same dataset) or ``"sequential"``.
        cache_bytes: Bytes of decompressed chunks each process keeps (None: the window).
        transforms: Apply ``TrainTransform`` (crop, flip, normalise) to every image.
        repeats: Timed epochs.
        warmup: Untimed epochs first.
        max_batches: Stop each epoch after this many batches (None: whole epochs).
        seed: Seed of the order.
    """

    batch_size: int = 64
    workers: int | Literal["auto"] = "auto"
    order: str = "chunk"
    cache_bytes: int | None = None
    transforms: bool = False
    repeats: int = 3
    warmup: int = 1
    max_batches: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_pattern(self.order)
        if self.batch_size < 1:
            raise OptionsError(f"batch_size should be >= 1, but got batch_size={self.batch_size}")
        if self.workers != "auto" and (not isinstance(self.workers, int) or self.workers < 0):
            raise OptionsError(f"workers should be 'auto' or >= 0, but got {self.workers!r}")
        if self.cache_bytes is not None and self.cache_bytes < 0:
            raise OptionsError(f"cache_bytes should be >= 0, but got {self.cache_bytes}")
        if self.repeats < 1:
            raise OptionsError(f"repeats should be >= 1, but got repeats={self.repeats}")
        if self.max_batches is not None and self.max_batches < 1:
            raise OptionsError(f"max_batches should be >= 1, but got {self.max_batches}")


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """Loader throughput on one pack.

    Attributes:
        path: The pack.
        options: The settings.
        timing: The timed epochs.
        workers: Worker processes used (``"auto"`` resolved).
        threads: Decompression threads of an in-process reader.
        window_chunks: Chunk groups each process keeps decompressed.
        reads: Chunk loads and bytes read per epoch (replayed, see "Replaying reads").
        shuffle_bits: Jump entropy of the epoch order.
    """

    path: str
    options: BenchOptions
    timing: Timing
    workers: int
    threads: int
    window_chunks: int
    reads: ReadCount
    shuffle_bits: float


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One stage of a diagnosis: its throughput, or why it was not measured."""

    name: str
    timing: Timing | None
    note: str = ""

    @property
    def images_per_s(self) -> float:
        """Median images per second (0 when not measured)."""
        return self.timing.images_per_s if self.timing else 0.0


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """Where a loader's time goes (see the note "Diagnosing a loader").

    Attributes:
        result: The warm run, as ``bench`` reports it.
        stages: ``ceiling``, ``warm`` and ``cold``.
        shares: Seconds per image added by ``loader``, ``decode`` and ``storage``.
        bottleneck: The stage that adds the most time, one of ``BOTTLENECKS``.
        cache_drop: What dropping the page cache did.
        explanation: One line naming the bottleneck and what would help.
    """

    result: BenchResult
    stages: tuple[Stage, ...]
    shares: dict[str, float]
    bottleneck: str
    cache_drop: CacheDrop
    explanation: str


class _Loaders:
    """Builds one loader per epoch over one dataset, with the settings resolved once."""

    def __init__(self, dataset: Any, options: BenchOptions) -> None:
        from h5pack.training.loader import auto_workers

        self.dataset = dataset
        self.options = options
        self.workers, self.threads = auto_workers(dataset, options.workers)
        self.epoch = 0
        self.last: Any = None

    def make(self) -> Any:
        import torch
        from torch.utils.data import BatchSampler, DataLoader, RandomSampler

        from h5pack.training.dataset import H5ImageDataset
        from h5pack.training.loader import make_loader, seed_worker

        options = self.options
        close = getattr(self.dataset, "close", None)
        if callable(close):
            close()  # fresh windows every epoch, see "Fresh epochs"
        if options.order == "random":
            generator = torch.Generator()
            generator.manual_seed(options.seed + self.epoch)
            sampler = BatchSampler(
                RandomSampler(self.dataset, generator=generator), options.batch_size, False
            )
            dataset = self.dataset
            if isinstance(dataset, H5ImageDataset):
                dataset = dataset.configured(replace(dataset.options, threads=self.threads))
            loader: Any = DataLoader(
                dataset,
                batch_sampler=sampler,
                num_workers=self.workers,
                collate_fn=collate_any,
                worker_init_fn=seed_worker if self.workers else None,
            )
        else:
            loader = make_loader(
                self.dataset,
                options.batch_size,
                shuffle=options.order == "chunk",
                num_workers=self.workers,
                seed=options.seed,
                threads=self.threads,
                persistent_workers=False,
                collate_fn=collate_any,
            )
            loader.set_epoch(self.epoch)
        self.epoch += 1
        self.last = loader
        return loader

    def run(self) -> Count:
        return run_epoch(self.make(), max_batches=self.options.max_batches)


def _dataset(path: StrPath, options: BenchOptions) -> Any:
    from h5pack.read.reader import ReaderOptions
    from h5pack.training.dataset import H5ImageDataset

    return H5ImageDataset(
        path,
        transform=TrainTransform() if options.transforms else None,
        reader=ReaderOptions(chunk_cache_bytes=options.cache_bytes),
    )


def _result(path: StrPath, loaders: _Loaders, timing: Timing) -> BenchResult:
    options = loaders.options
    layout = storage_layout(path)
    num = layout.groups.num_samples
    loader = loaders.last
    if options.order == "random":
        order = random_order(num, seed=options.seed)
        batches = np.array_split(order, max(1, -(-num // options.batch_size)))
        window = max(1, loaders.dataset.reader.window_chunks) if num else 1
    else:
        batches = loader.chunk_sampler.plan(0)
        window = loader.chunk_sampler.window_chunks
    if options.max_batches is not None:
        batches = batches[: options.max_batches]
    reads = replay_reader(layout, batches, window_chunks=window, num_workers=loaders.workers)
    flat = np.concatenate(batches) if len(batches) else np.zeros(0, dtype=np.int64)
    return BenchResult(
        path=os.fspath(path),
        options=options,
        timing=timing,
        workers=loaders.workers,
        threads=loaders.threads,
        window_chunks=window,
        reads=reads,
        shuffle_bits=jump_entropy(flat),
    )


def bench_loader(
    path: StrPath,
    options: BenchOptions | None = None,
    *,
    on_step: Callable[[], None] | None = None,
) -> BenchResult:
    """Measure images/s of an h5pack loader over ``path`` (warm page cache).

    Args:
        path: The pack.
        options: Loader settings (default ``BenchOptions()``).
        on_step: Called after each epoch, warm-up included (progress).

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack.
        OptionsError: a bad setting.
    """
    options = options or BenchOptions()
    loaders = _Loaders(_dataset(path, options), options)
    warm_page_cache(os.fspath(path))
    try:
        timing = time_repeats(
            loaders.run, repeats=options.repeats, warmup=options.warmup, on_repeat=on_step
        )
        return _result(path, loaders, timing)
    finally:
        loaders.dataset.close()


class _InMemory:
    """A dataset of the pack's images held in memory: the loader ceiling.

    Hands out the same batches as ``H5ImageDataset`` (one preallocated batch for fixed-size
    images without transforms, else per-sample tensors) without reading anything.
    """

    def __init__(
        self,
        images: Sequence[np.ndarray],
        labels: np.ndarray,
        length: int,
        transform: Callable[[Any], Any] | None,
    ) -> None:
        self.images = list(images)
        shapes = {image.shape for image in self.images}
        self.stack = np.stack(self.images) if len(shapes) == 1 else None
        self.labels = labels
        self.length = length
        self.transform = transform

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        import torch

        from h5pack.training.dataset import SampleBatch, empty_uint8

        idx = np.asarray(indices, dtype=np.int64) % len(self.images)
        labels = torch.from_numpy(self.labels[idx].copy())
        if self.stack is not None and self.transform is None:
            buffer = empty_uint8((idx.size, *self.stack.shape[1:]))
            np.take(self.stack, idx, axis=0, out=buffer.numpy())
            return SampleBatch(
                images=buffer.permute(0, 3, 1, 2), labels=labels, label_values=labels.tolist()
            )
        samples = []
        for j, i in enumerate(idx.tolist()):
            image: Any = torch.from_numpy(np.ascontiguousarray(self.images[i].transpose(2, 0, 1)))
            if self.transform is not None:
                image = self.transform(image)
            samples.append((image, int(labels[j])))
        return samples


def _ceiling(
    path: StrPath, loaders: _Loaders, options: BenchOptions, on_step: Callable[[], None] | None
) -> Timing:
    from torch.utils.data import DataLoader

    from h5pack.read.reader import PackReader
    from h5pack.training.sampler import ChunkBatchSampler

    with PackReader(path) as reader:
        held = min(len(reader), 256)
        images = reader.read_images(np.arange(held))
        labels = reader.meta.labels[:held] if held else np.zeros(0, dtype=np.int64)
        chunk_map = reader.chunk_map
    memory = _InMemory(
        images, labels, len(loaders.dataset), TrainTransform() if options.transforms else None
    )

    def run() -> Count:
        sampler = ChunkBatchSampler(
            chunk_map, options.batch_size, seed=options.seed, num_workers=loaders.workers
        )
        loader: DataLoader[Any] = DataLoader(
            memory,  # type: ignore[arg-type]  # a map-style dataset by protocol
            batch_sampler=sampler,
            num_workers=loaders.workers,
            collate_fn=collate_any,
        )
        return run_epoch(loader, max_batches=options.max_batches)

    return time_repeats(run, repeats=options.repeats, warmup=options.warmup, on_repeat=on_step)


def diagnose(
    path: StrPath,
    options: BenchOptions | None = None,
    *,
    on_step: Callable[[], None] | None = None,
) -> Diagnosis:
    """Separate where the loader's time goes and name the bottleneck.

    See the note "Diagnosing a loader". The cold stage is skipped, and says why, when the
    OS keeps the pack cached despite the request.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack.
    """
    options = options or BenchOptions()
    loaders = _Loaders(_dataset(path, options), options)
    text = os.fspath(path)
    try:
        ceiling = _ceiling(path, loaders, options, on_step)
        warm_page_cache(text)
        warm = time_repeats(
            loaders.run, repeats=options.repeats, warmup=options.warmup, on_repeat=on_step
        )
        result = _result(path, loaders, warm)
        drops: list[CacheDrop] = []
        probe = drop_page_cache(text)
        cold: Timing | None = None
        if probe.dropped:
            cold = time_repeats(
                loaders.run,
                repeats=options.repeats,
                before=lambda: drops.append(drop_page_cache(text)),
                on_repeat=on_step,
            )
            if drops and not all(d.dropped for d in drops):
                probe = next(d for d in drops if not d.dropped)
                cold = None
        elif on_step is not None:
            for _ in range(options.repeats):
                on_step()
    finally:
        loaders.dataset.close()
    stages = (
        Stage(name="ceiling", timing=ceiling),
        Stage(name="warm", timing=warm),
        Stage(name="cold", timing=cold, note="" if cold else probe.message),
    )
    shares = _shares(ceiling.images_per_s, warm.images_per_s, cold.images_per_s if cold else None)
    bottleneck = max(shares, key=lambda k: shares[k])
    explanation = f"bottleneck: {bottleneck} — {BOTTLENECK_TEXT[bottleneck]}"
    if cold is None:
        explanation += f" (storage not measured: {probe.message})"
    return Diagnosis(
        result=result,
        stages=stages,
        shares=shares,
        bottleneck=bottleneck,
        cache_drop=probe,
        explanation=explanation,
    )


def _shares(ceiling: float, warm: float, cold: float | None) -> dict[str, float]:
    """Seconds per image each stage adds (never negative: noise is not a speed-up)."""

    def per_image(rate: float) -> float:
        return 1.0 / rate if rate > 0 else float("inf")

    shares = {
        "loader": per_image(ceiling),
        "decode": max(0.0, per_image(warm) - per_image(ceiling)),
        "storage": 0.0,
    }
    if cold is not None:
        shares["storage"] = max(0.0, per_image(cold) - per_image(warm))
    return shares
