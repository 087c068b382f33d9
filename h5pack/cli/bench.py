"""``h5pack compare`` and ``h5pack bench``: thin click commands over ``h5pack.bench``.

``h5pack.cli.main`` registers them lazily (``LAZY_COMMANDS``), so ``h5pack convert`` never
imports the benchmarks (nor torch); errors go through the group's single mapping.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from h5pack.cli.flags import (
    ImageSize,
    ImageSizeOption,
    mix_flags,
    parse_storage_options,
    storage_option_flag,
)
from h5pack.cli.main import ByteSize, quiet_flag
from h5pack.core.vocabulary import PATTERNS

if TYPE_CHECKING:  # click >= 8.2 types ParamType as a generic (see h5pack.cli.main)
    _WorkersParam = click.ParamType[int | str, Any]
else:
    _WorkersParam = click.ParamType


class Workers(_WorkersParam):
    """A click parameter: ``auto`` or a number of DataLoader workers (>= 0)."""

    name = "auto|N"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | str:
        """Parse ``auto`` or a non-negative integer, or fail with a usage error."""
        if isinstance(value, int):
            return value
        if value == "auto":
            return "auto"
        try:
            number = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither 'auto' nor a number of workers", param, ctx)
        if number < 0:
            self.fail(f"workers should be >= 0, but got {number}", param, ctx)
        return number


class _Bar:
    """Render ``CompareEvent`` progress with tqdm on stderr."""

    def __init__(self, quiet: bool) -> None:
        from tqdm import tqdm

        tqdm.monitor_interval = 0  # no monitor thread (conversions and loaders fork)
        self._tqdm = tqdm
        self.quiet = quiet
        self.bar: Any = None

    def event(self, event: Any) -> None:
        if event.kind == "start":
            if not self.quiet:
                self.bar = self._tqdm(total=event.total, desc=event.message, file=sys.stderr)
        elif event.kind == "step":
            if self.bar is not None:
                self.bar.set_description_str(event.message, refresh=False)
                self.bar.update(1)
        elif event.message.startswith("skipped"):
            self._tqdm.write(f"warning: {event.message}", file=sys.stderr)
        elif self.bar is not None:
            self.bar.set_description_str(event.message)

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def start(self, total: int | None, message: str) -> None:
        if not self.quiet:
            self.bar = self._tqdm(total=total, desc=message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


TRAIN_SIZE_HELP = (
    "The size training reads images at (make_loader's size=): N for N x N, or H,W; 'none' "
    "reads them as stored. Every access pattern is measured through the loader at this "
    "size. [default: as stored when all images share one size; otherwise 224 with "
    "random-resized crops and flips, since the loader batches images of several sizes "
    "only at one size]"
)


def _train_flags(function: Any) -> Any:
    """Add ``--train-size``, ``--crop`` and ``--flip`` (the training read) to a command."""
    from h5pack.read.crop import CROPS

    function = click.option(
        "--flip/--no-flip",
        default=None,
        help="Random horizontal flips when reading at --train-size (make_loader's flip=) "
        "[default: off; on with the automatic size].",
    )(function)
    function = click.option(
        "--crop",
        type=click.Choice(CROPS),
        default=None,
        help="How images are cut to --train-size (make_loader's crop=) [default: random-resized].",
    )(function)
    return click.option(
        "--train-size", "train_size", default=None, metavar="N|H,W|none", help=TRAIN_SIZE_HELP
    )(function)


def _training_read(train_size: str | None, crop: str | None, flip: bool | None) -> Any:
    """Return the ``TrainingRead`` (or ``"auto"``) of the training flags, or fail (exit 2)."""
    from h5pack.bench.reading import TrainingRead, parse_train_size
    from h5pack.errors import OptionsError

    try:
        if train_size is None:
            if crop is not None or flip is not None:
                raise OptionsError(
                    "--crop and --flip apply to images cut to a training size: add "
                    "--train-size (e.g. --train-size 224)"
                )
            return "auto"
        size = parse_train_size(train_size)
        if size is None and (crop is not None or flip):
            raise OptionsError(
                "--crop and --flip apply to images cut to a training size, but got "
                "--train-size none: drop them or give a size"
            )
        if size is None:
            return TrainingRead()
        return TrainingRead.parse(size, crop, bool(flip))
    except OptionsError as err:
        raise click.BadParameter(str(err), param_hint="--train-size") from err


def _cache_flags(function: Any) -> Any:
    """``--cache decoded`` and ``--cache-bytes``: make_loader's ``cache=`` and ``cache_bytes=``."""
    function = click.option(
        "--cache-bytes",
        type=ByteSize(),
        default=None,
        help="The decoded cache's budget, as make_loader's cache_bytes= (with --cache "
        "decoded) [default: a quarter of the memory available].",
    )(function)
    return click.option(
        "--cache",
        type=click.Choice(["decoded"]),
        default=None,
        help="Read through make_loader's decoded cache (cache='decoded', README's training "
        "loop): the untimed warm-up epoch fills it, the timed epochs are the later ones "
        "[default: none, every epoch reads as the first].",
    )(function)


