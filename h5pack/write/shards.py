"""Sharded conversion: a sample source into a pack set (shard packs and a manifest).

The split (``write/split.py``) is a pure function of the sorted samples and the seed, so
processes that see the same source (``--shards N``, ``--shard I/N`` tasks, Dask) build
shards holding every image once, shuffled globally. Each shard is published like a pack
of ``convert`` and records its place in the split; the manifest is written last, by
whichever process finds the set complete (``write/packset.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from h5pack._types import StrPath
from h5pack.core import format as fmt
from h5pack.core.format import PackMeta, SkippedFile
from h5pack.core.packset import shard_name, shard_slice
from h5pack.core.store import Store, is_url, open_store
from h5pack.errors import OptionsError, TargetExistsError
from h5pack.write.options import ConvertOptions
from h5pack.write.packing import Pool, probe_sizes, worker_pool, write_samples
from h5pack.write.packset import finish_manifest, prepare_out_dir, shard_problems
from h5pack.write.publish import TempFiles, check_not_a_source, sigterm_as_exit
from h5pack.write.remote import RemoteSet, publish_staged
from h5pack.write.report import ConvertEvent
from h5pack.write.sources import SampleSource, sample_source
from h5pack.write.split import (
    ShardTask,
    SourceSplit,
    list_source,
    needs_probe,
    plan_reason,
    remove_leftovers_beside,
    sample_table,
)

__all__ = ["PackSetReport", "ShardReport", "convert_set"]

Emit = Callable[[ConvertEvent], None]
Step = Callable[[int], None]


@dataclass(frozen=True, kw_only=True)
class ShardReport:
    """What became of one shard: ``"written"`` by this run, or ``"reused"``; its samples."""

    index: int
    path: str
    status: Literal["written", "reused"]
    num_samples: int
    num_planned: int
    file_bytes: int
    elapsed_s: float
    skipped: tuple[SkippedFile, ...]


@dataclass(frozen=True, kw_only=True)
class PackSetReport:
    """What a sharded conversion did: its shards, and the manifest (None while some miss)."""

    root: str
    num_shards: int
    num_found: int
    shards: tuple[ShardReport, ...]
    manifest: str | None
    missing: tuple[int, ...]
    reason: str
    elapsed_s: float

    @property
    def num_samples(self) -> int:
        """Samples in the shards this run handled."""
        return sum(s.num_samples for s in self.shards)

    @property
    def skipped(self) -> tuple[SkippedFile, ...]:
        """Files left out by the shards this run handled."""
        return tuple(item for s in self.shards for item in s.skipped)

    @property
    def images_per_s(self) -> float:
        """Files converted per second (shards written by this run, over the whole run)."""
        done = sum(s.num_planned for s in self.shards if s.status == "written")
        return done / self.elapsed_s if self.elapsed_s > 0 else float("inf")


def set_report(
    split: SourceSplit,
    out: Path,
    remote: RemoteSet | None,
    shards: tuple[ShardReport, ...],
    reason: str,
    started: float,
    *,
    metas: dict[int, PackMeta],
    emit: Emit,
) -> PackSetReport:
    """Write the manifest once every shard is there; return what the run did."""
    sizes = {r.index: r.file_bytes for r in shards if r.index in metas}
    manifest, missing = finish_manifest(
        out, remote, split=split, options=split.options, metas=metas, sizes=sizes, emit=emit
    )
    return PackSetReport(
        root=remote.prefix_url if remote is not None else os.fspath(out),
        num_shards=split.num_shards,
        num_found=len(split),
        shards=shards,
        manifest=manifest,
        missing=missing,
        reason=reason,
        elapsed_s=time.perf_counter() - started,
    )


def open_set(
    source: StrPath | SampleSource,
    out_dir: StrPath,
    options: ConvertOptions,
    shards: int,
    *,
    overwrite: bool,
    storage_options: Mapping[str, str] | None,
    store: Store | None,
    staging_dir: StrPath | None,
    emit: Emit,
) -> tuple[Path, RemoteSet | None, SourceSplit]:
    """Prepare the set's directory (removing what killed runs left) or bucket prefix; split.

    Returns the directory the shards are named in, the bucket's set (None if local), and
    ``source`` listed and split into ``shards`` (at most one an image).
    """
    source = in_place(source, options, storage_options)
    store = store or open_store(out_dir, storage_options)
    remote = None
    if store.remote:  # NOTE [ Stores ]
        remote = RemoteSet(os.fspath(out_dir), store, staging_dir)
        out = remote.prepare(shards, options, overwrite=overwrite)
    else:
        out = prepare_out_dir(out_dir, shards, options, overwrite=overwrite)
        remove_leftovers_beside(out / shard_name(0, shards), emit)
    found = sample_source(source, labels_csv=options.labels_csv)
    skipped = list_source(found, options, emit)
    if shards > (num := len(found.samples)):
        raise OptionsError(
            f"--shards {shards} is more than the {num} images found under {found.root}: "
            f"use at most {num} shards"
        )
    split = SourceSplit(source=found, problems=tuple(skipped), num_shards=shards, options=options)
    return out, remote, split


def in_place(
    source: StrPath | SampleSource,
    options: ConvertOptions | None,
    storage_options: Mapping[str, str] | None,
) -> StrPath | SampleSource:
    """Return ``source``, or the source its URL names (NOTE [ Sources in a bucket ])."""
    if isinstance(source, SampleSource) or not is_url(source):
        return source
    labels = (options or ConvertOptions()).labels_csv
    return sample_source(source, labels_csv=labels, storage_options=storage_options)


def convert_set(
    source: StrPath | SampleSource,
    out_dir: StrPath,
    options: ConvertOptions | None = None,
    *,
    shards: int,
    only: int | None = None,
    overwrite: bool = False,
    progress: Step | None = None,
    on_event: Emit | None = None,
    storage_options: Mapping[str, str] | None = None,
    store: Store | None = None,
    staging_dir: StrPath | None = None,
) -> PackSetReport:
    """Pack the images of ``source`` into a pack set of ``shards`` shards in ``out_dir``.

    As ``convert``, into a directory (created if missing) or a bucket prefix
    (``s3://bucket/set/``: each shard staged and uploaded, the manifest last). ``only``
    builds one shard (a Slurm array task, a torchrun rank); the manifest is written once
    every shard is there and matches. ``overwrite`` replaces shards that do not match.

    Raises:
        TargetExistsError: a shard (or manifest) exists that does not match, without
            ``overwrite``; the message names it.
        OptionsError: bad ``shards``/``only``, or more shards than images.
        SourceError, DecodeError: as ``convert``.
    """
    options = options or ConvertOptions()
    emit = on_event or (lambda event: None)
    step = progress or (lambda n: None)
    started = time.perf_counter()
    indices = _indices(shards, only)
    out, remote, split = open_set(
        source,
        out_dir,
        options,
        shards,
        overwrite=overwrite,
        storage_options=storage_options,
        store=store,
        staging_dir=staging_dir,
        emit=emit,
    )
    reports: list[ShardReport] = []
    metas: dict[int, PackMeta] = {}
    with worker_pool(options.effective_workers, emit, step) as pool:
        sizes = probe_sizes(pool, split.source.samples) if needs_probe(options) else None
        tasks = split.tasks(indices, out, remote, sizes=sizes, overwrite=overwrite)
        reason = plan_reason(tasks[0], len(split))
        emit(ConvertEvent("mode", reason))
        for task in tasks:
            report, meta = write_shard(task, pool)
            reports.append(report)
            metas[task.identity.index] = meta
    return set_report(split, out, remote, tuple(reports), reason, started, metas=metas, emit=emit)


def _indices(shards: int, only: int | None) -> list[int]:
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise OptionsError(f"--shards (shards=) should be a positive integer, but got {shards!r}")
    if only is None:
        return list(range(shards))
    shard_slice(shards, only, shards)  # raises for an index out of range, naming --shard I/N
    return [only]


def write_shard(task: ShardTask, pool: Pool) -> tuple[ShardReport, PackMeta]:
    """Reuse shard ``task`` if it is there and matches, else write it; return it and its meta.

    A shard there that does not match is refused (``TargetExistsError``), or with
    ``overwrite`` replaced. Into a bucket, the shard is staged and uploaded.
    """
    started = time.perf_counter()
    identity, remote = task.identity, task.remote
    if remote is not None:
        path, store = remote.url, remote.store
        found = store.stat(path)
        there, size = found is not None, found.size if found is not None else 0
    else:
        path, store = os.fspath(task.target), None
        there = task.target.exists()
        size = task.target.stat().st_size if there else 0
    meta = None
    if there:
        meta, problems = shard_problems(path, identity, task.options, task.classes, store)
        if problems:
            meta, detail = None, "; ".join(problems)
            if not task.overwrite:
                elsewhere = "under another prefix" if remote else "into another directory"
                raise TargetExistsError(
                    f"{path} exists but is not shard {identity.index}/{identity.num_shards} of "
                    f"this conversion ({detail}); pass --overwrite to rebuild it, or convert "
                    f"{elsewhere}"
                )
            pool.emit(ConvertEvent("note", f"replacing {path}: {detail}"))
    status: Literal["written", "reused"] = "reused" if meta is not None else "written"
    if meta is None and remote is not None:
        meta, size = publish_staged(
            remote.store,
            path,
            lambda local, room: convert_shard_file(task, local, pool, room=room),
            overwrite=True,
            staging_dir=remote.staging_dir,
            emit=pool.emit,
            checked=True,
        )
    elif meta is None:
        meta, size = convert_shard_file(task, task.target, pool)
    report = ShardReport(
        index=identity.index,
        path=path,
        status=status,
        num_samples=meta.num_samples,
        num_planned=identity.num_planned,
        file_bytes=size,
        elapsed_s=time.perf_counter() - started,
        skipped=meta.skipped,
    )
    return report, meta


def convert_shard_file(
    task: ShardTask,
    target: Path,
    pool: Pool,
    *,
    room: Callable[[int], None] | None = None,
) -> tuple[PackMeta, int]:
    """Convert shard ``task`` into the local file ``target`` (replacing one); its meta, bytes."""
    identity = task.identity
    where = f"shard {identity.index}/{identity.num_shards}"
    pool.emit(ConvertEvent("phase", f"{where}: converting", total=len(task.samples)))
    skipped = list(task.problems)
    with sigterm_as_exit(), TempFiles(target) as temps:
        check_not_a_source(target, task.files())
        write_samples(
            target,
            task.plan(),
            task.samples,
            sample_table(task.samples, task.classes, task.positions, task.fields, task.columns),
            pool,
            options=task.options,
            temps=temps,
            skipped=skipped,
            overwrite=True,  # a shard there was checked first: it did not match
            shard=identity.to_text(),
            room=room,
        )
    return fmt.load_meta(target), target.stat().st_size
