"""The click flags of ``h5pack compare`` and ``h5pack bench``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from h5pack.cli.flags import ByteSize

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


TRAIN_SIZE_HELP = (
    "The size training reads images at (make_loader's size=): N for N x N, or H,W; 'none' "
    "reads them as stored. Every access pattern is measured through the loader at this "
    "size. [default: as stored when all images share one size; otherwise 224 with "
    "random-resized crops and flips, since the loader batches images of several sizes "
    "only at one size]"
)


def train_flags(function: Any) -> Any:
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


def training_read(train_size: str | None, crop: str | None, flip: bool | None) -> Any:
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


def cache_flags(function: Any) -> Any:
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


RENAMED_FLAGS = {
    "--cache-dir": "--disk-cache-dir",
    "--cache-disk-bytes": "--disk-cache-bytes",
    "--cache-eviction": "--disk-cache-eviction",
}
"""Flags of older releases for the disk cache, and their names now (issue 26: one word a cache)."""


def _moved(old: str, new: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            raise click.UsageError(f"{old} moved to {new}", ctx)

    return refuse


def remote_flags(function: Any) -> Any:
    """A remote pack's read-ahead and disk cache: ``ReaderOptions(disk_cache_dir=...)`` etc."""
    for old, new in RENAMED_FLAGS.items():
        function = click.option(
            old, hidden=True, expose_value=False, is_eager=True, callback=_moved(old, new)
        )(function)
    function = click.option(
        "--requests-in-flight",
        type=click.IntRange(min=1),
        default=None,
        help="Ranged requests each worker keeps in flight ahead of its reader (a remote "
        "pack) [default: sized from the measured latency and rate].",
    )(function)
    function = click.option(
        "--disk-cache-eviction",
        type=click.Choice(["belady", "lru"]),
        default="belady",
        show_default=True,
        help="Which chunk the disk cache drops: needed farthest in the future, or least "
        "recently used (for comparison).",
    )(function)
    function = click.option(
        "--disk-cache-bytes",
        type=ByteSize(),
        default=None,
        help="The disk cache's budget, e.g. 20GiB; 0: none [default: half the free space "
        "where it lies].",
    )(function)
    return click.option(
        "--disk-cache-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="The disk cache of a remote pack's chunks, shared by the user's processes "
        "[default: $XDG_CACHE_HOME/h5pack, else ~/.cache/h5pack].",
    )(function)


def local_exists(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    """Refuse a local source that does not exist (a URL is checked when it is opened)."""
    from h5pack.core.store import is_url

    for value in values:
        if not is_url(value) and not Path(value).exists():
            raise click.BadParameter(f"Path {value!r} does not exist.", ctx, param)
    return values
