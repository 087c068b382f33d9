"""``h5pack compare`` and ``h5pack bench`` (registered lazily: ``convert`` never imports torch)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import click

from h5pack.cli.flags import (
    ByteSize,
    checked_mix,
    mix_flags,
    quiet_flag,
    size_flag,
    storage_option_flag,
    store_of,
)
from h5pack.cli.progress import progress_for
from h5pack.core.vocabulary import CROPS, PATTERNS, Crop
from h5pack.errors import OptionsError


def _workers(ctx: click.Context, param: click.Parameter, value: str) -> int | str:
    """``--workers``: ``auto`` or a number of DataLoader workers (>= 0)."""
    if value != "auto" and not value.isdigit():
        raise click.BadParameter(f"{value!r} is neither 'auto' nor a number of workers (>= 0)")
    return value if value == "auto" else int(value)


def _train_flags(function: Any) -> Any:
    """Add ``--train-size``, ``--crop`` and ``--flip`` (how training reads the images)."""
    function = click.option(
        "--flip/--no-flip",
        default=None,
        help="Random horizontal flips at --train-size [default: on with the automatic size].",
    )(function)
    function = click.option(
        "--crop",
        type=click.Choice(CROPS),
        default=None,
        help="How images are cut to --train-size [default: random-resized].",
    )(function)
    return click.option(
        "--train-size",
        default=None,
        metavar="N|H,W|none",
        help="The size training reads images at (make_loader's size=); 'none': as stored "
        "[default: as stored when all images share one size, else 224, cropped and flipped].",
    )(function)


def _training_read(train_size: str | None, crop: Crop | None, flip: bool | None) -> Any:
    """Return the ``TrainingRead`` (or ``"auto"``) of the training flags, or fail (exit 2)."""
    from h5pack.bench.reading import TrainingRead, parse_train_size

    try:
        size = None if train_size is None else parse_train_size(train_size)
        if size is None and (crop is not None or flip or (train_size is None and flip is not None)):
            got = f"--train-size {train_size}" if train_size else "no --train-size"
            raise OptionsError(
                "--crop and --flip apply to images cut to a training size, but got "
                f"{got}: give one (e.g. --train-size 224)"
            )
        if size is None:
            return "auto" if train_size is None else TrainingRead()
        return TrainingRead(size=size, crop=crop or "random-resized", flip=bool(flip))
    except OptionsError as err:
        raise click.BadParameter(str(err), param_hint="--train-size") from err


def _local_exists(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    """Refuse a local source that does not exist (a URL is checked when opened)."""
    from h5pack.core.store import is_url

    for value in values:
        if not is_url(value) and not Path(value).exists():
            raise click.BadParameter(f"Path {value!r} does not exist.", ctx, param)
    return values


workers_flag = click.option(
    "--workers",
    default="auto",
    show_default=True,
    metavar="auto|N",
    callback=_workers,
    help="Loader workers.",
)
batch_flag = click.option("--batch-size", type=int, default=64, show_default=True)
seed_flag = click.option("--seed", type=int, default=0, show_default=True)


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(), callback=_local_exists)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="h5pack-report",
    show_default=True,
    help="Folder for report.json, report.md and the plots.",
)
@click.option("--quick", is_flag=True, help="Four variants the images allow, two repeats.")
@click.option(
    "--variants",
    multiple=True,
    help="Variants to build, comma-separated (e.g. raw-contig,raw-c64-gzip,encoded-1m). "
    "Tokens: raw|encoded, contig, c<N> samples per chunk, <N>k|<N>m chunk bytes, a codec "
    "[:level], byte|bit shuffle.",
)
@click.option("--keep", is_flag=True, help="Keep the packs built, under OUT/packs.")
@size_flag("The size raw variants are stored at (convert --size) [default: the images' own].")
@_train_flags
@batch_flag
@workers_flag
@click.option("--repeats", type=int, default=None, help="Timed runs [default: 3, with --quick: 2].")
@click.option("--convert-workers", type=int, default=None, help="Conversion processes.")
@seed_flag
@click.option(
    "--across-pixels",
    is_flag=True,
    help="Rank packs that hold different pixels (other sizes, other images) together, on "
    "speed alone [default: each kind apart].",
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
    crop: Crop | None,
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

    Every variant is converted and read as training will read it through h5pack's loader
    in a full shuffle, the chunk-aware order and pack order: a table ranked by throughput,
    a recommendation, and report.json, report.md and plots in OUT. SOURCES may also be
    packs or pack sets, local or in a bucket (s3://bucket/pack.h5).
    """
    from h5pack.bench.compare import CompareOptions
    from h5pack.bench.compare import compare as run_compare
    from h5pack.bench.report import format_compare, to_json, write_report
    from h5pack.bench.variants import parse_variants

    store = store_of(list(sources), storage_option)
    base = CompareOptions.quick() if quick else CompareOptions()
    options = dataclasses.replace(
        base,
        size=size,
        train=_training_read(train_size, crop, flip),
        convert_workers=convert_workers,
        seed=seed,
        across_pixels=across_pixels,
        variants=tuple(s.name for s in parse_variants(list(variants)))
        if variants
        else base.variants,
        measure=dataclasses.replace(
            base.measure,
            batch_size=batch_size,
            workers=workers,
            repeats=repeats or base.measure.repeats,
            seed=seed,
        ),
    )
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = out_dir / "packs" if keep else Path(tempfile.mkdtemp(prefix=".packs-", dir=out_dir))
    try:
        with progress_for(quiet) as progress:
            report = run_compare(
                list(sources),
                options,
                work_dir=work_dir,
                keep=keep,
                on_event=progress.event,
                store=store,
            )
    finally:
        if not keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    files = write_report(report, out_dir, plots=not no_plots)
    if as_json:
        click.echo(json.dumps(to_json(report), indent=2))
        return
    click.echo(format_compare(report))
    click.echo(f"wrote {', '.join(str(p) for p in [files.json, files.markdown, *files.plots])}")
    if files.plot_message:
        click.echo(files.plot_message)
    if report.work_dir:
        click.echo(f"kept the packs in {report.work_dir}")


