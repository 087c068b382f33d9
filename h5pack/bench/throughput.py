"""``bench``: the h5pack loader's throughput on one pack, for given settings.

The pack is read through one dataset and ``make_loader``'s settings in the order asked for
(see "One loader for every pattern" in ``h5pack.bench.loaders``), with the training read,
in runs long enough to time (see "Timing enough work" in ``h5pack.bench.timing``).
``h5pack.bench.diagnose`` splits the same figure into where the time goes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from h5pack.bench.access import ReadCount, check_pattern, pack_shape
from h5pack.bench.loaders import PatternLoader, RemoteReading, check_cache, open_dataset
from h5pack.bench.reading import (
    SizeSurvey,
    TrainChoice,
    TrainingRead,
    auto_note,
    batch_problem,
    resolve_training_read,
    survey_pack,
)
from h5pack.bench.sources import source_name, warm_source
from h5pack.bench.timing import Timing, time_interleaved
from h5pack.errors import OptionsError
from h5pack.read.packset import PackSource
from h5pack.training.shuffle_quality import jump_entropy


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """Loader settings of ``bench``.

    Attributes:
        batch_size: Samples per batch.
        workers: DataLoader workers, or ``"auto"`` (``make_loader``'s choice).
        order: ``"chunk"`` (h5pack's sampler), ``"random"`` (a full shuffle, batches read
            through the same dataset) or ``"sequential"``.
        chunk_cache_bytes: Bytes of decompressed chunks each process keeps (None: the
            window; ``ReaderOptions.chunk_cache_bytes``).
        cache: ``"decoded"``: read through ``make_loader``'s decoded cache (README's
            training loop); the warm-up epochs fill it and the timed epochs are the later
            ones; None reads without it (every epoch as the first).
        cache_bytes: The decoded cache's budget, ``make_loader``'s ``cache_bytes`` (None:
            its default); only with ``cache``.
        transforms: Apply ``TrainTransform`` (a per-sample Python transform: crop, flip,
            normalise) to every image.
        train: How training reads the images (``TrainingRead``: size, crop, flip), or
            ``"auto"`` (see the note "Training size by default" in ``bench.reading``).
        repeats: Timed runs (of one or more epochs each).
        warmup: Untimed epochs first; they also size the runs.
        max_batches: Stop each epoch after this many batches (None: whole epochs).
        min_run_s: Seconds a timed run lasts at least (whole epochs).
        target_spread: Lengthen the runs while the spread (fastest - slowest over median)
            is above this and ``budget_s`` allows.
        budget_s: Seconds the timing may take before runs stop being lengthened.
        seed: Seed of the order.
        remote: A remote pack's read-ahead and disk cache (``--cache-dir`` and the like).
    """

    batch_size: int = 64
    workers: int | Literal["auto"] = "auto"
    order: str = "chunk"
    chunk_cache_bytes: int | None = None
    cache: Literal["decoded"] | None = None
    cache_bytes: int | None = None
    transforms: bool = False
    train: TrainChoice = "auto"
    repeats: int = 3
    warmup: int = 1
    max_batches: int | None = None
    min_run_s: float = 0.3
    target_spread: float = 0.1
    budget_s: float = 30.0
    seed: int = 0
    remote: RemoteReading = field(default_factory=RemoteReading)

    def __post_init__(self) -> None:
        check_pattern(self.order)
        if self.batch_size < 1:
            raise OptionsError(f"batch_size should be >= 1, but got batch_size={self.batch_size}")
        if self.workers != "auto" and (not isinstance(self.workers, int) or self.workers < 0):
            raise OptionsError(f"workers should be 'auto' or >= 0, but got {self.workers!r}")
        if self.chunk_cache_bytes is not None and self.chunk_cache_bytes < 0:
            raise OptionsError(
                f"chunk_cache_bytes should be >= 0, but got {self.chunk_cache_bytes}"
            )
        check_cache(self.cache, self.cache_bytes)
        if self.repeats < 1:
            raise OptionsError(f"repeats should be >= 1, but got repeats={self.repeats}")
        if self.max_batches is not None and self.max_batches < 1:
            raise OptionsError(f"max_batches should be >= 1, but got {self.max_batches}")
        if self.min_run_s < 0 or self.target_spread <= 0 or self.budget_s < 0:
            raise OptionsError(
                "min_run_s and budget_s should be >= 0 and target_spread positive, but got "
                f"min_run_s={self.min_run_s}, target_spread={self.target_spread}, "
                f"budget_s={self.budget_s}"
            )
        if not (self.train == "auto" or isinstance(self.train, TrainingRead)):
            raise OptionsError(
                f"train should be a TrainingRead or 'auto', but got train={self.train!r}"
            )


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """Loader throughput on one pack.

    Attributes:
        path: The pack (a pack set: its manifest or directory; a list: its packs).
        options: The settings.
        timing: The timed runs.
        workers: Worker processes used (``"auto"`` resolved).
        threads: Decompression threads of an in-process reader.
        window_chunks: Chunk groups each process keeps decompressed.
        reads: Chunk loads and bytes read per epoch (see "Chunk work per sample").
        shuffle_bits: Jump entropy of the epoch order.
        train: How the images were read (``TrainingRead.to_json``, with a ``note``).
    """

    path: str
    options: BenchOptions
    timing: Timing
    workers: int
    threads: int
    window_chunks: int
    reads: ReadCount
    shuffle_bits: float
    train: dict[str, Any]


@dataclass
class Setup:
    """One pack (or pack set) opened for ``bench``: how it is read, its dataset and loader.

    Attributes:
        path: How reports name it (``sources.source_name``).
        options: The settings.
        survey: Its image sizes.
        train: How it is read.
        loader: The loader measured.
        source: The pack or pack set itself.
    """

    path: str
    options: BenchOptions
    survey: SizeSurvey
    train: TrainingRead
    loader: PatternLoader
    source: PackSource

    def close(self) -> None:
        """Stop the loader's workers and close the dataset."""
        self.loader.close()


