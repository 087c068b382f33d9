"""Building blocks of the command line: parameter types and flags defined once.

The conversion flags become one ``ConvertOptions`` (``options_from_flags``); the
``--storage-option`` flags one ``Store`` (``store_of``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from h5pack.core.layout import CODECS, LEVELS, SHUFFLES, Compression
from h5pack.core.store import Store, open_store
from h5pack.core.units import binary_bytes
from h5pack.core.vocabulary import BACKENDS, CHANNELS, LAYOUT_CHOICES, MODE_CHOICES, RESIZE_METHODS
from h5pack.errors import OptionsError

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:  # click >= 8.2 types ParamType as a generic; older clicks cannot subscript it
    _SizeParam = click.ParamType[int, Any]
    _ShapeParam = click.ParamType[tuple[int, ...], Any]
else:
    _SizeParam = _ShapeParam = click.ParamType

# K/M/G and KiB/MiB/GiB are powers of 1024, KB/MB/GB powers of 1000
_UNITS = {"": 1, "b": 1} | {
    unit: scale**power
    for power, letter in enumerate("kmg", start=1)
    for unit, scale in ((letter, 1024), (f"{letter}ib", 1024), (f"{letter}b", 1000))
}

format_bytes = binary_bytes  # the CLI's name of core.units' formatter


def parse_bytes(text: str) -> int:
    """Return the byte count of ``"8MiB"``, ``"4MB"``, ``"512k"`` or ``"1048576"``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write e.g. 8MiB, 4MB, 512KiB or 1048576")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


class ByteSize(_SizeParam):
    """A click parameter for sizes such as ``8MiB`` or ``4MB``."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Parse the size, or fail with a usage error."""
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class ImageSize(_ShapeParam):
    """A click parameter for an image size: ``N`` (a square) or ``H,W`` (or ``H W``, below)."""

    name = "image size"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        """Parse ``N`` or ``H,W`` into ``(H, W)``, or fail with a usage error."""
        if isinstance(value, tuple):
            return value
        parts = str(value).replace("x", ",").split(",")
        if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
            self.fail(
                f"should be N (N x N) or H,W (or H W), e.g. 256 or 256,320, but got {value!r}"
            )
        numbers = tuple(int(p) for p in parts)
        return numbers * 2 if len(numbers) == 1 else numbers


class ImageSizeOption(click.Option):
    """An option taking ``N``, ``H,W`` or the two values ``H W`` (its first spelling).

    click gives an option a fixed number of values, so the handler of click's parser
    (``_long_opt``, there since click 7) is wrapped to take a second bare integer.
    """

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        """Register the option, then wrap its handler to take ``H W`` as well."""
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            option = getattr(parser, "_long_opt", {}).get(name)
            if option is None:
                continue
            original = option.process

            def process(value: Any, state: Any, original: Any = original) -> None:
                rest = state.rargs
                if isinstance(value, str) and value.isdigit() and rest and rest[0].isdigit():
                    value = f"{value},{rest.pop(0)}"
                original(value, state)

            option.process = process


def size_flag(help: str) -> Callable[[F], F]:
    """``--size N|H,W`` (or ``H W``), with its ``help``."""
    return click.option(
        "--size", cls=ImageSizeOption, type=ImageSize(), default=None, metavar="N|H,W", help=help
    )