def _remote_flags(function: Any) -> Any:
    """A remote pack's read-ahead and disk cache: make_loader's ``cache_dir=`` and the like."""
    function = click.option(
        "--requests-in-flight",
        type=click.IntRange(min=1),
        default=None,
        help="Ranged requests each worker keeps in flight ahead of its reader (a remote "
        "pack) [default: sized from the measured latency and rate].",
    )(function)
    function = click.option(
        "--cache-eviction",
        type=click.Choice(["belady", "lru"]),
        default="belady",
        show_default=True,
        help="Which chunk the disk cache drops: needed farthest in the future, or least "
        "recently used (for comparison).",
    )(function)
    function = click.option(
        "--cache-disk-bytes",
        type=ByteSize(),
        default=None,
        help="The disk cache's budget, e.g. 20GiB; 0: none [default: half the free space "
        "where it lies].",
    )(function)
    return click.option(
        "--cache-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="The machine's disk cache of a remote pack's chunks, shared by every process "
        "[default: h5pack-chunks in the temporary directory].",
    )(function)


def _local_exists(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    """Refuse a local source that does not exist (a URL is checked when it is opened)."""
    from h5pack.core.source import is_url

    for value in values:
        if not is_url(value) and not Path(value).exists():
            raise click.BadParameter(f"Path {value!r} does not exist.", ctx, param)
    return values


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(), callback=_local_exists)
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
@_train_flags
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
@_cache_flags
@click.option(
    "--dataset-size",
    default=None,
    metavar="N",
    help="Samples of the training set these packs stand for (e.g. 1281167, 500k, 1.28M): "
    "the report projects each pack's chunks decompressed per sample to that size, where "
    "the chunk-aware order pays off [default: ImageNet-1k's 1.28M].",
)
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
    cache: str | None,
    cache_bytes: int | None,
    dataset_size: str | None,
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
    pack order (plus a bare h5py per-sample read, for reference). Prints a table ranked by
    throughput and a recommendation among the packs the loader can batch, weighing file
    size against the memory available, and writes report.json, report.md and plots into
    OUT.
    """
    import dataclasses

    from h5pack.bench.compare import CompareOptions
    from h5pack.bench.compare import compare as run_compare
    from h5pack.bench.report import format_compare, to_json, write_report
    from h5pack.bench.scale import parse_dataset_size
    from h5pack.bench.variants import parse_variants

    train = _training_read(train_size, crop, flip)
    storage = parse_storage_options(storage_option)
    base = CompareOptions.quick() if quick else CompareOptions()
    changes: dict[str, Any] = {
        "size": size,
        "train": train,
        "convert_workers": convert_workers,
        "seed": seed,
        "dataset_size": parse_dataset_size(dataset_size) if dataset_size else None,
        "across_pixels": across_pixels,
    }
    if variants:
        changes["variants"] = tuple(spec.name for spec in parse_variants(list(variants)))
    measure = base.measure
    changes["measure"] = dataclasses.replace(
        measure,
        batch_size=batch_size,
        workers=workers,
        repeats=repeats if repeats is not None else measure.repeats,
        seed=seed,
        cache="decoded" if cache else None,
        cache_bytes=cache_bytes,
    )
    options = CompareOptions(**{**_fields(base), **changes})
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = out_dir / "packs" if keep else Path(tempfile.mkdtemp(prefix=".packs-", dir=out_dir))
    bar = _Bar(quiet)
    try:
        report = run_compare(
            list(sources),
            options,
            work_dir=work_dir,
            keep=keep,
            on_event=bar.event,
            storage_options=storage,
        )
    finally:
        bar.close()
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


def _fields(options: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


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
@_cache_flags
@_remote_flags
@click.option(
    "--transforms/--no-transforms",
    default=False,
    show_default=True,
    help="A per-sample Python transform (crop of 7/8, flip, normalisation) on every image, "
    "after the training read.",
)
@_train_flags
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
@click.option("--stratify", is_flag=True, help="With --weights: hold the shares in every batch.")
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
    cache_dir: str | None,
    cache_disk_bytes: int | None,
    cache_eviction: str,
    requests_in_flight: int | None,
    transforms: bool,
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
    stratify: bool,
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
    storage = parse_storage_options(storage_option)
    if weights is not None or epoch_samples is not None or stratify:
        _bench_mix(
            packs,
            weights,
            epoch_samples=epoch_samples,
            stratify=stratify,
            batch_size=batch_size,
            workers=workers,
            train_size=train_size,
            repeats=repeats,
            warmup=warmup,
            time_budget=time_budget,
            seed=seed,
            as_json=as_json,
            storage_options=storage,
        )
        return
    from h5pack.bench.diagnose import diagnose as run_diagnose
    from h5pack.bench.loaders import RemoteReading
    from h5pack.bench.report import format_bench, format_diagnosis, to_json
    from h5pack.bench.throughput import BenchOptions, bench_loader
    from h5pack.errors import OptionsError

    train = _training_read(train_size, crop, flip)
    try:
        options = BenchOptions(
            batch_size=batch_size,
            workers=workers,
            order=order,
            chunk_cache_bytes=chunk_cache_bytes,
            cache="decoded" if cache else None,
            cache_bytes=cache_bytes,
            transforms=transforms,
            train=train,
            repeats=repeats,
            warmup=warmup,
            max_batches=max_batches,
            budget_s=time_budget,
            seed=seed,
            remote=RemoteReading(
                requests_in_flight=requests_in_flight,
                cache_dir=cache_dir,
                cache_disk_bytes=cache_disk_bytes,
                cache_eviction=cache_eviction,
                storage_options=storage,
            ),
        )
    except OptionsError as err:
        raise click.UsageError(str(err)) from err
    bar = _Bar(quiet)
    pack: str | list[str] = packs[0] if len(packs) == 1 else list(packs)
    name = Path(packs[0]).name + (f" and {len(packs) - 1} more" if len(packs) > 1 else "")
    bar.start(None, f"bench {name}")
    try:
        if diagnose:
            result: Any = run_diagnose(pack, options, on_step=bar.step)
        else:
            result = bench_loader(pack, options, on_step=bar.step)
    finally:
        bar.close()
    if as_json:
        click.echo(json.dumps(to_json(result), indent=2))
    elif diagnose:
        click.echo(format_diagnosis(result))
    else:
        click.echo(format_bench(result))


def _bench_mix(
    packs: tuple[str, ...],
    weights: tuple[float, ...] | None,
    *,
    epoch_samples: int | None,
    stratify: bool,
    batch_size: int,
    workers: int | Literal["auto"],
    train_size: str | None,
    repeats: int,
    warmup: int,
    time_budget: float,
    seed: int,
    as_json: bool,
    storage_options: dict[str, str] | None,
) -> None:
    """``bench --weights``: a loader over the mix of PACKS."""
    from h5pack.bench import bench_mix
    from h5pack.bench.reading import parse_train_size

    if weights is None:
        raise click.BadParameter("--epoch-samples and --stratify apply to a mix: add --weights")
    if len(weights) != len(packs):
        raise click.BadParameter(
            f"should give one weight per source ({len(packs)}), but got {len(weights)}",
            param_hint="--weights",
        )
    size = parse_train_size(train_size) if train_size is not None else None
    result = bench_mix(
        list(packs),
        weights,
        epoch_samples=epoch_samples,
        stratify=stratify,
        batch_size=batch_size,
        workers=workers,
        size=size,
        repeats=repeats,
        warmup=warmup,
        budget_s=time_budget,
        seed=seed,
        storage_options=storage_options,
    )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    for line in result.lines():
        click.echo(line)
