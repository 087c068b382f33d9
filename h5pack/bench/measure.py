"""Measure one pack under the three access patterns: throughput, reads, shuffle quality.

# NOTE [ Fresh epochs ]
#
# Each timed epoch of the h5pack loader starts from a new DataLoader over a closed dataset:
# no decompressed chunk survives from the previous epoch. A pack of a few hundred MB would
# otherwise sit whole in the shuffle windows after the first epoch and every later epoch
# would measure memory copies, not the layout; real datasets are larger than the window.
# With worker processes, the timed epoch includes starting them (fork: milliseconds).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.bench.access import (
    PATTERNS,
    Pattern,
    ReadCount,
    StorageLayout,
    random_order,
    read_per_sample,
    replay_h5py,
    replay_reader,
    storage_layout,
)
from h5pack.bench.loading import collate_any, run_epoch
from h5pack.bench.system import warm_page_cache
from h5pack.bench.timing import Count, Timing, time_repeats
from h5pack.errors import OptionsError
from h5pack.training.shuffle_quality import jump_entropy


@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How a pack is measured.

    Attributes:
        batch_size: Samples per batch of the h5pack loader.
        workers: DataLoader workers of the h5pack loader, or ``"auto"`` (``make_loader``).
        repeats: Timed epochs per pattern (medians and spread are over these).
        warmup: Untimed epochs first (worker start-up, lazy opens).
        random_budget_s: Seconds per repeat of naive per-sample reads; its rate is steady,
            so a prefix of the epoch measures it (at least ``random_min_samples``).
        random_min_samples: Samples per repeat of naive reads, whatever the budget.
        patterns: Access patterns to measure.
        seed: Seed of every order.
    """

    batch_size: int = 64
    workers: int | Literal["auto"] = "auto"
    repeats: int = 3
    warmup: int = 1
    random_budget_s: float = 2.0
    random_min_samples: int = 16
    patterns: tuple[str, ...] = PATTERNS
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise OptionsError(f"batch_size should be >= 1, but got batch_size={self.batch_size}")
        if self.workers != "auto" and (not isinstance(self.workers, int) or self.workers < 0):
            raise OptionsError(f"workers should be 'auto' or >= 0, but got {self.workers!r}")
        if self.repeats < 1:
            raise OptionsError(f"repeats should be >= 1, but got repeats={self.repeats}")
        if self.random_budget_s <= 0:
            raise OptionsError(
                f"random_budget_s should be positive, but got {self.random_budget_s}"
            )
        unknown = [p for p in self.patterns if p not in PATTERNS]
        if unknown or not self.patterns:
            raise OptionsError(
                f"patterns should be among {', '.join(PATTERNS)}, but got {self.patterns!r}"
            )


@dataclass(frozen=True, kw_only=True)
class PatternResult:
    """One access pattern measured on one pack.

    Attributes:
        pattern: ``"random"``, ``"chunk"`` or ``"sequential"``.
        timing: The timed repeats.
        workers: DataLoader workers used (0 for naive reads and in-process loading).
        window_chunks: Chunk groups each reader keeps decompressed (0 for naive reads).
        reads: Chunk loads and bytes read, replayed over the samples delivered.
        shuffle_bits: Jump entropy of the epoch order (``h5pack.training.shuffle_quality``).
        shuffle_vs_random: ``shuffle_bits`` over that of a full shuffle of the same size.
    """

    pattern: str
    timing: Timing
    workers: int
    window_chunks: int
    reads: ReadCount
    shuffle_bits: float
    shuffle_vs_random: float

    @property
    def images_per_s(self) -> float:
        """Median images per second."""
        return self.timing.images_per_s

    @property
    def mb_per_s(self) -> float:
        """Median decoded MB per second."""
        return self.timing.mb_per_s


def _shuffle(order: np.ndarray, seed: int) -> tuple[float, float]:
    bits = jump_entropy(order)
    reference = jump_entropy(random_order(order.size, seed=seed, epoch=99))
    return bits, (bits / reference if reference > 0 else 0.0)


