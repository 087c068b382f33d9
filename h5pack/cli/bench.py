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

from h5pack.cli.main import ByteSize, quiet_flag

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

    def start(self, total: int, message: str) -> None:
        if not self.quiet:
            self.bar = self._tqdm(total=total, desc=message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="h5pack-report",
    show_default=True,
    help="Folder for report.json, report.md and the plots.",
)
@click.option("--quick", is_flag=True, help="Four variants, two repeats: a fast answer.")
@click.option(
    "--variants",
    multiple=True,
    help="Variants to build, comma-separated (e.g. raw-contig,raw-c64-gzip,encoded-1m). "
    "Tokens: raw|encoded, contig, c<N> samples per chunk, <N>k|<N>m chunk bytes, a codec "
    "[:level], byte|bit shuffle.",
)
@click.option("--keep", is_flag=True, help="Keep the packs built, under OUT/packs.")
@click.option("--size", type=(int, int), default=None, metavar="H W", help="Raw variants' size.")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option(
    "--workers", type=Workers(), default="auto", show_default=True, help="Loader workers."
)
@click.option("--repeats", type=int, default=None, help="Timed epochs [default: 3, quick: 2].")
@click.option("--convert-workers", type=int, default=None, help="Conversion processes.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the table.")
@quiet_flag
def compare(
    sources: tuple[str, ...],
    out: str,
    quick: bool,
    variants: tuple[str, ...],
    keep: bool,
    size: tuple[int, int] | None,
    batch_size: int,
    workers: int | Literal["auto"],
    repeats: int | None,
    convert_workers: int | None,
    seed: int,
    no_plots: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Compare pack layouts on an image folder (SOURCES = one folder) or on packs.

    From a folder, every variant is converted into a temporary folder (--keep keeps
    them), then read under three access patterns: random per-sample, h5pack's chunk-aware
    order and sequential. Prints a table ranked by throughput and a recommendation, and
    writes report.json, report.md and plots into OUT.
    """
    from h5pack.bench.compare import CompareOptions
    from h5pack.bench.compare import compare as run_compare
    from h5pack.bench.measure import MeasureOptions
    from h5pack.bench.report import format_compare, to_json, write_report
    from h5pack.bench.variants import parse_variants

    base = CompareOptions.quick() if quick else CompareOptions()
    changes: dict[str, Any] = {"size": size, "convert_workers": convert_workers, "seed": seed}
    if variants:
        changes["variants"] = tuple(spec.name for spec in parse_variants(list(variants)))
    measure = base.measure
    changes["measure"] = MeasureOptions(
        batch_size=batch_size,
        workers=workers,
        repeats=repeats if repeats is not None else measure.repeats,
        warmup=measure.warmup,
        random_budget_s=measure.random_budget_s,
        random_min_samples=measure.random_min_samples,
        seed=seed,
    )
    options = CompareOptions(**{**_fields(base), **changes})
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = out_dir / "packs" if keep else Path(tempfile.mkdtemp(prefix=".packs-", dir=out_dir))
    bar = _Bar(quiet)
    try:
        report = run_compare(
            list(sources), options, work_dir=work_dir, keep=keep, on_event=bar.event
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
@click.argument("pack", type=click.Path(dir_okay=False))
@click.option("--workers", type=Workers(), default="auto", show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option(
    "--order",
    type=click.Choice(["chunk", "random", "sequential"]),
    default="chunk",
    show_default=True,
    help="chunk: h5pack's sampler; random: a full shuffle; sequential: pack order.",
)
@click.option(
    "--cache-bytes",
    type=ByteSize(),
    default=None,
    help="Decompressed chunks kept per process, e.g. 256MiB [default: the sampler window].",
)
@click.option(
    "--transforms/--no-transforms",
    default=False,
    show_default=True,
    help="Random crop, flip and normalisation on every image.",
)
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed epochs.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed epochs first.")
@click.option("--max-batches", type=int, default=None, help="Batches per epoch [default: all].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--diagnose",
    is_flag=True,
    help="Also run in-memory batches and a cold page cache, and name the bottleneck.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@quiet_flag
def bench(
    pack: str,
    workers: int | Literal["auto"],
    batch_size: int,
    order: str,
    cache_bytes: int | None,
    transforms: bool,
    repeats: int,
    warmup: int,
    max_batches: int | None,
    seed: int,
    diagnose: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Measure h5pack's loader on PACK: images/s with the spread over repeated epochs."""
    from h5pack.bench.report import format_bench, format_diagnosis, to_json
    from h5pack.bench.throughput import BenchOptions, bench_loader
    from h5pack.bench.throughput import diagnose as run_diagnose
    from h5pack.errors import OptionsError

    try:
        options = BenchOptions(
            batch_size=batch_size,
            workers=workers,
            order=order,
            cache_bytes=cache_bytes,
            transforms=transforms,
            repeats=repeats,
            warmup=warmup,
            max_batches=max_batches,
            seed=seed,
        )
    except OptionsError as err:
        raise click.UsageError(str(err)) from err
    bar = _Bar(quiet)
    epochs = warmup + repeats
    bar.start(3 * repeats + 2 * warmup if diagnose else epochs, f"bench {Path(pack).name}")
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
