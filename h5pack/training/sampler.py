"""Chunk-aware samplers: random enough for SGD, each chunk decompressed once per epoch.

An epoch is planned by ``training.epochs`` (see its notes "Chunk-aware epoch order" and
"Shuffle window"), whose names this module re-exports (``EpochSpec``, ``plan_epoch``...).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
from torch.utils.data import Sampler

from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training.elastic import ORDER_SETTINGS, TOPOLOGY_SETTINGS, delivered_mask, plan_rest
from h5pack.training.epochs import DEFAULT_WINDOW_BYTES as DEFAULT_WINDOW_BYTES  # re-exported
from h5pack.training.epochs import DEFAULT_WINDOW_CHUNKS as DEFAULT_WINDOW_CHUNKS
from h5pack.training.epochs import MIN_POOL_BATCHES as MIN_POOL_BATCHES
from h5pack.training.epochs import WINDOW_MEMORY_FRACTION as WINDOW_MEMORY_FRACTION
from h5pack.training.epochs import EpochSpec as EpochSpec
from h5pack.training.epochs import distributed_defaults as distributed_defaults
from h5pack.training.epochs import epoch_spec as epoch_spec
from h5pack.training.epochs import num_batches as num_batches
from h5pack.training.epochs import order_of as order_of
from h5pack.training.epochs import plan_epoch as plan_epoch
from h5pack.training.epochs import plan_pieces as plan_pieces
from h5pack.training.epochs import samples_per_rank as samples_per_rank
from h5pack.training.epochs import window_for as window_for
from h5pack.training.mixing import MixingReport, chunk_strata, label_mixing
from h5pack.training.orders import Order
from h5pack.training.weighted import WeightedMix


@runtime_checkable
class ChunkSource(Protocol):
    """Anything that knows a pack's chunk map and bytes per chunk (a dataset, a reader)."""

    @property
    def chunk_map(self) -> ChunkMap:
        """Which samples live in which chunk."""
        ...

    @property
    def group_bytes(self) -> int:
        """Bytes of one decompressed chunk (read group)."""
        ...


SamplerSource: TypeAlias = (
    "ChunkMap | ChunkSource | MixedSources | str | os.PathLike[str] "
    "| Sequence[str | os.PathLike[str]]"
)


@dataclass(frozen=True)
class MixedSources:
    """What the sampler needs of several sources mixed by weight.

    Attributes:
        chunk_maps: Each source's chunks, in its own indices.
        weights: The weights the data carries (an ``H5MixDataset``'s), or None.
    """

    chunk_maps: tuple[ChunkMap, ...]
    weights: tuple[float, ...] | None = None


def resolve_data(
    source: SamplerSource, *, mixed: bool = False
) -> tuple[ChunkMap, int | None, PackMeta | None, MixedSources | None]:
    """Return ``(chunk map, bytes per chunk or None, metadata or None, mix or None)``.

    With ``mixed``, a list is a list of sources to mix (``read.mixture``), not one pool.
    """
    if isinstance(source, MixedSources):
        starts = [np.zeros(1, dtype=np.int64)]
        at = 0
        for cmap in source.chunk_maps:
            starts.append(cmap.starts[1:] + at)
            at += cmap.num_samples
        return ChunkMap(np.concatenate(starts)), None, None, source
    mix = getattr(source, "mix", None)
    if mix is not None and isinstance(source, ChunkSource):  # an H5MixDataset
        meta = getattr(source, "meta", None)
        return (
            source.chunk_map,
            int(source.group_bytes),
            meta if isinstance(meta, PackMeta) else None,
            MixedSources(mix.chunk_maps, getattr(source, "weights", None)),
        )
    if isinstance(source, ChunkMap):
        return source, None, None, None
    if isinstance(source, ChunkSource):
        meta = getattr(source, "meta", None)
        return (
            source.chunk_map,
            int(source.group_bytes),
            meta if isinstance(meta, PackMeta) else None,
            None,
        )
    if mixed and isinstance(source, Sequence) and not isinstance(source, str):
        from h5pack.core.store import open_store
        from h5pack.read.mixture import describe_mix

        view = describe_mix(source, store_for=open_store)
        return view.chunk_map, view.group_bytes, view.meta, MixedSources(view.chunk_maps)
    if isinstance(source, str | os.PathLike | Sequence):
        # a pack, a pack set (directory or manifest) or a list of packs: one pool of chunks
        from h5pack.core.store import open_store
        from h5pack.read.packset import describe

        one = describe(source, store=open_store(source))  # a sampler is a public edge
        return one.chunk_map, one.group_bytes, one.meta, None
    raise OptionsError(
        "the sampler's source should be a ChunkMap, a dataset or reader with .chunk_map, a "
        f"pack path, a pack set or a list of packs, but got {type(source).__name__}"
    )