def measure_random(
    path: StrPath, layout: StorageLayout, options: MeasureOptions, *, step: Callable[[], None]
) -> PatternResult:
    """Measure naive per-sample reads in a full shuffle, h5py's default cache."""
    num = layout.groups.num_samples
    epochs = iter(range(10**9))

    def run() -> Count:
        order = random_order(num, seed=options.seed, epoch=next(epochs))
        return read_per_sample(
            path,
            order,
            budget_s=options.random_budget_s,
            min_samples=min(num, options.random_min_samples),
        )

    timing = time_repeats(run, repeats=options.repeats, warmup=0, on_repeat=step)
    order = random_order(num, seed=options.seed, epoch=0)
    reads = replay_h5py(layout, order[: max(timing.images)])
    bits, relative = _shuffle(order, options.seed)
    return PatternResult(
        pattern="random",
        timing=timing,
        workers=0,
        window_chunks=0,
        reads=reads,
        shuffle_bits=bits,
        shuffle_vs_random=relative,
    )


def measure_loader(
    path: StrPath,
    layout: StorageLayout,
    options: MeasureOptions,
    *,
    shuffle: bool,
    step: Callable[[], None],
) -> PatternResult:
    """Measure ``make_loader`` epochs: chunk-aware (``shuffle``) or in pack order.

    Each epoch runs on a fresh loader, so nothing decompressed carries over from the
    previous epoch, as on a dataset larger than the shuffle window (see the note
    "Fresh epochs").
    """
    from h5pack.training.dataset import H5ImageDataset
    from h5pack.training.loader import make_loader

    dataset = H5ImageDataset(path)
    epochs = iter(range(10**9))
    used: dict[str, Any] = {}

    def run() -> Count:
        dataset.close()  # a fresh window of decompressed chunks
        loader = make_loader(
            dataset,
            options.batch_size,
            shuffle=shuffle,
            num_workers=options.workers,
            seed=options.seed,
            persistent_workers=False,
            collate_fn=collate_any,
        )
        loader.set_epoch(next(epochs))
        used["loader"] = loader
        return run_epoch(loader)

    try:
        timing = time_repeats(run, repeats=options.repeats, warmup=options.warmup, on_repeat=step)
    finally:
        dataset.close()
    loader = used["loader"]
    sampler = loader.chunk_sampler
    batches = sampler.plan(0)
    reads = replay_reader(
        layout, batches, window_chunks=sampler.window_chunks, num_workers=loader.num_workers
    )
    order = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    bits, relative = _shuffle(order, options.seed)
    return PatternResult(
        pattern="chunk" if shuffle else "sequential",
        timing=timing,
        workers=loader.num_workers,
        window_chunks=sampler.window_chunks,
        reads=reads,
        shuffle_bits=bits,
        shuffle_vs_random=relative,
    )


def measure_pack(
    path: StrPath,
    options: MeasureOptions | None = None,
    *,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, PatternResult]:
    """Measure ``path`` under each access pattern of ``options`` (warm page cache).

    Args:
        path: The pack.
        options: How to measure (default ``MeasureOptions()``).
        on_step: Called with the pattern's name after each of its repeats (progress).

    Returns:
        The result of each pattern, keyed by pattern name.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack.
    """
    options = options or MeasureOptions()
    layout = storage_layout(path)
    warm_page_cache(os.fspath(path))
    results: dict[str, PatternResult] = {}
    for pattern in PATTERNS:
        if pattern not in options.patterns:
            continue

        def step(name: Pattern = pattern) -> None:
            if on_step is not None:
                on_step(name)

        if pattern == "random":
            results[pattern] = measure_random(path, layout, options, step=step)
        else:
            results[pattern] = measure_loader(
                path, layout, options, shuffle=pattern == "chunk", step=step
            )
    return results
