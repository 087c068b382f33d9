"""Elastic resume: finish an epoch on another topology (ranks, workers, batch size)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from h5pack.training.epochs import EpochSpec, plan_pieces, samples_of_batches
from h5pack.training.orders import Order, rest_of

# NOTE [ Elastic resume ]
#
# Under DDP every rank takes the same number of steps, so one rank's state says where all
# are: ``position`` batches (samples for ``ChunkSampler``) of ``epoch``, planned with the
# recorded settings. With another topology (ranks, workers, batch size, window):
# 1. Delivered: replay the saved plan of each old rank and mark the positions of its first
#    ``position`` batches (``delivered_mask``); nothing is read from a file.
# 2. Remaining: each piece's unmarked positions form a sub-piece (``orders.rest_of``).
# 3. Re-plan: ``plan_pieces`` of the sub-pieces with the new spec, mapped back to samples:
#    chunks still split across ranks and workers and read once, every rank the same number
#    of batches, padding or dropping by the new ``drop_last``.
# Every rank computes this from the same state without communication. A re-planned
# epoch's state keeps the one it came from under ``base``, so a second change in the same
# epoch replays both. The next epoch is planned normally.

# Settings that fix the order of an epoch: a state saved with others is refused.
ORDER_SETTINGS = ("shuffle", "seed", "stratified", "sources")

# Settings of the topology: a state saved with others is re-planned.
TOPOLOGY_SETTINGS = ("num_replicas", "num_workers", "batch_size", "window_chunks", "drop_last")


def saved_spec(state: Mapping[str, Any]) -> EpochSpec:
    """Return the topology that planned the saved epoch (rank 0; the order is checked apart)."""
    return EpochSpec(
        batch_size=int(state["batch_size"]),
        shuffle=bool(state["shuffle"]),
        seed=int(state["seed"]),
        window_chunks=None if state["window_chunks"] is None else int(state["window_chunks"]),
        drop_last=bool(state["drop_last"]),
        num_replicas=int(state["num_replicas"] or 1),
        rank=0,
        num_workers=int(state["num_workers"]),
    )


def plan_rest(
    order: Order, spec: EpochSpec, *, epoch: int, delivered: np.ndarray
) -> list[np.ndarray]:
    """Return one rank's batches of ``epoch``'s positions not yet ``delivered`` (steps 2, 3)."""
    rest = rest_of(order, spec.seed, epoch, delivered)
    return samples_of_batches(rest, plan_pieces(rest, spec, epoch=epoch))


def _positions(
    order: Order, spec: EpochSpec, *, epoch: int, delivered: np.ndarray | None
) -> list[np.ndarray]:
    """Return one rank's batches as positions of the whole epoch (for ``delivered_mask``)."""
    if delivered is None:
        return plan_pieces(order.epoch(spec.seed, epoch), spec, epoch=epoch)
    rest = rest_of(order, spec.seed, epoch, delivered)
    return [rest.top_positions(b) for b in plan_pieces(rest, spec, epoch=epoch)]


def delivered_mask(order: Order, state: Mapping[str, Any]) -> np.ndarray:
    """Return one bool per position: delivered by every old rank before ``state`` (step 1)."""
    base = state.get("base")
    before = delivered_mask(order, base) if base else None
    spec = saved_spec(state)
    epoch, position = int(state["epoch"]), int(state["position"])
    samples = state.get("unit", "batches") == "samples"
    mask = np.zeros(order.num_samples, dtype=bool) if before is None else before.copy()
    if position == 0:
        return mask  # nothing delivered since ``base``: no plan to replay
    for rank in range(spec.num_replicas or 1):
        batches = _positions(order, replace(spec, rank=rank), epoch=epoch, delivered=before)
        if not batches:
            continue
        if samples:
            mask[np.concatenate(batches)[:position]] = True
        else:
            mask[np.concatenate(batches[:position])] = True
    return mask
