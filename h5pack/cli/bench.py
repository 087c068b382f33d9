"""``h5pack compare`` and ``h5pack bench``: thin click commands over ``h5pack.bench``.

``h5pack.cli.main`` registers them lazily (``LAZY_COMMANDS``), so ``h5pack convert`` never
imports the benchmarks (nor torch); errors go through the group's single mapping.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import click

from h5pack.cli.bench_flags import (
    Workers,
    cache_flags,
    local_exists,
    remote_flags,
    train_flags,
    training_read,
)
from h5pack.cli.flags import (
    ByteSize,
    ImageSize,
    ImageSizeOption,
    checked_mix,
    mix_flags,
    quiet_flag,
    storage_option_flag,
    store_of,
)
from h5pack.cli.progress import progress_for
from h5pack.core.vocabulary import PATTERNS


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(), callback=local_exists)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="h5pack-report",
    show_default=True,
    help="Folder for report.json, report.md and the plots.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Four variants chosen from what the images allow, two repeats: a fast answer.",
)
@click.option(
    "--variants",
    multiple=True,
    help="Variants to build, comma-separated (e.g. raw-contig,raw-c64-gzip,encoded-1m). "
    "Tokens: raw|encoded, contig, c<N> samples per chunk, <N>k|<N>m chunk bytes, a codec "
    "[:level], byte|bit shuffle.",
)
@click.option("--keep", is_flag=True, help="Keep the packs built, under OUT/packs.")
@click.option(
    "--size",
    cls=ImageSizeOption,
    type=ImageSize(),
    default=None,
    metavar="N|H,W",
    help="The size raw variants are stored at (h5pack convert --size: N or H,W); images "
    "keep their own size without it. The size training reads is --train-size.",
)
@train_flags
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option(
    "--workers", type=Workers(), default="auto", show_default=True, help="Loader workers."
)
@click.option(
    "--repeats",
    type=int,
    default=None,
    help="Timed runs, each of one or more epochs [default: 3, quick: 2].",
)
@click.option("--convert-workers", type=int, default=None, help="Conversion processes.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--across-pixels",
    is_flag=True,
    help="Rank packs that hold different pixels (other image sizes, other images) together, "
    "on speed alone [default: each kind apart, since a smaller image reads faster].",
)
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the table.")
@storage_option_flag
@quiet_flag
def compare(
    sources: tuple[str, ...],
    out: str,
    quick: bool,
    variants: tuple[str, ...],
    keep: bool,
    size: tuple[int, int] | None,
    train_size: str | None,
    crop: str | None,
    flip: bool | None,
    batch_size: int,
    workers: int | Literal["auto"],
    repeats: int | None,
    convert_workers: int | None,
    seed: int,
    across_pixels: bool,
    no_plots: bool,
    as_json: bool,
    storage_option: tuple[str, ...],
    quiet: bool,
) -> None:
    """Compare pack layouts on an image folder (SOURCES = one folder) or on packs.

    SOURCES may also name pack sets (a set's directory or packset.json), each measured as
    one pack, and packs or sets in a bucket (s3://bucket/pack.h5, s3://bucket/set/),
    measured through the loader only (--storage-option configures the client).

    From a folder, every variant is converted into a temporary folder (--keep keeps
    them), then read as training will read it (--train-size, --crop, --flip) through
    h5pack's loader under three access patterns: a full shuffle, the chunk-aware order and
    pack order. Prints a table ranked by
    throughput and a recommendation among the packs the loader can batch, weighing file
    size against the memory available, and writes report.json, report.md and plots into
    OUT.
    """
    import dataclasses

    from h5pack.bench.compare import compare as run_compare
    from h5pack.bench.options import CompareOptions
    from h5pack.bench.report import format_compare, to_json, write_report
    from h5pack.bench.variants import parse_variants

    train = training_read(train_size, crop, flip)
    store = store_of(list(sources), storage_option)
    base = CompareOptions.quick() if quick else CompareOptions()
    changes: dict[str, Any] = {
        "size": size,
        "train": train,
        "convert_workers": convert_workers,
        "seed": seed,
        "across_pixels": across_pixels,
    }
    if variants:
        changes["variants"] = tuple(spec.name for spec in parse_variants(list(variants)))
    changes["measure"] = dataclasses.replace(
        base.measure,
        batch_size=batch_size,
        workers=workers,
        repeats=repeats or base.measure.repeats,
        seed=seed,
    )
    options = dataclasses.replace(base, **changes)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = out_dir / "packs" if keep else Path(tempfile.mkdtemp(prefix=".packs-", dir=out_dir))
    try:
        with progress_for(quiet) as progress:
            events = progress.event
            report = run_compare(
                list(sources), options, work_dir=work_dir, keep=keep, on_event=events, store=store
            )
    finally:
        if not keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    files = write_report(report, out_dir, plots=not no_plots)
    if as_json:
        click.echo(json.dumps(to_json(report), indent=2))
        return
    click.echo(format_compare(report))
    written = [files.json, files.markdown, *files.plots]
    click.echo(f"wrote {', '.join(str(p) for p in written)}")
    if files.plot_message:
        click.echo(files.plot_message)
    if report.work_dir:
        click.echo(f"kept the packs in {report.work_dir}")


@click.command()
@click.argument("packs", nargs=-1, required=True, type=click.Path())
@click.option("--workers", type=Workers(), default="auto", show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option(
    "--order",
    type=click.Choice(PATTERNS),
    default="chunk",
    show_default=True,
    help="chunk: h5pack's sampler; random: a full shuffle; sequential: pack order.",
)
@click.option(
    "--chunk-cache-bytes",
    type=ByteSize(),
    default=None,
    help="Decompressed chunks kept per process, e.g. 256MiB [default: the sampler window]. "
    "Not the decoded cache: --cache decoded --cache-bytes.",
)
@cache_flags
@remote_flags
@train_flags
@click.option(
    "--repeats",
    type=int,
    default=3,
    show_default=True,
    help="Timed runs (each of enough epochs to time, see --time-budget).",
)
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed epochs first.")
@click.option(
    "--time-budget",
    type=float,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Time the runs may take while they are lengthened to reach a steady figure "
    "(spread within ±5%).",
)
@click.option("--max-batches", type=int, default=None, help="Batches per epoch [default: all].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--diagnose",
    is_flag=True,
    help="Also run in-memory batches and a cold page cache, and name the bottleneck.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@mix_flags
@storage_option_flag
@quiet_flag
def bench(
    packs: tuple[str, ...],
    workers: int | Literal["auto"],
    batch_size: int,
    order: str,
    chunk_cache_bytes: int | None,
    cache: str | None,
    cache_bytes: int | None,
    disk_cache_dir: str | None,
    disk_cache_bytes: int | None,
    disk_cache_eviction: str,
    requests_in_flight: int | None,
    train_size: str | None,
    crop: str | None,
    flip: bool | None,
    repeats: int,
    warmup: int,
    time_budget: float,
    max_batches: int | None,
    seed: int,
    diagnose: bool,
    as_json: bool,
    weights: tuple[float, ...] | None,
    epoch_samples: int | None,
    storage_option: tuple[str, ...],
    quiet: bool,
) -> None:
    """Measure h5pack's loader on PACKS: images/s with the spread over repeated runs.

    PACKS is a pack, a pack set (its directory or packset.json) or several packs read as
    one set, through make_loader as training reads it (--train-size, --crop, --flip), in
    runs of enough epochs to time. --diagnose also times the same loader on in-memory
    batches (its ceiling, interleaved with the pack's runs) and with a cold page cache,
    and says where the time goes and what would help for this pack. With --weights, PACKS
    are the sources of a mix (each a pack or a set): each source's share, passes per epoch
    and coverage, the mix's images/s, CPU per image and chunks decompressed per sample.
    """
    store = store_of(list(packs), storage_option)  # the one store of the packs read
    mix = checked_mix(packs, weights, epoch_samples)
    if mix is not None:
        from h5pack.bench import bench_mix
        from h5pack.bench.reading import parse_train_size

        mixed = bench_mix(
            list(packs),
            mix,
            epoch_samples=epoch_samples,
            batch_size=batch_size,
            workers=workers,
            size=parse_train_size(train_size) if train_size is not None else None,
            repeats=repeats,
            warmup=warmup,
            budget_s=time_budget,
            seed=seed,
            store=store,
        )
        click.echo(json.dumps(mixed.to_dict(), indent=2) if as_json else "\n".join(mixed.lines()))
        return
    from h5pack.bench.diagnose import diagnose as run_diagnose
    from h5pack.bench.diagnose import format_diagnosis
    from h5pack.bench.options import BenchOptions, CompareEvent
    from h5pack.bench.report import to_json
    from h5pack.bench.throughput import bench_loader, format_bench
    from h5pack.errors import OptionsError
    from h5pack.read.eviction import parse_policy
    from h5pack.read.options import ReaderOptions
    from h5pack.read.readahead import ReadAheadOptions

    train = training_read(train_size, crop, flip)
    ahead = requests_in_flight
    try:
        options = BenchOptions(
            batch_size=batch_size,
            workers=workers,
            order=order,
            cache="decoded" if cache else None,
            cache_bytes=cache_bytes,
            train=train,
            repeats=repeats,
            warmup=warmup,
            max_batches=max_batches,
            budget_s=time_budget,
            seed=seed,
            reader=ReaderOptions(
                chunk_cache_bytes=chunk_cache_bytes,
                read_ahead=None if ahead is None else ReadAheadOptions(requests_in_flight=ahead),
                disk_cache_dir=disk_cache_dir,
                disk_cache_bytes=disk_cache_bytes,
                disk_cache_eviction=parse_policy(disk_cache_eviction),
                store=store,
            ),
        )
    except OptionsError as err:
        raise click.UsageError(str(err)) from err
    pack: str | list[str] = packs[0] if len(packs) == 1 else list(packs)
    name = Path(packs[0]).name + (f" and {len(packs) - 1} more" if len(packs) > 1 else "")
    with progress_for(quiet) as progress:
        progress.event(CompareEvent("phase", f"bench {name}", unit="run"))
        run = run_diagnose if diagnose else bench_loader
        result: Any = run(pack, options, on_step=lambda: progress.advance(1))
    if as_json:
        click.echo(json.dumps(to_json(result), indent=2))
    elif diagnose:
        click.echo(format_diagnosis(result))
    else:
        click.echo(format_bench(result))
