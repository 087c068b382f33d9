"""``bench`` and ``info`` on a mix of sources: shares, passes, coverage, throughput.

``mix_plan`` says what every epoch takes of each source (no reading); ``bench_mix`` times
``make_loader(sources, weights=...)`` and counts the chunks its readers decompress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from h5pack.bench.timing import Count, Timing, time_interleaved
from h5pack.core.store import Store
from h5pack.read.mixture import MixView, describe_mix
from h5pack.read.packset import PackSource
from h5pack.training.weighted import SourceShare, WeightedMix, check_weights, source_shares


@dataclass(frozen=True)
class MixPlan:
    """What every epoch of a mix takes of each source (``shares``, one per source)."""

    view: MixView
    weights: tuple[float, ...]
    epoch_samples: int
    shares: list[SourceShare]

    def to_dict(self) -> dict[str, Any]:
        """Return the plan as JSON-ready values."""
        return {
            "weights": list(self.weights),
            "epoch_samples": self.epoch_samples,
            "classes": list(self.view.meta.classes),
            "sources": [s.to_dict() for s in self.shares],
        }

    def lines(self) -> list[str]:
        """Return the plan as a small table, one row a source."""
        rows = [
            f"{'source':<24} {'samples':>8} {'weight':>6} {'per epoch':>9} {'share':>6} "
            f"{'passes':>6} {'covered':>7} {'epochs to cover':>15}"
        ]
        for share, weight in zip(self.shares, self.weights, strict=True):
            rows.append(
                f"{share.name[-24:]:<24} {share.samples:>8} {weight:>6g} {share.per_epoch:>9} "
                f"{share.share:>6.1%} {share.passes:>6.2f} {share.coverage:>7.0%} "
                f"{share.epochs_to_cover:>15}"
            )
        return rows


def mix_plan(
    sources: Sequence[PackSource],
    weights: Sequence[float],
    *,
    epoch_samples: int | None = None,
    view: MixView | None = None,
) -> MixPlan:
    """Describe ``sources`` and what every epoch of their mix by ``weights`` takes of each."""
    view = view or describe_mix(sources)
    values = check_weights(weights, len(view.views))
    mix = WeightedMix(view.chunk_maps, values, epoch_samples)
    return MixPlan(view, values, mix.num_samples, source_shares(mix, view.names))


@dataclass(frozen=True)
class MixBench:
    """Throughput of a loader over a mix; ``served``: samples of each source, last epoch.

    ``loads_per_sample``: chunks decompressed per sample served (in-process readers; None
    when the loader reads in worker processes).
    """

    plan: MixPlan
    timing: Timing
    loads_per_sample: float | None
    batch_size: int
    workers: int
    served: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the result as JSON-ready values."""
        return {
            **self.plan.to_dict(),
            "images_per_s": self.timing.images_per_s,
            "rates": list(self.timing.rates),
            "cpu_s_per_image": self.timing.cpu_s_per_image or 0.0,
            "loads_per_sample": self.loads_per_sample,
            "batch_size": self.batch_size,
            "workers": self.workers,
            "served_last_epoch": self.served,
        }

    def lines(self) -> list[str]:
        """Return the result as text lines."""
        loads = "-" if self.loads_per_sample is None else f"{self.loads_per_sample:.3f}"
        runs = ", ".join(f"{r:,.0f}" for r in self.timing.rates)
        served = ", ".join(f"{name} {count}" for name, count in self.served.items())
        return [
            *self.plan.lines(),
            f"images/s {self.timing.images_per_s:,.0f} (runs: {runs}); CPU "
            f"{1e6 * (self.timing.cpu_s_per_image or 0.0):.0f} us/image; chunks decompressed "
            f"per sample {loads}; batch {self.batch_size}, workers {self.workers}",
            f"served in the last epoch: {served}",
        ]


def bench_mix(
    sources: Sequence[PackSource],
    weights: Sequence[float],
    *,
    epoch_samples: int | None = None,
    batch_size: int = 64,
    workers: int | Literal["auto"] = "auto",
    size: int | tuple[int, int] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    budget_s: float = 30.0,
    seed: int = 0,
    store: Store | None = None,
) -> MixBench:
    """Time ``make_loader(sources, batch_size, weights=weights, ...)`` over whole epochs.

    URLs among ``sources`` are read from ``store`` (None: chosen per path).
    """
    from h5pack.read.options import ReaderOptions
    from h5pack.training.epochs import EpochSpec
    from h5pack.training.loader import make_loader
    from h5pack.training.mixed import H5MixDataset

    loader = make_loader(
        list(sources),
        EpochSpec(batch_size=batch_size, epoch_samples=epoch_samples),
        weights=list(weights),
        num_workers=workers,
        size=size,
        seed=seed,
        return_source=True,
        reader=ReaderOptions(store=store),
    )
    dataset = loader.dataset
    assert isinstance(dataset, H5MixDataset)  # make_loader with weights= builds one
    plan = mix_plan(sources, weights, epoch_samples=epoch_samples, view=dataset.mix)
    epoch = [0]
    served: dict[str, int] = {}

    def one_epoch() -> Count:
        loader.set_epoch(epoch[0])
        epoch[0] += 1
        images = nbytes = 0
        counts = np.zeros(len(plan.shares), dtype=np.int64)
        for batch in loader:
            images += len(batch[1])
            nbytes += int(batch[0].numel()) if hasattr(batch[0], "numel") else 0
            counts += np.bincount(batch[-1].numpy(), minlength=len(counts))
        served.clear()
        served.update({s.name: int(c) for s, c in zip(plan.shares, counts.tolist(), strict=True)})
        return Count(images, nbytes)

    before = _loads(dataset)
    timing = time_interleaved(
        {"mix": one_epoch},
        repeats=repeats,
        warmup=warmup,
        min_run_s=0.3,
        target_spread=0.1,
        budget_s=budget_s,
    )["mix"]
    loads = None
    if loader.num_workers == 0:
        loads = (_loads(dataset) - before) / max(1, epoch[0] * plan.epoch_samples)
    loader.close()
    dataset.close()
    return MixBench(
        plan=plan,
        timing=timing,
        loads_per_sample=loads,
        batch_size=batch_size,
        workers=loader.num_workers,
        served=dict(served),
    )


def _loads(dataset: Any) -> int:
    """Chunks decompressed so far by the sources' readers in this process."""
    return sum(int(getattr(part.reader, "loads", 0)) for part in dataset.parts)
