"""``compare``'s settling round: the front-runners timed again side by side.

See the note "A recommendation stable run to run" in ``h5pack.bench.ranking``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from h5pack.bench.options import CompareEvent, CompareOptions, RemoteReading
from h5pack.bench.ranking import VariantResult, front_runners, rank_key
from h5pack.bench.reading import TrainingRead
from h5pack.core.store import Store, open_store

# A variant slower than this share of the fastest so far can no longer be a front-runner:
# its pack is removed at once (unless kept), so the disk holds a few packs at a time.
_SETTLE_SHARE = 0.5


def removed(result: VariantResult) -> VariantResult:
    """Delete ``result``'s pack, if any; return it without a path."""
    if result.path is not None:
        Path(result.path).unlink(missing_ok=True)
    return dataclasses.replace(result, path=None)


def pruned(results: list[VariantResult], keep: bool) -> list[VariantResult]:
    """Remove the packs of variants that can no longer be front-runners (unless ``keep``)."""
    if keep:
        return results
    best = max((rank_key(r) for r in results if r.batchable), default=0.0)
    return [
        removed(r) if not r.batchable or rank_key(r) < _SETTLE_SHARE * best else r for r in results
    ]


def settle(
    results: Sequence[VariantResult],
    options: CompareOptions,
    train: TrainingRead,
    emit: Callable[[CompareEvent], None] | None = None,
    store_for: Callable[[str], Store] | None = None,
) -> list[VariantResult]:
    """Time the front-runners again side by side, their epochs alternating; return all.

    Each variant was measured on its own, minutes apart: a change in the machine's load in
    between moves one against another (see "A recommendation stable run to run" in
    ``bench.ranking``). The front-runners still on disk, measured warm, are read again in
    the chunk-aware order through ``time_interleaved`` (A B A B ...), and their chunk-aware
    timings are replaced by that round's. Each pack is read from ``store_for(path)``
    (None: ``open_store``).
    """
    from h5pack.bench.loaders import PatternLoader, open_dataset
    from h5pack.bench.measure import epoch_fraction
    from h5pack.bench.timing import time_interleaved

    measure = options.measure
    eligible = [
        r
        for r in results
        if r.batchable and r.path is not None and not r.cold and "chunk" in r.patterns
    ]
    front = front_runners(eligible)
    if len(front) < 2 or measure.repeats < 2 or "chunk" not in measure.patterns:
        return list(results)
    if emit is not None:
        emit(CompareEvent("note", f"timing {', '.join(r.name for r in front)} side by side"))
    loaders = {}
    try:
        for r in front:
            assert r.path is not None
            dataset = open_dataset(
                r.path,
                train,
                seed=measure.seed,
                cache=measure.cache,
                cache_bytes=measure.cache_bytes,
                remote=RemoteReading(store=(store_for or open_store)(r.path)),
            )
            loaders[r.name] = PatternLoader(
                dataset,
                "chunk",
                batch_size=measure.batch_size,
                workers=measure.workers,
                seed=measure.seed,
                budget_s=measure.epoch_budget_s,
            )
        timings = time_interleaved(
            dict(loaders),
            repeats=max(3, measure.repeats),
            warmup=measure.warmup,
            min_run_s=measure.min_run_s,
            target_spread=measure.target_spread,
            budget_s=measure.budget_s,
        )
    finally:
        for loader in loaders.values():
            loader.close()
    settled = []
    for r in results:
        if r.name not in timings:
            settled.append(r)
            continue
        chunk = dataclasses.replace(
            r.patterns["chunk"],
            timing=timings[r.name],
            side_by_side=True,
            epoch_fraction=epoch_fraction(timings[r.name], r.num_samples),
        )
        settled.append(dataclasses.replace(r, patterns={**r.patterns, "chunk": chunk}))
    return settled
