"""``h5pack convert``: a source (a folder, a .tar...) into a pack, or into a pack set.

The source is chosen once, here, from SOURCE and ``--from``; below, only the
``SampleSource`` travels.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from h5pack.cli.flags import (
    convert_flags,
    format_bytes,
    options_from_flags,
    quiet_flag,
    staging_flag,
    storage_option_flag,
    store_of,
)
from h5pack.cli.progress import progress_for
from h5pack.core.machine import available_cores
from h5pack.core.units import plural
from h5pack.errors import OptionsError

if TYPE_CHECKING:
    from h5pack.core.format import SkippedFile
    from h5pack.write.report import ConvertReport
    from h5pack.write.shards import PackSetReport

__all__ = ["convert"]

# Skipped files listed after a conversion (all of them are in the pack).
SKIPPED_SHOWN = 20


@click.command()
@click.argument("source", type=click.Path())
@click.argument("target", type=click.Path())
@convert_flags
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Write a pack set: N shard packs and a manifest in the directory TARGET.",
)
@click.option(
    "--shard",
    default=None,
    metavar="I/N|auto",
    help="Write only shard I of N into TARGET (one process per shard); auto reads RANK/"
    "WORLD_SIZE (torchrun) or SLURM_ARRAY_TASK_ID/COUNT (Slurm array). The last one "
    "writes the manifest.",
)
@click.option(
    "--dask",
    "dask_address",
    default=None,
    metavar="ADDRESS|local",
    help="Run the --shards as Dask tasks on the scheduler at ADDRESS (tcp://host:8786), or "
    "on a LocalCluster of --workers processes (local; default one per core).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace TARGET if it exists; for a pack set, replace shards that do not match.",
)
@click.option(
    "--from",
    "source_kind",
    default="auto",
    metavar="KIND",
    help="What SOURCE is: folder, tar, tgz, zip (an archive of a folder, never extracted), "
    "imagenet (a tar of class tars), webdataset (shards, or a brace pattern), "
    "parquet (Hugging Face datasets' files: one, a folder or a glob) "
    "[default: detected from SOURCE].",
)
@click.option(
    "--annotations",
    type=click.Path(dir_okay=False),
    default=None,
    help="A COCO instances JSON for the images of SOURCE: boxes, labels, iscrowd, masks.",
)
@click.option(
    "--masks",
    type=click.Path(file_okay=False),
    default=None,
    help="A folder of masks (palette or grey PNG) with the stems of SOURCE's images.",
)
@staging_flag
@storage_option_flag
@quiet_flag
def convert(
    source: str,
    target: str,
    overwrite: bool,
    quiet: bool,
    shards: int | None,
    shard: str | None,
    dask_address: str | None,
    source_kind: str,
    annotations: str | None,
    masks: str | None,
    staging_dir: str | None,
    storage_option: tuple[str, ...],
    **flags: Any,
) -> None:
    """Pack the images of SOURCE (a folder, an archive, shards) into TARGET (or a pack set).

    SOURCE may be in a bucket (s3://bucket/images/, a tar's or Parquet file's URL), read
    in place. TARGET may be a URL (s3://bucket/pack.h5, or s3://bucket/set/ with
    --shards): each pack is written in --staging-dir, then uploaded once complete.
    """
    from h5pack.write.sources import sample_source

    only = None
    if shard is not None:
        only, count = parse_shard(shard, os.environ)
        if shards is not None and shards != count:
            raise OptionsError(f"--shards {shards} and --shard {shard} disagree: give one")
        if dask_address is not None:
            raise OptionsError("--dask runs every shard; it does not take --shard")
        shards = count
        if flags["workers"] is None and "LOCAL_WORLD_SIZE" in os.environ:
            # torchrun starts LOCAL_WORLD_SIZE ranks per machine: they share its cores.
            local = max(1, int(os.environ["LOCAL_WORLD_SIZE"] or 1))
            flags["workers"] = max(1, available_cores() // local)
    if shards is None and dask_address is not None:
        raise OptionsError("--dask runs the shards of --shards N: add --shards")
    options = options_from_flags(flags)
    named = [p for p in (source, annotations, masks) if p is not None]
    found = sample_source(
        source,
        kind=source_kind,
        labels_csv=options.labels_csv,
        annotations=annotations,
        masks=masks,
        store=store_of(named, storage_option),
    )
    with progress_for(quiet) as progress:
        run: dict[str, Any] = {
            "overwrite": overwrite,
            "progress": progress.advance,
            "on_event": progress.event,
            "staging_dir": staging_dir,
            "store": store_of(target, storage_option),
        }
        if shards is None:
            from h5pack.write.convert import convert as run_convert

            _render_one(run_convert(found, target, options, **run))
            return
        if dask_address is not None:
            from h5pack.write.dask import convert_on_dask, dask_client

            # --dask local --workers N: a LocalCluster of N processes (each converts a shard).
            with dask_client(dask_address, workers=options.workers) as client:
                report = convert_on_dask(client, found, target, options, shards=shards, **run)
        else:
            from h5pack.write.shards import convert_set

            report = convert_set(found, target, options, shards=shards, only=only, **run)
    _render_set(report)


def _render_one(report: ConvertReport) -> None:
    click.echo(
        f"packed {report.num_samples} of {report.num_found} images into {report.path} "
        f"({format_bytes(report.file_bytes)}, {report.mode}/{report.storage}) "
        f"in {report.elapsed_s:.1f} s, {report.images_per_s:.0f} images/s"
    )
    _render_skipped(report.skipped, f"`h5pack info --json {report.path}` lists all")


def _render_skipped(skipped: Sequence[SkippedFile], more: str) -> None:
    if not skipped:
        return
    count = len(skipped)
    click.echo(f"skipped {plural(count, 'file')} (recorded in the pack):", err=True)
    for item in skipped[:SKIPPED_SHOWN]:
        click.echo(f"  {item.path}: {item.reason}", err=True)
    if count > SKIPPED_SHOWN:
        click.echo(f"  and {count - SKIPPED_SHOWN} more: {more}", err=True)


def _render_set(report: PackSetReport) -> None:
    """Print one line per shard and the pack set's summary."""
    n = report.num_shards
    for item in report.shards:
        click.echo(
            f"shard {item.index}/{n}: {item.status} {Path(item.path).name}, "
            f"{item.num_samples} of {item.num_planned} images, {format_bytes(item.file_bytes)}"
            f" ({item.elapsed_s:.1f} s)"
        )
    done = sum(s.num_planned for s in report.shards if s.status == "written")
    speed = f", {report.images_per_s:.0f} images/s" if done else ""
    if report.manifest is not None:
        click.echo(
            f"pack set {report.root}: {plural(n, 'shard')}, manifest {report.manifest} "
            f"(this run: {report.num_samples} images in {report.elapsed_s:.1f} s{speed})"
        )
    else:
        left = len(report.missing)
        click.echo(
            f"{left} of {n} shards still missing ({_list(report.missing)}): the last "
            f"--shard I/{n} to finish writes the manifest (or rerun with --shards {n})"
        )
    _render_skipped(report.skipped, "`h5pack info --json SHARD` lists all")


def _list(indices: Sequence[int], *, limit: int = 8) -> str:
    shown = ", ".join(map(str, indices[:limit]))
    return shown + (f" and {len(indices) - limit} more" if len(indices) > limit else "")


# What ``--shard auto`` reads: torchrun's rank variables, else a Slurm array task's.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE")
SLURM_ARRAY_VARS = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")


def parse_shard(text: str, env: Mapping[str, str]) -> tuple[int, int]:
    """Return ``(index, num_shards)`` of ``--shard I/N`` or ``--shard auto``.

    ``auto`` reads ``RANK``/``WORLD_SIZE`` (set by torchrun), else ``SLURM_ARRAY_TASK_ID``
    minus ``SLURM_ARRAY_TASK_MIN`` (0 when unset) and ``SLURM_ARRAY_TASK_COUNT`` (set by a
    Slurm array job) from ``env``.

    Example:
        >>> parse_shard("3/8", {}), parse_shard("auto", {"RANK": "1", "WORLD_SIZE": "2"})
        ((3, 8), (1, 2))

    Raises:
        OptionsError: the text is neither, or ``auto`` finds no (or bad) variables.
    """
    if text.strip().lower() != "auto":
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if match is None:
            raise OptionsError(f"--shard should be I/N (e.g. 0/8) or auto, but got {text!r}")
        index, count, what = int(match.group(1)), int(match.group(2)), f"--shard {text}"
    elif all(name in env for name in TORCHRUN_VARS):
        index, count = (_env_int(env, name) for name in TORCHRUN_VARS)
        what = f"--shard auto (RANK={index}, WORLD_SIZE={count})"
    elif all(name in env for name in SLURM_ARRAY_VARS):
        task, count = (_env_int(env, name) for name in SLURM_ARRAY_VARS)
        low = _env_int(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
        index = task - low
        what = (
            f"--shard auto (SLURM_ARRAY_TASK_ID={task} - SLURM_ARRAY_TASK_MIN={low}, "
            f"SLURM_ARRAY_TASK_COUNT={count}; an array with a step, e.g. 0-15:2, cannot "
            "number shards: use --array=0-N-1 or --shard I/N)"
        )
    else:
        raise OptionsError(
            "--shard auto reads RANK and WORLD_SIZE (set by torchrun) or SLURM_ARRAY_TASK_ID "
            "and SLURM_ARRAY_TASK_COUNT (set in a Slurm array job, #SBATCH --array=0-7), but "
            "none of them is set: give --shard I/N"
        )
    if count < 1:
        raise OptionsError(f"{what}: the number of shards should be at least 1, but got {count}")
    if not 0 <= index < count:
        raise OptionsError(f"{what}: the shard index should be in 0..{count - 1}, but got {index}")
    return index, count


def _env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise OptionsError(
            f"--shard auto: {name} should be an integer, but got {name}={env[name]!r}"
        ) from None
