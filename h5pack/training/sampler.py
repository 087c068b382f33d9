"""Chunk-aware samplers: each chunk decompressed once per epoch, planned by ``training.epochs``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
from torch.utils.data import Sampler

from h5pack.core.format import PackMeta
from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training.elastic import ORDER_SETTINGS, TOPOLOGY_SETTINGS, delivered_mask, plan_rest
from h5pack.training.epochs import DEFAULT_WINDOW_CHUNKS, epoch_spec, num_batches, samples_per_rank
from h5pack.training.epochs import EpochSpec as EpochSpec  # re-exported
from h5pack.training.epochs import plan_epoch as plan_epoch  # re-exported
from h5pack.training.mixing import MixingReport, chunk_strata, label_mixing
from h5pack.training.orders import Order, chunk_order
from h5pack.training.weighted import WeightedMix


@runtime_checkable
class ChunkSource(Protocol):
    """Anything with a pack's ``chunk_map`` and ``group_bytes`` (a dataset, a reader)."""

    chunk_map: ChunkMap
    group_bytes: int


SamplerSource: TypeAlias = (
    "ChunkMap | ChunkSource | MixedSources | str | os.PathLike[str] "
    "| Sequence[str | os.PathLike[str]]"
)


@dataclass(frozen=True)
class MixedSources:
    """Several sources mixed by weight: each one's chunks, and the weights the data carries."""

    chunk_maps: tuple[ChunkMap, ...]
    weights: tuple[float, ...] | None = None


def resolve_data(
    source: SamplerSource, *, mixed: bool = False
) -> tuple[ChunkMap, int | None, PackMeta | None, MixedSources | None]:
    """Return ``(chunk map, bytes per chunk, metadata, mix)``; with ``mixed`` a list is a mix."""
    from h5pack.read.packset import concatenated_map, describe

    if isinstance(source, MixedSources):
        return concatenated_map(source.chunk_maps), None, None, source
    if isinstance(source, ChunkMap):
        return source, None, None, None
    if isinstance(source, ChunkSource):  # a dataset or reader; an H5MixDataset has ``mix``
        meta, mix = getattr(source, "meta", None), getattr(source, "mix", None)
        weights = getattr(source, "weights", None)
        mixed_sources = None if mix is None else MixedSources(mix.chunk_maps, weights)
        meta = meta if isinstance(meta, PackMeta) else None
        return source.chunk_map, int(source.group_bytes), meta, mixed_sources
    from h5pack.core.store import open_store

    if mixed and isinstance(source, Sequence) and not isinstance(source, str):
        from h5pack.read.mixture import describe_mix

        view = describe_mix(source, store_for=open_store)
        return view.chunk_map, view.group_bytes, view.meta, MixedSources(view.chunk_maps)
    if isinstance(source, str | os.PathLike | Sequence):  # a pack, a set, a list: one pool
        one = describe(source, store=open_store(source))
        return one.chunk_map, one.group_bytes, one.meta, None
    raise OptionsError(
        "the sampler's source should be a ChunkMap, a dataset or reader with .chunk_map, a "
        f"pack path, a pack set or a list of packs, but got {type(source).__name__}"
    )


def order_for(chunk_map: ChunkMap, spec: EpochSpec, mix: MixedSources | None) -> Order:
    """Return a sampler's order: a weighted mix of ``mix``, else ``spec``'s chunk order.

    The weights are ``spec.weights``, else those the data carries, else each source's size.
    """
    if mix is None:
        if spec.weights is not None or spec.epoch_samples is not None:
            raise OptionsError(
                "weights= and epoch_samples= mix several sources: give a list of "
                "sources (packs, pack sets) with weights=, or an H5MixDataset"
            )
        return chunk_order(chunk_map, shuffle=spec.shuffle, chunk_strata=spec.chunk_strata)
    weights = spec.weights or mix.weights
    if weights is None:
        weights = tuple(float(c.num_samples) for c in mix.chunk_maps)
    return WeightedMix(
        mix.chunk_maps, tuple(weights), epoch_samples=spec.epoch_samples, shuffle=spec.shuffle
    )


# Settings added to the state later, as states saved before read.
_SETTINGS_BEFORE: dict[str, Any] = {"stratified": False, "sources": None}


