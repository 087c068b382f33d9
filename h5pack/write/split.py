"""A sharded conversion's split of its source, and the (picklable) task of each shard.

NOTE [ One plan for every shard ]: the storage (mode, array or blob, chunk shape, a blob's
chunk bytes) is planned once from the whole source, so that every shard of a set has the
same storage (readers and ``merge`` need it): image sizes are probed over all samples,
chunk rows are sized for the largest shard, a blob's chunk from the first files of the
global write order.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from h5pack.core.fields import LEGACY_FIELDS, Field, StoredField
from h5pack.core.format import SkippedFile
from h5pack.core.packset import ShardIdentity, shard_name, slice_fingerprint
from h5pack.write.builder import SampleTable
from h5pack.write.leftovers import describe_removed, remove_leftovers
from h5pack.write.options import ConvertOptions
from h5pack.write.packing import rejecter
from h5pack.write.plan import ESTIMATE_SAMPLES, StoragePlan, plan_storage
from h5pack.write.report import ConvertEvent
from h5pack.write.scan import group_problems, name_paths
from h5pack.write.sources import Sample, SampleSource
from h5pack.write.sources.base import FileRange, image_bytes

logger = logging.getLogger("h5pack")

if TYPE_CHECKING:
    from h5pack.write.remote import RemoteSet, RemoteShard


@dataclass(frozen=True, kw_only=True)
class ShardTask:
    """Everything one shard's conversion needs (picklable: Dask ships it to a worker).

    ``samples`` in write order, at ``positions`` of the source; ``columns`` their other
    fields; ``sizes``, ``estimate_bytes`` and ``plan_samples`` plan the storage (NOTE [ One
    plan for every shard ]); ``problems``: the listing's (shard 0 only); ``remote``: where
    the shard is published when the set is in a bucket (``target`` then gives its name).
    """

    target: Path
    identity: ShardIdentity
    samples: tuple[Sample, ...]
    positions: np.ndarray
    classes: tuple[str, ...]
    fields: tuple[StoredField, ...]
    columns: dict[str, Any]
    options: ConvertOptions
    sizes: Counter[tuple[int, int]] | None
    estimate_bytes: np.ndarray | None
    plan_samples: int
    problems: tuple[SkippedFile, ...]
    overwrite: bool
    remote: RemoteShard | None = None

    def files(self) -> list[Path]:
        """Return the local files its samples are read from (a target must be none of them)."""
        return [Path(s.image.path) for s in self.samples if isinstance(s.image, FileRange)]

    def plan(self) -> StoragePlan:
        """Return the storage of the shard (the same for every shard of the set)."""

        def sample_bytes(limit: int | None) -> np.ndarray:
            if limit is None:  # a contiguous blob's length: this shard's samples
                return image_bytes(self.samples)
            if self.estimate_bytes is not None:
                return self.estimate_bytes[:limit]
            return image_bytes(self.samples[:limit])

        return plan_storage(
            self.options, self.sizes, num_samples=self.plan_samples, sample_bytes=sample_bytes
        )


@dataclass(frozen=True, kw_only=True)
class SourceSplit:
    """A listed source, the problems of its listing, and its split into ``num_shards``."""

    source: SampleSource
    problems: tuple[SkippedFile, ...]
    num_shards: int
    options: ConvertOptions

    def __len__(self) -> int:
        return len(self.source.samples)

    def positions(self, index: int = 0, num_shards: int = 1) -> np.ndarray:
        """Return the source positions of shard ``index`` of ``num_shards``, in write order."""
        seed, shuffle = self.options.seed, self.options.shuffle_samples
        return self.source.split(index, num_shards, seed=seed, shuffle=shuffle)

    def samples(self, index: int) -> tuple[Sample, ...]:
        """Return shard ``index``'s samples, in write order."""
        every = self.source.samples
        return tuple(every[i] for i in self.positions(index, self.num_shards))

    def identity(self, index: int) -> ShardIdentity:
        """Return the identity shard ``index`` records."""
        samples = self.samples(index)
        return ShardIdentity(
            index=index,
            num_shards=self.num_shards,
            seed=self.options.seed,
            shuffled=self.options.shuffle_samples,
            num_found=len(self),
            num_planned=len(samples),
            slice_crc32=slice_fingerprint((s.label for s in samples), (s.key for s in samples)),
        )

    def estimate_bytes(self) -> np.ndarray | None:
        """Return the image bytes a blob's chunk is chosen from (NOTE [ One plan ... ])."""
        if self.options.size is not None:
            return None  # an array: no blob
        every = self.source.samples
        return image_bytes(every[i] for i in self.positions()[:ESTIMATE_SAMPLES])

    def tasks(
        self,
        indices: list[int],
        out_dir: Path,
        remote: RemoteSet | None,
        *,
        sizes: Counter[tuple[int, int]] | None,
        overwrite: bool,
    ) -> list[ShardTask]:
        """Return the tasks of shards ``indices`` (the set in ``out_dir``, or ``remote``'s)."""
        estimate = self.estimate_bytes()
        n = self.num_shards
        return [
            ShardTask(
                target=out_dir / shard_name(index, n),
                identity=self.identity(index),
                samples=self.samples(index),
                positions=self.positions(index, n),
                classes=self.source.classes,
                fields=self.source.listing.fields,
                columns=self.source.columns(self.positions(index, n)),
                options=self.options,
                sizes=sizes,
                estimate_bytes=estimate,
                plan_samples=-(-len(self) // n),
                problems=self.problems if index == 0 else (),
                overwrite=overwrite,
                remote=remote.shard(index, n) if remote is not None else None,
            )
            for index in indices
        ]


def plan_reason(task: ShardTask, num_files: int) -> str:
    """Return why the set is stored as it is, said of all ``num_files`` files."""
    said = task.plan().reason
    return said.replace(f"all {task.plan_samples} images", f"all {num_files} images")


def list_source(
    source: SampleSource, options: ConvertOptions, emit: Callable[[ConvertEvent], None]
) -> list[SkippedFile]:
    """List ``source``; return the entries it left out (announced through ``emit``).

    Raises:
        DecodeError: with ``strict``, the first entry the listing left out.
    """
    num = len(source.samples)
    source.check(options)
    labelled = f" in {len(source.classes)} classes" if source.classes else " (unlabelled)"
    emit(ConvertEvent("scanned", f"found {num} images{labelled} under {source.root}", total=num))
    for note in source.notes:
        emit(ConvertEvent("skipped", note))
    skipped: list[SkippedFile] = []
    # One warning per kind of problem (a hundred stray files make one line).
    for reason, paths in group_problems(source.problems):
        if options.strict:
            rejecter(options, skipped, emit)(paths[0], reason)
        skipped.extend(SkippedFile(path, reason) for path in paths)
        emit(ConvertEvent("skipped", f"skipped {name_paths(paths)}: {reason}", path=paths[0]))
    return skipped


def needs_probe(options: ConvertOptions) -> bool:
    """Return whether planning needs every image's size (read from its header)."""
    return options.mode != "encoded" and options.size is None


def sample_table(
    samples: Sequence[Sample],
    classes: Sequence[str],
    order: np.ndarray,
    fields: tuple[Field, ...] = (),
    columns: Mapping[str, Any] | None = None,
) -> SampleTable:
    """Return the table of ``samples`` in write order (``order``: their source positions)."""
    return SampleTable(
        labels=np.asarray([s.label for s in samples], dtype=np.int64),
        classes=tuple(classes),
        paths=[s.key for s in samples],
        source_index=np.asarray(order, dtype=np.int64),
        fields=(*LEGACY_FIELDS, *fields),
        columns=dict(columns or {}),
    )


def remove_leftovers_beside(target: Path, emit: Callable[[ConvertEvent], None]) -> None:
    """Remove what killed conversions left beside ``target``; say so."""
    removed = remove_leftovers(target.parent)
    if removed:
        message = describe_removed(removed)
        logger.warning("%s", message)
        emit(ConvertEvent("note", message))
