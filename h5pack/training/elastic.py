"""Elastic resume: finish an epoch on another topology (ranks, workers, batch size).

A sampler state saved mid-epoch by R ranks with W workers records the settings that planned
the epoch and the position reached. Loaded by a sampler of another topology, it is turned
into the set of samples already delivered, and the rest of the epoch is planned over the
new topology, chunk-aware: see the note "Elastic resume".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training.sampler import EpochSpec, plan_epoch

# NOTE [ Elastic resume ]
#
# Under DistributedDataParallel every rank takes the same number of steps (every rank
# yields the same number of batches, and gradients are averaged in lock step), so the
# state of any one rank says where all of them are: ``position`` batches (``unit``
# "batches"; samples for ``ChunkSampler``) of the epoch ``epoch``, planned by ``plan_epoch``
# with the recorded settings (``num_replicas``, ``num_workers``, ``batch_size``,
# ``window_chunks``, ``drop_last``, ``shuffle``, ``seed``, and the chunk strata, which a
# sampler over the same data derives again from its labels).
#
# 1. Delivered: replay the saved epoch's plan for each old rank r = 0 .. R - 1 and mark
#    the samples of its first ``position`` batches (``delivered_mask``). Samples the old
#    ranks repeated as padding are marked once; nothing is read from a file.
# 2. Remaining: the unmarked samples, in pack order. Each chunk's remaining samples are
#    contiguous there, so they form a sub-pool of "sub-chunks" (one per chunk that still
#    has samples): a ``ChunkMap`` over positions in the remaining list.
# 3. Re-plan: ``plan_epoch`` of the sub-pool with the new spec (new ranks, workers, batch
#    size and window; the same seed and epoch; each sub-chunk keeps its chunk's stratum),
#    mapped back to sample indices. Chunks are still split across ranks and workers and
#    read once per epoch, every rank has the same number of batches, and padding or
#    dropping follows the new ``drop_last`` over the remaining samples.
#
# Every rank computes steps 1-3 from the same state, with no communication, and gets the
# same sub-pool: the re-plan is a pure function of (state, data, new spec). The state of a
# re-planned epoch keeps the state it was re-planned from under ``base``, so a second change
# of topology in the same epoch replays both plans (the recursion is as deep as the number
# of changes). The next epoch is planned normally.

# Settings that fix the order of an epoch: a state saved with others is refused, not
# re-planned (it is another order, not another topology).
ORDER_SETTINGS = ("shuffle", "seed", "stratified")

# Settings of the topology: a state saved with others is re-planned.
TOPOLOGY_SETTINGS = ("num_replicas", "num_workers", "batch_size", "window_chunks", "drop_last")


def saved_spec(state: Mapping[str, Any], chunk_strata: tuple[int, ...] | None) -> EpochSpec:
    """Return the spec that planned the saved epoch (rank 0; ``plan_epoch`` fills the rank).

    Raises:
        OptionsError: the state was stratified but no strata are given.
    """
    if state.get("stratified") and chunk_strata is None:
        raise OptionsError(
            "the sampler state was saved with a stratified chunk order; load it into a "
            "sampler of the same pack through make_loader (or sampler_for_labels)"
        )
    return EpochSpec(
        batch_size=int(state["batch_size"]),
        shuffle=bool(state["shuffle"]),
        seed=int(state["seed"]),
        window_chunks=None if state["window_chunks"] is None else int(state["window_chunks"]),
        drop_last=bool(state["drop_last"]),
        num_replicas=int(state["num_replicas"] or 1),
        rank=0,
        num_workers=int(state["num_workers"]),
        chunk_strata=chunk_strata if state.get("stratified") else None,
    )


def plan_rest(
    chunk_map: ChunkMap, spec: EpochSpec, *, epoch: int, delivered: np.ndarray
) -> list[np.ndarray]:
    """Return one rank's batches of the samples of ``epoch`` not yet ``delivered``.

    Steps 2 and 3 of the note "Elastic resume": the remaining samples of each chunk form a
    sub-chunk, and ``plan_epoch`` plans the sub-pool with ``spec``.

    Args:
        chunk_map: The pack's chunks.
        spec: The new topology (resolved: its rank and window are used as they are).
        epoch: The epoch (with ``spec.seed``, the order's seed).
        delivered: One bool per sample: delivered already this epoch.
    """
    remaining = np.flatnonzero(~delivered)
    if remaining.size == 0:
        return []
    parents = chunk_map.chunks_of(remaining)
    starts = np.flatnonzero(np.diff(parents)) + 1
    sub = ChunkMap(np.concatenate([[0], starts, [remaining.size]]).astype(np.int64))
    strata = spec.chunk_strata
    if strata is not None:
        first = np.concatenate([[0], starts])
        strata = tuple(int(s) for s in np.asarray(strata, dtype=np.int64)[parents[first]])
    batches = plan_epoch(sub, replace(spec, chunk_strata=strata), epoch=epoch)
    return [remaining[b] for b in batches]


def plan_of(
    chunk_map: ChunkMap, spec: EpochSpec, *, epoch: int, delivered: np.ndarray | None
) -> list[np.ndarray]:
    """Return ``plan_epoch``'s batches, or ``plan_rest``'s when some were ``delivered``."""
    if delivered is None:
        return plan_epoch(chunk_map, spec, epoch=epoch)
    return plan_rest(chunk_map, spec, epoch=epoch, delivered=delivered)


def delivered_mask(
    chunk_map: ChunkMap, state: Mapping[str, Any], chunk_strata: tuple[int, ...] | None
) -> np.ndarray:
    """Return one bool per sample: delivered by every old rank before ``state`` was saved.

    Step 1 of the note "Elastic resume", through the chain of ``base`` states.

    Raises:
        OptionsError: the state is stratified but no strata are given.
    """
    base = state.get("base")
    before = delivered_mask(chunk_map, base, chunk_strata) if base else None
    spec = saved_spec(state, chunk_strata)
    epoch, position = int(state["epoch"]), int(state["position"])
    samples = state.get("unit", "batches") == "samples"
    mask = np.zeros(chunk_map.num_samples, dtype=bool) if before is None else before.copy()
    if position == 0:
        return mask  # nothing delivered since ``base``: no plan to replay
    for rank in range(spec.num_replicas or 1):
        batches = plan_of(chunk_map, replace(spec, rank=rank), epoch=epoch, delivered=before)
        if not batches:
            continue
        if samples:
            mask[np.concatenate(batches)[:position]] = True
        else:
            mask[np.concatenate(batches[:position])] = True
    return mask