def order_for(chunk_map: ChunkMap, spec: EpochSpec, mix: MixedSources | None) -> Order:
    """Return the order of a sampler: a weighted mix of ``mix``, else ``order_of``.

    The weights are ``spec.weights``, else those the data carries, else each source's size.

    Raises:
        OptionsError: ``weights`` or ``epoch_samples`` without several sources.
    """
    if mix is None:
        if spec.weights is not None or spec.epoch_samples is not None:
            raise OptionsError(
                "weights= and epoch_samples= mix several sources: give a list of "
                "sources (packs, pack sets) with weights=, or an H5MixDataset"
            )
        return order_of(chunk_map, spec)
    weights = spec.weights or mix.weights
    if weights is None:
        weights = tuple(float(c.num_samples) for c in mix.chunk_maps)
    return WeightedMix(
        mix.chunk_maps,
        tuple(weights),
        epoch_samples=spec.epoch_samples,
        shuffle=spec.shuffle,
    )


def resolve_source(source: SamplerSource) -> tuple[ChunkMap, int | None]:
    """Return ``(chunk map, bytes per chunk or None)`` of a source.

    The source is a ``ChunkMap``, a dataset or reader, a pack, a pack set (its directory or
    manifest) or a list of packs (one pool of all their chunks).
    """
    chunk_map, size, _, _ = resolve_data(source)
    return chunk_map, size


# Settings added to ``ChunkBatchSampler.state_dict`` later, as states saved before read.
_SETTINGS_BEFORE: dict[str, Any] = {"stratified": False, "sources": None}


