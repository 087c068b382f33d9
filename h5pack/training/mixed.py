"""``H5MixDataset``: several sources as one map-style dataset, for a weighted mix (issue 18).

Each source is read by its own ``H5ImageDataset`` (reader, pipeline and decoded cache), so
sources may differ in mode, storage and image size; global index ``offsets[s] + i`` is
source s's sample i, with labels joined (``read.mixture``). ``WeightedMix`` is the order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from typing_extensions import Self

from h5pack.core.fields import KEY, fields_of
from h5pack.core.layout import checked_indices
from h5pack.core.vocabulary import Output
from h5pack.errors import OptionsError
from h5pack.read.crop import CropSpec
from h5pack.read.mixture import ClassJoin, MixView, check_fields, describe_mix
from h5pack.read.packset import PackSource
from h5pack.read.pool import ReadPool, start_loads
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.batch import SampleBatch, batch_labels
from h5pack.training.cache import CacheSpec, DecodedCache, default_cache_bytes
from h5pack.training.mapstyle import H5ImageDataset, check_delivery
from h5pack.training.mixing import label_mixing
from h5pack.training.ring import batch_buffer
from h5pack.training.weighted import check_weights

# Seeds of the sources' crops and flips: source s draws from seed + s * _SEED_STEP.
_SEED_STEP = 1_000_003


class H5MixDataset(H5ImageDataset):
    """Several sources as one dataset: ``H5ImageDataset(sources, weights=...)`` builds one.

    Args:
        sources: Packs, pack sets (directory or manifest), lists of packs.
        weights: One positive weight per source: its share of every epoch.
        classes: ``"join"`` (one class per name), ``"separate"`` (``"source/class"``), or
            the list of class names (``read.mixture.joined_classes``).
        return_source: Also return each sample's source (its position in ``sources``).
        cache: A ``CacheSpec``: one decoded cache per encoded source, the budget split by
            sample counts.

    The other arguments are ``H5ImageDataset``'s, for every source; fields are joined by
    name (``check_fields``).
    """

    def __init__(
        self,
        sources: Sequence[PackSource],
        *,
        weights: Sequence[float] | None = None,
        classes: ClassJoin | None = None,
        return_source: bool = False,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        output: Output = "tensor",
        return_path: bool = False,
        reader: ReaderOptions | None = None,
        pipeline: CropSpec | None = None,
        cache: CacheSpec | DecodedCache | None = None,
        seed: int = 0,
        fields: Sequence[str] | None = None,
    ) -> None:
        if isinstance(cache, DecodedCache):
            raise OptionsError(
                "a mix keeps one decoded cache per source: give a CacheSpec "
                "(make_loader(cache='decoded'))"
            )
        check_delivery(output, cache, pipeline, seed)
        self.options = reader or ReaderOptions()
        self.mix: MixView = describe_mix(
            sources,
            classes=classes or "join",
            locking=self.options.locking,
            store_for=self.options.store_for,
        )
        num = len(self.mix.views)
        self.weights = check_weights([1.0] * num if weights is None else weights, num)
        self.source = self.mix.sources  # type: ignore[assignment]  # several sources
        self.names = self.mix.names
        self.path = self.mix.meta.path
        self.meta = self.mix.meta
        self.chunk_map = self.mix.chunk_map
        self.group_bytes = self.mix.group_bytes
        self.compressed = any(v.compressed for v in self.mix.views)
        check_fields(self.mix, fields)
        self._deliver(transform, target_transform, output, return_path, fields, pipeline, seed)
        self.return_source = return_source
        self.cache = None
        self.parts = [
            H5ImageDataset(
                source,
                transform=transform,
                output=output,
                return_path=return_path,
                reader=self.options,
                pipeline=pipeline,
                seed=seed + s * _SEED_STEP,
            )
            for s, source in enumerate(self.mix.sources)
        ]
        self._share_pool()
        if cache is not None:  # one cache per encoded source, the budget split by samples
            budget = default_cache_bytes() if cache.cache_bytes is None else cache.cache_bytes
            encoded = [p for p in self.parts if p.meta.mode == "encoded"]
            total = sum(p.meta.num_samples for p in encoded)
            for part in encoded:
                share = max(1, budget * part.meta.num_samples // max(1, total))
                part.cache = DecodedCache(
                    max(1, part.meta.num_samples), share, max_side=cache.cache_max_side
                )

    def _plan_sources(self) -> None:
        """Give each source that reads by a plan its part of this worker's, before any load."""
        if self.planner is None:
            return
        readers = [(s, part.reader) for s, part in enumerate(self.parts)]
        planned = [(s, reader) for s, reader in readers if reader.plans_reads]
        plan = self._worker_plan() if planned else None
        if plan is None:
            return
        offsets = self.offsets
        for s, reader in planned:
            reader.plan_reads(plan.restricted(int(offsets[s]), int(offsets[s + 1])))

    def _share_pool(self) -> None:
        """Give every source the same reading threads (NOTE [ One pool for a mix's sources ])."""
        threads = self.options.threads or 0
        self.pool = ReadPool(threads) if threads > 1 else None
        for part in self.parts:
            part.pool = self.pool

    @property
    def offsets(self) -> np.ndarray:
        """Global index of each source's first sample, and the total."""
        return self.mix.offsets

    @property
    def caches(self) -> list[DecodedCache]:
        """The sources' decoded caches."""
        return [p.cache for p in self.parts if p.cache is not None]

    def configured(self, options: ReaderOptions, *, seed: int | None = None) -> Self:
        """Return a copy that reads every source with ``options`` (this one is unchanged)."""
        twin = super().configured(options, seed=seed)
        twin.parts = [
            part.configured(options, seed=twin.seed + s * _SEED_STEP)
            for s, part in enumerate(self.parts)
        ]
        twin._share_pool()
        return twin

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the random crops and flips, in every source."""
        self._epoch.value = epoch
        for part in self.parts:
            part.set_epoch(epoch)

    @property
    def reader(self) -> Any:
        """Not one reader: each source has its own (``parts[s].reader``)."""
        raise OptionsError("a mix has one reader per source: use dataset.parts[s].reader")

    def close(self) -> None:
        """Close every source's reader, and their shared threads."""
        for part in self.parts:
            part.close()
        if self.pool is not None:
            self.pool.close()

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """Return the samples ``indices``, each source's read by that source's dataset."""
        idx = checked_indices(indices, self.meta.num_samples, "a mix")
        src = self.mix.source_of(idx)
        runs = self._runs(idx, src)
        self._plan_sources()
        # NOTE [ One pool for a mix's sources ]: every source's missing chunks at once, on
        # the shared threads, while this thread does the batch's own work below
        loading = None
        if self.pool is not None:
            readers = [
                (self.parts[s].reader, local) for s, _, local in runs if self.parts[s].cache is None
            ]
            loads = [(reader, local) for reader, local in readers if isinstance(reader, PackReader)]
            loading = start_loads(self.pool, loads)
        labels, label_tensor = batch_labels(self.meta.labels[idx], self.target_transform)
        sources = torch.from_numpy(src.astype(np.int64)) if self.return_source else None
        shape = self._batch_shape()
        buffer = None if shape is None else batch_buffer(self.ring, (idx.size, *shape))
        if loading is not None:
            # every source's chunks before any source is read: a source's copies, run while
            # the next source's chunks decompress, took a core from them (2 cores: slower)
            loading.finish()
        paths: list[str] | None = None
        if self.return_path or (self.fields is not None and KEY in self.fields):
            offsets = self.offsets
            paths = [
                self.parts[s].reader.paths[int(i - offsets[s])]
                for s, i in zip(src.tolist(), idx.tolist(), strict=True)
            ]
        batch = self._mixed_images(idx, runs, labels, label_tensor, paths, sources, buffer)
        if self.fields is not None:
            batch.fields = self.fields
            batch.kinds = {f.name: f for f in fields_of(self.meta)}
            for s, where, local in runs:
                for name, values in self.parts[s].field_values(local, self.fields).items():
                    found = batch.values.setdefault(name, [None] * idx.size)
                    positions = range(idx.size)[where] if isinstance(where, slice) else where
                    for j, value in zip(list(positions), values, strict=True):
                        found[int(j)] = value
        return batch

    def _mixed_images(
        self,
        idx: np.ndarray,
        runs: list[tuple[int, slice | np.ndarray, np.ndarray]],
        labels: list[Any],
        label_tensor: torch.Tensor | None,
        paths: list[str] | None,
        sources: torch.Tensor | None,
        buffer: torch.Tensor | None,
    ) -> SampleBatch:
        """The images of a mix's batch, each source's read by that source's dataset."""
        shape = self._batch_shape()
        if buffer is not None:
            assert shape is not None  # the buffer is made for it
            target = buffer.numpy()
            for s, where, local in runs:
                if isinstance(where, slice):  # a run: read into its slice
                    self.parts[s].read_batch_into(local, target[where])
                else:
                    part = np.empty((local.size, *shape), dtype=np.uint8)
                    self.parts[s].read_batch_into(local, part)
                    target[where] = part
            images = buffer.permute(0, 3, 1, 2) if self.output == "tensor" else target
            return SampleBatch(
                images=images,
                labels=label_tensor,
                label_values=labels,
                paths=paths,
                sources=sources,
            )
        samples: list[tuple[Any, ...]] = [()] * idx.size
        for s, where, local in runs:
            batch = self.parts[s].__getitems__(local.tolist())
            positions = range(idx.size)[where] if isinstance(where, slice) else where.tolist()
            for j, sample in zip(positions, batch, strict=True):
                extra: tuple[Any, ...] = () if paths is None else (paths[j],)
                if sources is not None:
                    extra = (*extra, int(sources[j]))
                samples[j] = (sample[0], labels[j], *extra)
        return SampleBatch(samples, paths=paths, sources=sources)

    def _runs(
        self, idx: np.ndarray, src: np.ndarray
    ) -> list[tuple[int, slice | np.ndarray, np.ndarray]]:
        """Split a batch by source: ``(source, its positions in the batch, its indices)``.

        Positions are a slice when each source is one run (``plan_pieces`` groups them).
        """
        if idx.size == 0:
            return []
        cuts = (np.flatnonzero(src[1:] != src[:-1]) + 1).tolist()
        bounds = [0, *cuts, idx.size]
        firsts = src[bounds[:-1]].tolist()
        local = idx - self.offsets[src]
        if len(set(firsts)) == len(firsts):
            return [
                (s, slice(lo, hi), local[lo:hi])
                for s, lo, hi in zip(firsts, bounds[:-1], bounds[1:], strict=True)
            ]
        runs: list[tuple[int, slice | np.ndarray, np.ndarray]] = []
        for s in np.unique(src).tolist():
            where = np.flatnonzero(src == s)
            runs.append((s, where, local[where]))
        return runs

    def _batch_shape(self) -> tuple[int, int, int] | None:
        """(H, W, C) every source batches its images at, or None if they do not agree."""
        shapes = {part.batch_shape() for part in self.parts}
        if len(shapes) != 1:
            return None
        return shapes.pop()


H5ImageDataset.mix_class = H5MixDataset  # what H5ImageDataset(weights=...) builds


def unmixed_sources(dataset: H5MixDataset, window_chunks: int) -> list[str]:
    """Return a warning for each source whose chunks do not mix labels (not stratified in a mix)."""
    messages = []
    for name, part in zip(dataset.names, dataset.parts, strict=True):
        report = label_mixing(part.meta, part.chunk_map, window_chunks=window_chunks, search=False)
        if report.chunks_unmixed:
            messages.append(
                f"{name}: its chunks do not mix labels (label mixing {report.figure:.2f}, "
                f"~1 when shuffled at write time), and a mix does not stratify a source's "
                "chunks: its batches may hold few of its classes. Convert it again without "
                "--no-shuffle (the write-time shuffle)"
            )
    return messages