def _weights(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[float, ...] | None:
    """``--weights``: a mix's weights, one per source, ``3,1``."""
    try:
        weights = None if value is None else tuple(float(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(
            f"should be numbers separated by commas, e.g. 3,1, but got {value!r}"
        ) from None
    if weights is not None and any(not w > 0 for w in weights):
        raise click.BadParameter(f"should be positive numbers, e.g. 3,1, but got {value!r}")
    return weights


def mix_flags(function: F) -> F:
    """Add ``--weights`` and ``--epoch-samples`` (a mix of the sources given) to a command."""
    function = click.option(
        "--epoch-samples",
        type=click.IntRange(min=1),
        default=None,
        help="Samples per epoch of the mix [default: all samples of all sources].",
    )(function)
    return click.option(
        "--weights",
        default=None,
        callback=_weights,
        metavar="W1,W2,...",
        help="Mix the sources by weight, one weight per source (docs/mixing.md).",
    )(function)


def checked_mix(
    packs: tuple[str, ...], weights: tuple[float, ...] | None, epoch_samples: int | None
) -> tuple[float, ...] | None:
    """Return ``--weights`` (None: no mix), one per source, or fail with a usage error."""
    if weights is None and epoch_samples is not None:
        raise click.BadParameter("--epoch-samples applies to a mix: add --weights")
    if weights is not None and len(weights) != len(packs):
        raise click.BadParameter(
            f"should give one weight per source ({len(packs)}), but got {len(weights)}",
            param_hint="--weights",
        )
    return weights


class ChunkShape(_ShapeParam):
    """A click parameter for a chunk shape ``k,H,W,C`` (or ``kxHxWxC``)."""

    name = "k,H,W,C"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        """Parse the shape, or fail with a usage error."""
        if isinstance(value, tuple):
            return value
        try:
            return tuple(int(p) for p in re.split(r"[,x]", str(value).strip()))
        except ValueError:
            self.fail(f"{value!r} is not a chunk shape; write e.g. 16,224,224,3", param, ctx)


_CONVERT_FLAGS: list[Callable[[F], F]] = [
    click.option(
        "--mode",
        type=click.Choice(MODE_CHOICES),
        default="auto",
        show_default=True,
        help="raw pixels, encoded file bytes, or auto: raw when all images share one size.",
    ),
    size_flag("Resize every image to N x N or H x W (raw mode; H W works too)."),
    click.option(
        "--resize",
        type=click.Choice(RESIZE_METHODS),
        default="stretch",
        show_default=True,
        help="How --size is reached.",
    ),
    click.option(
        "--channels", type=click.Choice([str(c) for c in CHANNELS]), default="3", show_default=True
    ),
    click.option("--backend", type=click.Choice(BACKENDS), default="pillow", show_default=True),
    click.option(
        "--layout",
        type=click.Choice(LAYOUT_CHOICES),
        default="auto",
        show_default=True,
        help="auto: contiguous for uncompressed images of several sizes, else chunked.",
    ),
    click.option("--chunk-samples", type=int, default=None, help="Samples per chunk."),
    click.option("--chunk-shape", type=ChunkShape(), default=None, help="Explicit k,H,W,C."),
    click.option(
        "--chunk-bytes", type=ByteSize(), default=None, help="Bytes per chunk, e.g. 8MiB."
    ),
    click.option("--compression", type=click.Choice(CODECS), default="none", show_default=True),
    click.option("--level", type=int, default=None, help="Compression level."),
    click.option(
        "--shuffle-filter",
        "filter_shuffle",
        type=click.Choice(SHUFFLES),
        default="none",
        show_default=True,
        help="The byte or bit shuffle filter on each chunk before compression.",
    ),
    # the filter's first spelling, which read like the write-time shuffle: still taken
    click.option("--shuffle", "filter_shuffle_alias", type=click.Choice(SHUFFLES), hidden=True),
    click.option("--seed", type=int, default=0, show_default=True, help="Write-order seed."),
    click.option(
        "--no-shuffle", is_flag=True, help="Keep the source order: no write-time shuffle."
    ),
    click.option("--max-side", type=int, default=None, help="Encoded: re-encode larger images."),
    click.option("--quality", type=int, default=None, help="JPEG quality of re-encoded images."),
    click.option(
        "--workers", type=int, default=None, help="Worker processes [default: all cores]."
    ),
    click.option(
        "--labels",
        "labels_csv",
        type=click.Path(dir_okay=False),
        default=None,
        help="A manifest of the images: CSV (path,label; with a header, more columns) or "
        "JSONL; columns become fields (docs/converting.md).",
    ),
    click.option("--strict", is_flag=True, help="Stop at the first file that cannot be packed."),
]


def convert_flags(function: F) -> F:
    """Add every conversion flag to a command (read them back with ``options_from_flags``)."""
    for option in reversed(_CONVERT_FLAGS):
        function = option(function)
    return function


def options_from_flags(flags: dict[str, Any]) -> Any:
    """Return the ``ConvertOptions`` of the flags added by ``convert_flags``."""
    from h5pack.write.options import ConvertOptions, option_name

    codec, level = flags["compression"], flags["level"]
    if level is not None and codec in LEVELS:  # else Compression says --level does not apply
        low, high, _ = LEVELS[codec]
        if not low <= level <= high:
            raise OptionsError(
                f"{option_name('level')} for {codec} should be in {low}..{high}, but got {level}"
            )
    return ConvertOptions(
        mode=flags["mode"],
        size=flags["size"],
        resize=flags["resize"],
        channels=int(flags["channels"]),
        backend=flags["backend"],
        layout=flags["layout"],
        chunk_samples=flags["chunk_samples"],
        chunk_shape=flags["chunk_shape"],
        chunk_bytes=flags["chunk_bytes"],
        compression=Compression(
            codec=codec,
            level=level,
            shuffle=flags.get("filter_shuffle_alias") or flags["filter_shuffle"],
        ),
        shuffle_samples=not flags["no_shuffle"],
        seed=flags["seed"],
        max_side=flags["max_side"],
        quality=flags["quality"],
        workers=flags["workers"] or None,
        strict=flags["strict"],
        labels_csv=flags["labels_csv"],
    )


quiet_flag = click.option("--quiet", "-q", is_flag=True, help="No progress bar or notes.")


def store_of(path: str | Sequence[str], pairs: tuple[str, ...]) -> Store:
    """Return the store of ``path`` with the ``--storage-option KEY=VALUE`` flags."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"should be KEY=VALUE (e.g. endpoint=http://127.0.0.1:9000), but got {pair!r}",
                param_hint="--storage-option",
            )
        options[key.strip()] = value
    return open_store(path, options or None)


storage_option_flag = click.option(
    "--storage-option",
    "storage_option",
    multiple=True,
    metavar="KEY=VALUE",
    help="For URLs (s3://, gs://, az://, https://): a client setting the environment does not "
    "give, e.g. endpoint=http://127.0.0.1:9000, region=..., retry_timeout_s=60 "
    "(docs/object-storage.md); repeatable.",
)

staging_flag = click.option(
    "--staging-dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    metavar="DIR",
    help="For a URL target: where each pack is written whole before it is uploaded "
    "[default: TMPDIR]; room for the largest pack (a merge: its sources and result).",
)