class ChunkBatchSampler(Sampler[list[int]]):
    """Yield batches of sample indices that read each chunk once per epoch.

    Per epoch the chunk order is shuffled as a pure function of ``(seed, epoch)``; windows
    of K chunks are mixed and cut into batches. Pass the DataLoader's ``num_workers`` so that
    each worker gets its own windows (the DataLoader hands batch b to worker b mod W), and
    ``num_replicas``/``rank`` (taken from ``torch.distributed`` when initialised) to split
    chunks across ranks with the same number of batches on every rank; padding and dropping
    are described in the module note "Chunk-aware epoch order".

    Args:
        source: A ``ChunkMap``, a dataset or reader (anything with ``chunk_map`` and
            ``group_bytes``), or a pack path.
        spec: How epochs are cut: an ``EpochSpec``, or just its ``batch_size``.
        **fields: Fields of ``EpochSpec`` (``batch_size``, ``shuffle``, ``seed``,
            ``window_chunks``, ``num_workers``, ...): the spec's, replaced by these. The
            fields are listed, documented and checked once, on ``EpochSpec``. With
            ``weights`` (a mix) ``source`` is a list of sources or an ``H5MixDataset``
            (``training.weighted``).

    Raises:
        OptionsError: no batch size, or a field out of range (``EpochSpec``'s check).

    Example:
        >>> cmap = ChunkMap.regular(10, 4)
        >>> sampler = ChunkBatchSampler(cmap, batch_size=4, seed=0)
        >>> sampler.set_epoch(3)
        >>> batches = list(sampler)
        >>> len(sampler), sorted(i for b in batches for i in b) == list(range(10))
        (3, True)
        >>> batches == list(sampler)   # same (seed, epoch): same order
        True
        >>> whole = ChunkBatchSampler(cmap, EpochSpec(batch_size=4, seed=0))  # the spec whole
        >>> whole.set_epoch(3)
        >>> list(whole) == batches
        True
    """

    def __init__(
        self, source: SamplerSource, spec: EpochSpec | int | None = None, /, **fields: Any
    ) -> None:
        self._start(source, epoch_spec(spec, **fields))

    @classmethod
    def from_spec(cls, source: SamplerSource, spec: EpochSpec) -> ChunkBatchSampler:
        """Return a sampler of ``source`` cut by ``spec`` (what ``make_loader`` builds)."""
        sampler = cls.__new__(cls)
        sampler._start(source, spec)
        return sampler

    @classmethod
    def of_order(
        cls, chunk_map: ChunkMap, spec: EpochSpec, order: Order, *, meta: PackMeta | None = None
    ) -> ChunkBatchSampler:
        """Return a sampler of ``order`` cut by ``spec`` exactly as given (window resolved).

        What ``H5IterableDataset`` keeps its state with: its own spec and order, not those
        this class would derive from the data. ``meta``: the data's, for the fingerprint.
        """
        sampler = cls.__new__(cls)
        sampler._begin(chunk_map, spec, order, meta)
        return sampler

    def _start(self, source: SamplerSource, spec: EpochSpec) -> None:
        chunk_map, group_bytes, meta, mix = resolve_data(source, mixed=spec.weights is not None)
        spec = spec.resolved(group_bytes, chunk_map=chunk_map)
        self._begin(chunk_map, spec, order_for(chunk_map, spec, mix), meta)

    def _begin(
        self, chunk_map: ChunkMap, spec: EpochSpec, order: Order, meta: PackMeta | None
    ) -> None:
        self.chunk_map, self._meta, self.spec = chunk_map, meta, spec
        self.order: Order = order
        self.epoch = 0
        self._position = 0  # batches of ``epoch`` already handed out
        self._resume = 0  # where the next iteration starts (set by load_state_dict)
        self._fingerprint: str | None = None
        # Elastic resume (training/elastic.py): the state this epoch was re-planned from,
        # and the samples it had delivered; the iteration that starts from it consumes it.
        self._base: dict[str, Any] | None = None
        self._delivered: np.ndarray | None = None
        self._base_fresh = False

    @property
    def window_chunks(self) -> int:
        """K, the chunks mixed at once by one worker.

        Also the window of decompressed chunks (first in, first out) that the worker's reader
        needs to decompress each chunk once per epoch (``ReaderOptions(window_chunks=K)``).
        """
        return self.spec.window_chunks or DEFAULT_WINDOW_CHUNKS

    @property
    def resume_position(self) -> int:
        """Batches the next iteration skips: a resumed position, else 0."""
        return self._resume

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (a resumed position of that epoch is kept)."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._position = self._resume = 0
            self._drop_base()

    @property
    def pool_samples(self) -> int:
        """Samples the current epoch plans: all, or those left by an elastic resume."""
        num = self.order.num_samples
        if self._delivered is not None:
            num -= int(self._delivered.sum())
        return num

    def __len__(self) -> int:
        return num_batches(
            self.pool_samples,
            self.spec.batch_size,
            num_replicas=self.spec.num_replicas or 1,
            drop_last=self.spec.drop_last,
        )

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """Return this rank's whole batch order of ``epoch`` (default: the current one).

        After an elastic ``load_state_dict``, the current epoch's order is that of the
        samples the saved topology had not delivered (see ``training.elastic``).
        """
        if self._delivered is not None and epoch in (None, self.epoch):
            return plan_rest(self.order, self.spec, epoch=self.epoch, delivered=self._delivered)
        return plan_epoch(self.order, self.spec, epoch=self.epoch if epoch is None else epoch)

    def __iter__(self) -> Iterator[list[int]]:
        if not self._base_fresh:  # a re-planned epoch is served once, then the whole again
            self._drop_base()
        self._base_fresh = False
        batches = self.plan()
        start, self._resume = self._resume, 0
        self._position = start
        for position in range(start, len(batches)):
            self._position = position + 1
            yield batches[position].tolist()

    def _drop_base(self) -> None:
        self._base = self._delivered = None
        self._base_fresh = False

    @property
    def fingerprint(self) -> str | None:
        """A digest of the data (``core.packset.meta_digest``), or None for a bare ChunkMap.

        Recorded in the state: a state saved on other data is refused.
        """
        if self._fingerprint is None and self._meta is not None:
            from h5pack.core.packset import meta_digest

            self._fingerprint = meta_digest(self._meta)
        return self._fingerprint

    def state_dict(self, *, position: int | None = None) -> dict[str, Any]:
        """Return the resumable state: epoch, batches consumed, and the settings they assume.

        Args:
            position: Batches of the epoch actually consumed. Default: the batches this
                sampler has handed out, which runs ahead of training by the DataLoader's
                prefetch; the loader from ``make_loader`` passes the delivered count.
        """
        state = {
            "epoch": self.epoch,
            "position": self._position if position is None else int(position),
            "unit": "batches",
            **self._settings(),
            "fingerprint": self.fingerprint,
        }
        if isinstance(self.order, WeightedMix):
            # where every source stands this epoch (its pass, cycle and place in it): derived
            # from the epoch, recorded so that a state says it (see the note "Weighted mix")
            state["source_positions"] = [
                asdict(where) for where in self.order.positions(self.epoch)
            ]
        if self._base is not None:
            state["base"] = self._base
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the rest of the saved epoch.

        A state saved with the same ranks, workers, batch size and window resumes the
        saved order where it stopped (on any rank: under DistributedDataParallel every rank
        is at the same step). A state saved with another topology is elastic: the samples
        the saved ranks had not delivered are planned over this sampler's ranks and workers
        (see ``training.elastic``), so the epoch still serves every sample once.

        Raises:
            OptionsError: the state was saved on other data, or with another order (shuffle,
                seed, stratification).
        """
        self._load(state, unit="batches")

    def _load(self, state: Mapping[str, Any], *, unit: str) -> bool:
        """Load ``state``; return whether it was re-planned (another topology)."""
        # a state saved before a setting existed has that setting's old behaviour
        saved = {**_SETTINGS_BEFORE, "unit": unit, **state}
        settings = self._settings()
        data = {
            key: (saved.get(key), settings[key])
            for key in ("num_samples", "num_chunks")
            if saved.get(key) != settings[key]
        }
        fingerprint = saved.get("fingerprint")
        if fingerprint is not None and self._meta is not None and fingerprint != self.fingerprint:
            data["fingerprint"] = (fingerprint, self.fingerprint)
        if data:
            details = ", ".join(f"{k}: saved {s!r}, now {n!r}" for k, (s, n) in data.items())
            raise OptionsError(
                f"the sampler state was saved on other data ({details}); load it into a "
                "loader of the same pack or pack set"
            )
        mismatched = {
            key: (saved.get(key), settings[key])
            for key in ORDER_SETTINGS
            if saved.get(key) != settings[key]
        }
        if mismatched:
            details = ", ".join(f"{k}: saved {s!r}, now {n!r}" for k, (s, n) in mismatched.items())
            raise OptionsError(f"the sampler state does not match this sampler ({details})")
        self.epoch = int(saved["epoch"])
        self._drop_base()
        same = saved["unit"] == unit and all(
            saved.get(key) == settings[key] for key in TOPOLOGY_SETTINGS
        )
        if same:  # the same plan: continue it where it stopped
            base = saved.get("base")
            if base:
                self._base = dict(base)
                self._delivered = delivered_mask(self.order, base)
                self._base_fresh = True
            self._position = self._resume = int(saved["position"])
            return False
        self._base = {k: v for k, v in saved.items() if k != "fingerprint"}
        self._delivered = delivered_mask(self.order, saved)
        self._base_fresh = True
        self._position = self._resume = 0
        return True

    def _settings(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "num_samples": self.chunk_map.num_samples,
            "num_chunks": self.chunk_map.num_chunks,
            "batch_size": spec.batch_size,
            "shuffle": spec.shuffle,
            "seed": spec.seed,
            "window_chunks": spec.window_chunks,
            "drop_last": spec.drop_last,
            "num_replicas": spec.num_replicas,
            "rank": spec.rank,
            "num_workers": spec.num_workers,
            "stratified": spec.chunk_strata is not None,
            "order": self.order.name,
            "sources": self.order.settings() or None,
        }


def sampler_for_labels(
    source: SamplerSource, spec: EpochSpec, labels: PackMeta | np.ndarray
) -> tuple[ChunkBatchSampler, MixingReport | None]:
    """Return a sampler that copes with chunks that do not mix labels, and the measure.

    The labels' mixing (``training.mixing.label_mixing``, see its note "Label mixing") is
    measured on single chunks. When they do not mix (a pack converted without shuffle) the
    chunk order is stratified by each chunk's dominant label, and a window left to the
    defaults is widened to the one whose windows mix (``min_window_chunks``), within the
    memory cap of the note "Shuffle window". The report is of the final windows: when it
    ``warns`` (the chunks do not mix, whether or not the windows now do), the caller warns
    with its ``message``, which says what the loader did and what to do.

    Args:
        source: As for ``ChunkBatchSampler``.
        spec: How epochs are cut.
        labels: The pack's metadata (the message then names the pack), or its labels.

    Returns:
        The sampler, and the mixing report (None with ``shuffle=False``: pack order asked
        for, nothing to check).

    Example:
        >>> in_order = np.repeat(np.arange(64), 64)     # 64 classes written one after another
        >>> cmap, spec = ChunkMap.regular(4096, 16), EpochSpec(batch_size=4)
        >>> ChunkBatchSampler.from_spec(cmap, spec).window_chunks
        16
        >>> sampler, report = sampler_for_labels(cmap, spec, in_order)
        >>> sampler.window_chunks, sampler.spec.chunk_strata is not None, report.window_unmixed
        (64, True, False)
    """
    sampler = ChunkBatchSampler.from_spec(source, spec)
    if not spec.shuffle or isinstance(sampler.order, WeightedMix):
        return sampler, None  # pack order asked for; a mix interleaves its sources itself
    cmap, window = sampler.chunk_map, sampler.window_chunks
    stratified = spec.chunk_strata is not None
    report = label_mixing(
        labels, cmap, window_chunks=window, stratified=stratified, search=stratified
    )
    if not report.warns:  # labels mixed, or none to mix
        return sampler, report
    if not stratified:
        values = labels.labels if isinstance(labels, PackMeta) else labels
        strata = tuple(int(s) for s in chunk_strata(values, cmap))
        spec = replace(spec, chunk_strata=strata)
        sampler = ChunkBatchSampler.from_spec(source, spec)
        report = label_mixing(labels, cmap, window_chunks=window, stratified=True)
    needed = report.window_needed
    if report.window_unmixed and spec.window_chunks is None and needed and needed > window:
        wider = replace(spec, min_window_chunks=max(needed, spec.min_window_chunks or 1))
        sampler = ChunkBatchSampler.from_spec(source, wider)
        if sampler.window_chunks != window:
            report = label_mixing(
                labels, cmap, window_chunks=sampler.window_chunks, stratified=True
            )
    return sampler, report


class ChunkSampler(Sampler[int]):
    """Yield sample indices in chunk-aware order, for a DataLoader that batches them itself.

    The order is ``ChunkBatchSampler``'s batches laid end to end; give ``spec`` the
    DataLoader's ``batch_size`` and ``num_workers`` so that each worker still reads its own
    chunks.

    Args:
        source: As for ``ChunkBatchSampler``.
        spec: How epochs are cut (default: batches of 1, seed 0).

    Example:
        >>> sampler = ChunkSampler(ChunkMap.regular(10, 4), EpochSpec(batch_size=1, seed=0))
        >>> order = list(sampler)
        >>> len(sampler), sorted(order) == list(range(10))
        (10, True)
    """

    def __init__(self, source: SamplerSource, spec: EpochSpec | None = None) -> None:
        self._over(ChunkBatchSampler.from_spec(source, spec or EpochSpec(batch_size=1)))

    @classmethod
    def of_order(
        cls, chunk_map: ChunkMap, spec: EpochSpec, order: Order, *, meta: PackMeta | None = None
    ) -> ChunkSampler:
        """Return a sampler of ``order`` cut by ``spec`` as given (see ``ChunkBatchSampler``)."""
        sampler = cls.__new__(cls)
        sampler._over(ChunkBatchSampler.of_order(chunk_map, spec, order, meta=meta))
        return sampler

    def _over(self, batches: ChunkBatchSampler) -> None:
        self.batches = batches
        self._position = 0  # samples of the epoch already handed out
        self._resume = 0  # where the next iteration starts (set by load_state_dict)

    @property
    def resume_position(self) -> int:
        """Samples of ``batches.plan()`` the next iteration skips: a resumed position, else 0."""
        return self._resume

    @property
    def epoch(self) -> int:
        """The epoch of the next iteration."""
        return self.batches.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (a resumed position of that epoch is kept)."""
        if epoch != self.batches.epoch:
            self._position = self._resume = 0
        self.batches.set_epoch(epoch)

    def __len__(self) -> int:
        return samples_per_rank(self.batches.pool_samples, self.batches.spec)

    @property
    def chunk_map(self) -> ChunkMap:
        """The chunk map being sampled."""
        return self.batches.chunk_map

    def __iter__(self) -> Iterator[int]:
        if not self.batches._base_fresh:  # as ChunkBatchSampler: a re-planned epoch once
            self.batches._drop_base()
        self.batches._base_fresh = False
        batches = self.batches.plan()
        order = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
        start, self._resume = self._resume, 0
        self._position = start
        for position in range(start, len(order)):
            self._position = position + 1
            yield int(order[position])

    def state_dict(self, *, position: int | None = None) -> dict[str, Any]:
        """Return the resumable state (``position`` counts samples); see ``ChunkBatchSampler``."""
        state = self.batches.state_dict()
        state["position"] = self._position if position is None else int(position)
        state["unit"] = "samples"
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the rest of the saved epoch's order.

        Elastic as ``ChunkBatchSampler.load_state_dict``: a state of another topology
        re-plans the samples not yet delivered.
        """
        replanned = self.batches._load(state, unit="samples")
        self._position = self._resume = 0 if replanned else int(state["position"])
