"""The ``h5pack`` command line: thin click commands over the library.

Every command turns its flags into the library's option objects at the edge and renders
what the library returns; errors are mapped in one place (``H5PackGroup.invoke``):
``OptionsError`` is a usage error (``Error: ...`` after the usage line, exit 2, as click
reports a bad flag), any other ``H5PackError`` prints one line ``Error: ...`` and exits 1.
Other command modules extend the group with ``cli.add_command`` and reuse the flags and
parameter types of ``h5pack.cli.flags`` (re-exported here).
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from h5pack.cli.flags import (
    ByteSize,
    ChunkShape,
    Progress,
    convert_flags,
    format_bytes,
    options_from_flags,
    parse_bytes,
    parse_shard,
    parse_storage_options,
    progress_for,
    quiet_flag,
    staging_flag,
    storage_option_flag,
)
from h5pack.core.machine import available_cores
from h5pack.core.units import plural
from h5pack.errors import H5PackError, OptionsError

if TYPE_CHECKING:
    from h5pack.core.format import SkippedFile
    from h5pack.write.options import ConvertOptions
    from h5pack.write.shards import PackSetReport
    from h5pack.write.sources import SampleSource

__all__ = [
    "LAZY_COMMANDS",
    "ByteSize",
    "ChunkShape",
    "H5PackGroup",
    "Progress",
    "cli",
    "convert_flags",
    "format_bytes",
    "main",
    "options_from_flags",
    "parse_bytes",
    "progress_for",
    "quiet_flag",
]

# Skipped files listed after a conversion (all of them are in the pack).
SKIPPED_SHOWN = 20

# Commands that live in other modules, imported only when used (so that `h5pack convert`
# does not import what `bench` needs): name -> "module:attribute". A module that is not
# there yet simply adds no command.
LAZY_COMMANDS: dict[str, str] = {
    "compare": "h5pack.cli.bench:compare",
    "bench": "h5pack.cli.bench:bench",
    "info": "h5pack.cli.check:info",
    "verify": "h5pack.cli.check:verify",
    "merge": "h5pack.cli.merge:merge",
}


# Ctrl-C: 128 + SIGINT, the shell's convention (SIGTERM gives 143, publish.terminate_cleanly).
EXIT_INTERRUPTED = 130


class H5PackGroup(click.Group):
    """The command group; maps h5pack's errors to messages and exit codes, in one place.

    Other modules extend it with ``cli.add_command(command)``, or lazily through
    ``LAZY_COMMANDS``.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Return the commands, lazy ones included when their module exists."""
        lazy = [name for name in LAZY_COMMANDS if self._lazy(name) is not None]
        return sorted({*super().list_commands(ctx), *lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Return a command, importing a lazy one on first use."""
        return super().get_command(ctx, cmd_name) or self._lazy(cmd_name)

    @staticmethod
    def _lazy(name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            return None
        command = getattr(module, attribute, None)
        return command if isinstance(command, click.Command) else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with each one's first sentence whole (click cuts it at ~45)."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10**4)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; no traceback for a user's mistake."""
        try:
            return super().invoke(ctx)
        except OptionsError as err:
            raise click.UsageError(str(err)) from err
        except H5PackError as err:
            click.echo(f"Error: {err}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:  # click would say "Aborted!" and exit 1
            click.echo("Interrupted.", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=H5PackGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="h5pack")
def cli() -> None:
    """Pack image folders into chunked HDF5 and read them at the speed of the storage."""


# -- commands ---------------------------------------------------------------------------


@cli.command()
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
    help="What SOURCE is: folder, tar (an uncompressed .tar of a folder, read in place) "
    "[default: detected from SOURCE].",
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
    staging_dir: str | None,
    storage_option: tuple[str, ...],
    **flags: Any,
) -> None:
    """Pack the images of SOURCE (a folder, a .tar) into the HDF5 file TARGET (or a pack set).

    TARGET may be a URL, s3://bucket/pack.h5 (or s3://bucket/set/ with --shards): each
    pack is written in --staging-dir, then uploaded once complete (docs/object-storage.md).
    """
    remote: dict[str, Any] = {
        "staging_dir": staging_dir,
        "storage_options": parse_storage_options(storage_option),
    }
    from h5pack.write.sources import sample_source

    if shards is None and shard is None and dask_address is None:
        options = options_from_flags(flags)
        found = sample_source(source, kind=source_kind, labels_csv=options.labels_csv)
        _convert_one(found, target, overwrite, quiet, options, remote)
        return
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
    if shards is None:
        raise OptionsError("--dask runs the shards of --shards N: add --shards")
    options = options_from_flags(flags)
    found = sample_source(source, kind=source_kind, labels_csv=options.labels_csv)
    if dask_address is not None:
        from h5pack.write.dask import convert_on_dask, dask_client

        # --dask local --workers N: a LocalCluster of N processes (each converts a shard).
        cluster = dask_client(dask_address, workers=options.workers)
        with cluster as client, progress_for(quiet) as progress:
            report = convert_on_dask(
                client,
                found,
                target,
                options,
                shards=shards,
                overwrite=overwrite,
                progress=progress.advance,
                on_event=progress.event,
                **remote,
            )
    else:
        from h5pack.write.shards import convert_set

        with progress_for(quiet) as progress:
            report = convert_set(
                found,
                target,
                options,
                shards=shards,
                only=only,
                overwrite=overwrite,
                progress=progress.advance,
                on_event=progress.event,
                **remote,
            )
    _render_set(report)


def _convert_one(
    source: SampleSource,
    target: str,
    overwrite: bool,
    quiet: bool,
    options: ConvertOptions,
    remote: dict[str, Any],
) -> None:
    from h5pack.write.convert import convert as run_convert

    with progress_for(quiet) as progress:
        report = run_convert(
            source,
            target,
            options,
            overwrite=overwrite,
            progress=progress.advance,
            on_event=progress.event,
            **remote,
        )
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


@cli.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the sample folder and pack here [default: a temporary folder].",
)
@click.option("--workers", type=int, default=None, help="Worker processes [default: all cores].")
@quiet_flag
def demo(out: str | None, workers: int | None, quiet: bool) -> None:
    """Generate a small sample folder, pack it, read a batch back, say what happened."""
    if out is None:
        with tempfile.TemporaryDirectory(prefix="h5pack-demo-") as folder:
            _demo(Path(folder), workers, quiet)
            click.echo("(the demo folder was temporary; pass --out DIR to keep it)")
    else:
        _demo(Path(out), workers, quiet)


def _demo(folder: Path, workers: int | None, quiet: bool) -> None:
    from h5pack.synthetic import SampleSpec, make_image_folder
    from h5pack.write.convert import convert as run_convert
    from h5pack.write.options import ConvertOptions

    images = folder / "images"
    pack = folder / "demo.h5"
    # mixed sizes, like every real photo folder
    spec = SampleSpec(num_images=64, num_classes=4, size=(96, 128), size_jitter=0.3)
    make_image_folder(images, spec, overwrite=True)
    click.echo(
        f"1. generated {spec.num_images} JPEGs of mixed sizes around {spec.size[1]}x"
        f"{spec.size[0]} (WxH) in {spec.num_classes} classes under {images}"
    )
    options = ConvertOptions(workers=workers)
    with progress_for(quiet) as progress:
        report = run_convert(
            images,
            pack,
            options,
            overwrite=True,
            progress=progress.advance,
            # step 2 says the chosen mode: its event would say it twice
            on_event=lambda event: None if event.kind == "mode" else progress.event(event),
        )
    from h5pack.check import pack_info

    summary = pack_info(pack)
    click.echo(
        f"2. packed {report.num_samples} images into {pack}: {report.reason}; "
        f"{format_bytes(summary.file_bytes)}, ratio {summary.compression_ratio:.2f}, "
        f"{report.images_per_s:.0f} images/s"
    )
    shape, labels, how = _read_batch(pack)
    click.echo(f"3. read one batch back with {how}: images {shape}, labels {labels}")


def _read_batch(pack: Path) -> tuple[tuple[int, ...], list[int], str]:
    """Return the shape and labels of one batch, through ``make_loader`` when it is there."""
    try:
        from h5pack.training.loader import make_loader
    except ImportError:
        from h5pack.read.reader import PackReader

        with PackReader(pack) as reader:
            batch = reader.read_images(range(min(16, len(reader))))
            labels = [int(x) for x in reader.meta.labels[: len(batch)]]
            return (len(batch), *batch[0].shape), labels, "PackReader (the first image)"
    loader = make_loader(pack, batch_size=16, num_workers=0, size=64, flip=True)
    images, labels_tensor = next(iter(loader))[:2]
    how = "make_loader(size=64, flip=True): random-resized crops of every size to 64x64"
    return tuple(images.shape), [int(x) for x in labels_tensor], how


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="h5pack")
