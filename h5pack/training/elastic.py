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

from h5pack.training.epochs import EpochSpec, plan_pieces, samples_of_batches
from h5pack.training.orders import Order, rest_of

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
#    the positions of its first ``position`` batches (``delivered_mask``): positions of the
#    epoch's sequence (training/orders.py, note "Orders"), which are the sample indices for
#    the chunk orders; a weighted mix may hold a sample at several positions. Positions the
#    old ranks repeated as padding are marked once; nothing is read from a file.
# 2. Remaining: the unmarked positions, in canonical order. Each piece's remaining
#    positions are contiguous there, so they form a sub-pool of "sub-pieces" (one per piece
#    that still has positions, ``orders.rest_of``).
# 3. Re-plan: ``plan_pieces`` of the sub-pool with the new spec (new ranks, workers, batch
#    size and window; the same seed and epoch; the order arranges the sub-pieces: the chunk
#    orders apply themselves again, each sub-chunk keeping its chunk's stratum; a mix keeps
#    the served order of the pieces), mapped back to sample indices. Chunks are still
#    split across ranks and workers and read once per epoch, every rank has the same
#    number of batches, and padding or dropping follows the new ``drop_last`` over the
#    remaining samples.
#
# Every rank computes steps 1-3 from the same state, with no communication, and gets the
# same sub-pool: the re-plan is a pure function of (state, data, new spec). The state of a
# re-planned epoch keeps the state it was re-planned from under ``base``, so a second change
# of topology in the same epoch replays both plans (the recursion is as deep as the number
# of changes). The next epoch is planned normally.

# Settings that fix the order of an epoch: a state saved with others is refused, not
# re-planned (it is another order, not another topology).
ORDER_SETTINGS = ("shuffle", "seed", "stratified", "sources")

# Settings of the topology: a state saved with others is re-planned.
TOPOLOGY_SETTINGS = ("num_replicas", "num_workers", "batch_size", "window_chunks", "drop_last")


def saved_spec(state: Mapping[str, Any]) -> EpochSpec:
    """Return the topology that planned the saved epoch (rank 0; the replay fills the rank).

    The order is not in it: the sampler loading the state has checked that its order is
    the saved one (``ORDER_SETTINGS``), and replays with its own.
    """
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
    """Return one rank's batches (sample indices) of ``epoch``'s positions not yet ``delivered``.

    Steps 2 and 3 of the note "Elastic resume": the remaining positions of each piece form
    a sub-piece (``orders.rest_of``), and ``plan_pieces`` plans them with ``spec``.

    Args:
        order: The epoch's order.
        spec: The new topology (resolved: its rank and window are used as they are).
        epoch: The epoch (with ``spec.seed``, the order's seed).
        delivered: One bool per position of the epoch: delivered already.
    """
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
    """Return one bool per position of the epoch: delivered by every old rank before ``state``.

    Step 1 of the note "Elastic resume", through the chain of ``base`` states.
    """
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
