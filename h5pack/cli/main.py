"""The ``h5pack`` command line: thin click commands over the library.

Each command turns its flags into the library's option objects and renders what the
library returns. Errors are mapped in one place (``H5PackGroup.invoke``): ``OptionsError``
is a usage error (exit 2), any other ``H5PackError`` one line ``Error: ...`` (exit 1).
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from h5pack.cli.flags import format_bytes, quiet_flag
from h5pack.cli.progress import progress_for
from h5pack.errors import H5PackError, OptionsError

# Commands imported only when used (``convert`` does not import what ``bench`` needs).
LAZY_COMMANDS: dict[str, str] = {
    "convert": "h5pack.cli.convert:convert",
    "compare": "h5pack.cli.bench:compare",
    "bench": "h5pack.cli.bench:bench",
    "info": "h5pack.cli.check:info",
    "verify": "h5pack.cli.check:verify",
    "merge": "h5pack.cli.merge:merge",
}

EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, the shell's convention


class H5PackGroup(click.Group):
    """The command group: lazy commands, and h5pack's errors as messages and exit codes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Return the commands, lazy ones included."""
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Return a command, importing a lazy one on first use."""
        if cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = LAZY_COMMANDS[cmd_name].split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with each one's first sentence whole (click cuts it at ~45)."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10**4)))
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
    from h5pack.check import pack_info
    from h5pack.synthetic import SampleSpec, make_image_folder
    from h5pack.write.convert import convert as run_convert
    from h5pack.write.options import ConvertOptions

    images, pack = folder / "images", folder / "demo.h5"
    spec = SampleSpec(num_images=64, num_classes=4, size=(96, 128), size_jitter=0.3)
    make_image_folder(images, spec, overwrite=True)
    click.echo(
        f"1. generated {spec.num_images} JPEGs of mixed sizes around {spec.size[1]}x"
        f"{spec.size[0]} (WxH) in {spec.num_classes} classes under {images}"
    )
    with progress_for(quiet) as progress:
        report = run_convert(
            images,
            pack,
            ConvertOptions(workers=workers),
            overwrite=True,
            progress=progress.advance,
            # step 2 says the chosen mode: its event would say it twice
            on_event=lambda event: None if event.kind == "mode" else progress.event(event),
        )
    summary = pack_info(pack)
    click.echo(
        f"2. packed {report.num_samples} images into {pack}: {report.reason}; "
        f"{format_bytes(summary.file_bytes)}, ratio {summary.compression_ratio:.2f}, "
        f"{report.images_per_s:.0f} images/s"
    )
    from h5pack.training.loader import make_loader

    loader = make_loader(pack, batch_size=16, num_workers=0, size=64, flip=True)
    images_batch, labels_tensor = next(iter(loader))[:2]
    click.echo(
        "3. read one batch back with make_loader(size=64, flip=True): random-resized crops "
        f"of every size to 64x64: images {tuple(images_batch.shape)}, labels "
        f"{[int(x) for x in labels_tensor]}"
    )


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="h5pack")