def open_bench(path: PackSource, options: BenchOptions) -> Setup:
    """Open ``path`` for ``bench``: resolve the training read and build the loader.

    Args:
        path: A pack, or a pack set (its directory or manifest, or a list of packs).
        options: The settings.

    Raises:
        FileNotFoundError: the pack, or a shard, does not exist.
        FormatError: a file is not a pack, or a shard does not belong to the set.
    """
    survey = survey_pack(path, options.remote.storage_options)
    train = resolve_training_read(options.train, survey)
    dataset = open_dataset(
        path,
        train,
        transform=options.transforms,
        chunk_cache_bytes=options.chunk_cache_bytes,
        seed=options.seed,
        cache=options.cache,
        cache_bytes=options.cache_bytes,
        remote=options.remote,
    )
    loader = PatternLoader(
        dataset,
        check_pattern(options.order),
        batch_size=options.batch_size,
        workers=options.workers,
        seed=options.seed,
        batchable=batch_problem(survey, train) is None or options.transforms,
        max_batches=options.max_batches,
    )
    return Setup(source_name(path), options, survey, train, loader, path)


def bench_result(setup: Setup, timing: Timing) -> BenchResult:
    """Return ``bench``'s result of ``setup`` timed as ``timing``."""
    loader = setup.loader
    reads = pack_shape(setup.source, setup.options.remote.storage_options).reads(
        setup.options.order, loader.images_per_epoch, window_chunks=max(1, loader.window_chunks)
    )
    plan = loader.plan(0)
    order = np.concatenate(plan) if plan else np.zeros(0, dtype=np.int64)
    return BenchResult(
        path=setup.path,
        options=setup.options,
        timing=timing,
        workers=loader.workers,
        threads=loader.threads,
        window_chunks=loader.window_chunks,
        reads=reads,
        shuffle_bits=jump_entropy(order),
        train={**setup.train.to_json(), "note": auto_note(setup.train, setup.survey)},
    )


def bench_loader(
    path: PackSource,
    options: BenchOptions | None = None,
    *,
    on_step: Callable[[], None] | None = None,
) -> BenchResult:
    """Measure images/s of an h5pack loader over ``path`` (warm page cache).

    Args:
        path: The pack, or a pack set (its directory or manifest, or a list of packs).
        options: Loader settings (default ``BenchOptions()``).
        on_step: Called after each warm-up epoch and timed run (progress).

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack.
        OptionsError: a bad setting.
    """
    options = options or BenchOptions()
    setup = open_bench(path, options)
    warm_source(setup.source)
    try:
        timing = time_interleaved(
            {"warm": setup.loader},
            repeats=options.repeats,
            warmup=options.warmup,
            min_run_s=options.min_run_s,
            target_spread=options.target_spread,
            budget_s=options.budget_s,
            on_run=(lambda name: on_step()) if on_step is not None else None,
        )["warm"]
        return bench_result(setup, timing)
    finally:
        setup.close()