class _Planned:
    """What both samplers share: the epoch's plan, the position reached (in ``unit``s), state."""

    unit = "batches"

    def __init__(self, source: SamplerSource, spec: EpochSpec) -> None:
        chunk_map, group_bytes, meta, mix = resolve_data(source, mixed=spec.weights is not None)
        self.spec = spec.resolved(group_bytes, chunk_map=chunk_map)
        self.chunk_map, self._meta = chunk_map, meta
        self.order: Order = order_for(chunk_map, self.spec, mix)
        self.epoch = 0
        self._position = 0  # units of ``epoch`` already handed out
        self._resume = 0  # where the next iteration starts (set by load_state_dict)
        self._fingerprint: str | None = None
        # Elastic resume (training/elastic.py): the state this epoch was re-planned from,
        # and the samples it had delivered; the iteration that starts from it consumes it.
        self._base: dict[str, Any] | None = None
        self._delivered: np.ndarray | None = None
        self._base_fresh = False

    @property
    def window_chunks(self) -> int:
        """K, the chunks one worker mixes (and its reader keeps decompressed) at once."""
        return self.spec.window_chunks or DEFAULT_WINDOW_CHUNKS

    @property
    def resume_position(self) -> int:
        """Units the next iteration skips: a resumed position, else 0."""
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
        return num if self._delivered is None else num - int(self._delivered.sum())

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """Return this rank's batches of ``epoch`` (default: the current one, resumed)."""
        if self._delivered is not None and epoch in (None, self.epoch):
            return plan_rest(self.order, self.spec, epoch=self.epoch, delivered=self._delivered)
        return plan_epoch(self.order, self.spec, epoch=self.epoch if epoch is None else epoch)

    def _serve(self, items: Sequence[Any] | np.ndarray) -> Iterator[Any]:
        start, self._resume = self._resume, 0
        self._position = start
        for position in range(start, len(items)):
            self._position = position + 1
            yield items[position]

    def _planned(self) -> list[np.ndarray]:
        # a re-planned epoch is served once, then the whole again
        if not self._base_fresh:
            self._drop_base()
        self._base_fresh = False
        return self.plan()

    def _drop_base(self) -> None:
        self._base = self._delivered = None
        self._base_fresh = False

    @property
    def fingerprint(self) -> str | None:
        """A digest of the data (``core.packset.meta_digest``), or None for a bare ChunkMap."""
        if self._fingerprint is None and self._meta is not None:
            from h5pack.core.packset import meta_digest

            self._fingerprint = meta_digest(self._meta)
        return self._fingerprint

    def state_dict(self, *, position: int | None = None) -> dict[str, Any]:
        """Return the resumable state: epoch, ``position`` (units consumed), the settings.

        ``position`` defaults to the units handed out, ahead of training by the prefetch.
        """
        state = {
            "epoch": self.epoch,
            "position": self._position if position is None else int(position),
            "unit": self.unit,
            **self._settings(),
            "fingerprint": self.fingerprint,
        }
        if isinstance(self.order, WeightedMix):  # where each source stands (NOTE [ Weighted mix ])
            state["source_positions"] = [asdict(w) for w in self.order.positions(self.epoch)]
        if self._base is not None:
            state["base"] = self._base
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the rest of the saved epoch.

        The same topology continues the saved order; another re-plans the samples not yet
        delivered (``training.elastic``). A state of other data or another order is refused.
        """
        saved = {**_SETTINGS_BEFORE, "unit": self.unit, **state}  # older states: old behaviour
        now = self._settings()
        checked: tuple[str, ...] = ("num_samples", "num_chunks")
        if saved.get("fingerprint") is not None and self._meta is not None:
            checked, now["fingerprint"] = (*checked, "fingerprint"), self.fingerprint

        def differ(keys: Iterable[str]) -> str:
            return ", ".join(
                f"{k}: saved {saved.get(k)!r}, now {now[k]!r}"
                for k in keys
                if saved.get(k) != now[k]
            )

        if details := differ(checked):
            raise OptionsError(
                f"the sampler state was saved on other data ({details}); load it into a "
                "loader of the same pack or pack set"
            )
        if details := differ(ORDER_SETTINGS):
            raise OptionsError(f"the sampler state does not match this sampler ({details})")
        self.epoch = int(saved["epoch"])
        self._drop_base()
        same = saved["unit"] == self.unit and not differ(TOPOLOGY_SETTINGS)
        # the same plan continues where it stopped; another re-plans what was not delivered
        base = saved.get("base") if same else {k: v for k, v in saved.items() if k != "fingerprint"}
        if base:
            self._base = dict(base)
            self._delivered = delivered_mask(self.order, base)
            self._base_fresh = True
        self._position = self._resume = int(saved["position"]) if same else 0

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


class ChunkBatchSampler(_Planned, Sampler[list[int]]):
    """Yield batches of sample indices that read each chunk once per epoch.

    The order is a pure function of ``(seed, epoch)`` (note "Chunk-aware epoch order" in
    ``training.epochs``). Pass the DataLoader's ``num_workers`` so that each worker reads its
    own windows; ranks come from ``torch.distributed`` unless given.

    Args:
        source: A ``ChunkMap``, a dataset or reader, a pack path, a pack set or a list of
            packs; with ``weights``, a list of sources or an ``H5MixDataset``.
        spec: An ``EpochSpec``, or just its ``batch_size``.
        **fields: Fields of ``EpochSpec`` replacing the spec's.

    Example:
        >>> sampler = ChunkBatchSampler(ChunkMap.regular(10, 4), batch_size=4, seed=0)
        >>> sampler.set_epoch(3)
        >>> batches = list(sampler)
        >>> len(sampler), sorted(i for b in batches for i in b) == list(range(10))
        (3, True)
        >>> batches == list(sampler)   # same (seed, epoch): same order
        True
    """

    def __init__(
        self, source: SamplerSource, spec: EpochSpec | int | None = None, /, **fields: Any
    ) -> None:
        super().__init__(source, epoch_spec(spec, **fields))

    def __len__(self) -> int:
        spec = self.spec
        return num_batches(
            self.pool_samples,
            spec.batch_size,
            num_replicas=spec.num_replicas or 1,
            drop_last=spec.drop_last,
        )

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self._serve(self._planned()):
            yield batch.tolist()


class ChunkSampler(_Planned, Sampler[int]):
    """Yield sample indices in chunk-aware order: ``ChunkBatchSampler``'s batches end to end.

    Give ``spec`` the DataLoader's ``batch_size`` and ``num_workers``; ``position`` counts
    samples.
    """

    unit = "samples"

    def __init__(self, source: SamplerSource, spec: EpochSpec | None = None) -> None:
        super().__init__(source, spec or EpochSpec(batch_size=1))

    def __len__(self) -> int:
        return samples_per_rank(self.pool_samples, self.spec)

    def __iter__(self) -> Iterator[int]:
        batches = self._planned()
        order = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
        for index in self._serve(order):
            yield int(index)


def sampler_for_labels(
    source: SamplerSource, spec: EpochSpec, labels: PackMeta | np.ndarray
) -> tuple[ChunkBatchSampler, MixingReport | None]:
    """Return a sampler that copes with chunks that do not mix labels, and the measure.

    Unmixed chunks (``mixing.label_mixing``) get a chunk order stratified by dominant label
    and a default window widened until windows mix; the caller warns with the report's
    ``message``. The report is None with ``shuffle=False`` or a mix.

    Example:
        >>> in_order = np.repeat(np.arange(64), 64)     # 64 classes written one after another
        >>> cmap, spec = ChunkMap.regular(4096, 16), EpochSpec(batch_size=4)
        >>> sampler, report = sampler_for_labels(cmap, spec, in_order)
        >>> sampler.window_chunks, sampler.spec.chunk_strata is not None, report.window_unmixed
        (64, True, False)
    """
    sampler = ChunkBatchSampler(source, spec)
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
        spec = replace(spec, chunk_strata=tuple(int(s) for s in chunk_strata(values, cmap)))
        sampler = ChunkBatchSampler(source, spec)
        report = label_mixing(labels, cmap, window_chunks=window, stratified=True)
    needed = report.window_needed
    if report.window_unmixed and spec.window_chunks is None and needed and needed > window:
        wider = replace(spec, min_window_chunks=max(needed, spec.min_window_chunks or 1))
        sampler = ChunkBatchSampler(source, wider)
        if sampler.window_chunks != window:
            report = label_mixing(
                labels, cmap, window_chunks=sampler.window_chunks, stratified=True
            )
    return sampler, report