@click.command()
@click.argument("packs", nargs=-1, required=True, type=click.Path())
@workers_flag
@batch_flag
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
    help="Decompressed chunks kept per process, e.g. 256MiB [default: the sampler window].",
)
@click.option(
    "--cache",
    type=click.Choice(["decoded"]),
    default=None,
    help="Read through make_loader's decoded cache: the warm-up epoch fills it, the timed "
    "epochs are the later ones [default: none].",
)
@click.option(
    "--cache-bytes",
    type=ByteSize(),
    default=None,
    help="The decoded cache's budget (with --cache decoded) [default: a quarter of the "
    "memory available].",
)
@click.option(
    "--disk-cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The disk cache of a remote pack's chunks [default: $XDG_CACHE_HOME/h5pack, else "
    "~/.cache/h5pack].",
)
@click.option(
    "--disk-cache-bytes",
    type=ByteSize(),
    default=None,
    help="The disk cache's budget, e.g. 20GiB; 0: none [default: half the free space there].",
)
@click.option(
    "--disk-cache-eviction",
    type=click.Choice(["belady", "lru"]),
    default="belady",
    show_default=True,
    help="Which chunk the disk cache drops: needed farthest ahead, or least recently used.",
)
@click.option(
    "--requests-in-flight",
    type=click.IntRange(min=1),
    default=None,
    help="Ranged requests each worker keeps in flight (a remote pack) [default: sized from "
    "the measured latency and rate].",
)
@_train_flags
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed epochs first.")
@click.option(
    "--time-budget",
    type=float,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Time the runs may take while they are lengthened to a steady figure (±5%).",
)
@click.option("--max-batches", type=int, default=None, help="Batches per epoch [default: all].")
@seed_flag
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
    crop: Crop | None,
    flip: bool | None,
    repeats: int,
    warmup: int,
    time_budget: float,
    max_batches: int | None,
    seed: int,
    as_json: bool,
    weights: tuple[float, ...] | None,
    epoch_samples: int | None,
    storage_option: tuple[str, ...],
    quiet: bool,
) -> None:
    """Measure h5pack's loader on PACKS: images/s with the spread, and CPU per image.

    PACKS (a pack, a pack set or several packs read as one set) are read through
    make_loader as training reads them, in runs of enough epochs to time. With --weights,
    PACKS are the sources of a mix: each one's share and coverage, the mix's images/s.
    """
    store = store_of(list(packs), storage_option)  # the one store of the packs read
    mix = checked_mix(packs, weights, epoch_samples)
    if mix is not None:
        from h5pack.bench.mixture import bench_mix
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
    from h5pack.bench.measure import BenchOptions, bench_loader, format_bench
    from h5pack.bench.report import to_json
    from h5pack.read.eviction import parse_policy
    from h5pack.read.options import ReaderOptions
    from h5pack.read.readahead import ReadAheadOptions

    ahead = requests_in_flight
    reader = ReaderOptions(
        chunk_cache_bytes=chunk_cache_bytes,
        read_ahead=None if ahead is None else ReadAheadOptions(requests_in_flight=ahead),
        disk_cache_dir=disk_cache_dir,
        disk_cache_bytes=disk_cache_bytes,
        disk_cache_eviction=parse_policy(disk_cache_eviction),
        store=store,
    )
    options = BenchOptions(
        batch_size=batch_size,
        workers=workers,
        order=order,
        cache="decoded" if cache else None,
        cache_bytes=cache_bytes,
        train=_training_read(train_size, crop, flip),
        repeats=repeats,
        warmup=warmup,
        max_batches=max_batches,
        budget_s=time_budget,
        seed=seed,
        reader=reader,
    )
    pack: str | list[str] = packs[0] if len(packs) == 1 else list(packs)
    name = Path(packs[0]).name + (f" and {len(packs) - 1} more" if len(packs) > 1 else "")
    with progress_for(quiet) as progress:
        progress.phase(f"bench {name}", None, unit="run")
        result = bench_loader(pack, options, on_step=lambda: progress.advance(1))
    click.echo(json.dumps(to_json(result), indent=2) if as_json else format_bench(result))
