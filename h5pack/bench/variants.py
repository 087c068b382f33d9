"""Pack variants that ``compare`` builds: a small grammar, the default matrices, options.

A variant is named by dash-separated tokens, mode first::

    raw-contig              raw pixels, contiguous (no chunks, no filter)
    raw-c64-gzip            raw pixels, 64 samples per chunk, gzip at its default level
    raw-4m-zstd:5-bit       raw pixels, ~4 MiB chunks, zstd level 5, bit shuffle
    encoded-1m              the image files' bytes, a blob in 1 MiB chunks

Tokens: ``raw`` | ``encoded``; ``contig``; ``c<N>`` (samples per chunk); ``<N>k`` /
``<N>m`` (chunk bytes); a codec of ``layout.CODECS``, optionally ``:<level>``; ``byte`` |
``bit`` (filter shuffle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from h5pack.bench.reading import SizeSurvey
from h5pack.core.layout import CODECS, Compression
from h5pack.errors import OptionsError
from h5pack.write.options import ConvertOptions

_SIZE = re.compile(r"^(\d+)([km])$")
_SAMPLES = re.compile(r"^c(\d+)$")


@dataclass(frozen=True, kw_only=True)
class VariantSpec:
    """One pack layout to build and measure (``chunk_bytes``: exact for encoded blobs)."""

    mode: str
    contiguous: bool = False
    chunk_samples: int | None = None
    chunk_bytes: int | None = None
    compression: Compression = field(default_factory=Compression)

    def _parts(self) -> list[tuple[str, list[str]]]:
        """Each token of the name after the mode, with the convert flags it stands for."""
        parts: list[tuple[str, list[str]]] = []
        if self.contiguous:
            parts.append(("contig", ["--layout", "contiguous"]))
        elif self.chunk_samples is not None:
            parts.append((f"c{self.chunk_samples}", ["--chunk-samples", str(self.chunk_samples)]))
        elif self.chunk_bytes is not None:
            parts.append((_bytes_token(self.chunk_bytes), ["--chunk-bytes", str(self.chunk_bytes)]))
        codec = self.compression
        if codec.codec != "none":
            level = [] if codec.level is None else ["--level", str(codec.level)]
            token = codec.codec if codec.level is None else f"{codec.codec}:{codec.level}"
            parts.append((token, ["--compression", codec.codec, *level]))
            if codec.shuffle != "none":
                parts.append((codec.shuffle, ["--shuffle-filter", codec.shuffle]))
        return parts

    @property
    def name(self) -> str:
        """The canonical name, e.g. ``"raw-c64-gzip:4"``."""
        return "-".join([self.mode, *(token for token, _ in self._parts())])

    def options(
        self, *, size: tuple[int, int] | None = None, workers: int | None = None, seed: int = 0
    ) -> ConvertOptions:
        """Return the conversion options that build this variant (``size``: raw variants')."""
        return ConvertOptions(
            mode="raw" if self.mode == "raw" else "encoded",
            size=size if self.mode == "raw" else None,
            layout="contiguous" if self.contiguous else "chunked",
            chunk_samples=self.chunk_samples,
            chunk_bytes=self.chunk_bytes,
            compression=self.compression,
            workers=workers,
            seed=seed,
        )

    def command(
        self,
        source: str = "IMAGES/",
        target: str = "out.h5",
        *,
        size: tuple[int, int] | None = None,
    ) -> str:
        """Return the ``h5pack convert`` command line that builds this variant."""
        words = ["h5pack", "convert", source, target, "--mode", self.mode]
        if size is not None and self.mode == "raw":
            words += ["--size", str(size[0]), str(size[1])]
        return " ".join(words + [flag for _, flags in self._parts() for flag in flags])


def _bytes_token(nbytes: int) -> str:
    if nbytes % 2**20 == 0:
        return f"{nbytes // 2**20}m"
    if nbytes % 2**10 == 0:
        return f"{nbytes // 2**10}k"
    raise OptionsError(f"variant chunk sizes are whole KiB, but got {nbytes} bytes")


def parse_variant(text: str) -> VariantSpec:
    """Return the variant named ``text`` (see the module docstring for the grammar).

    Raises:
        OptionsError: the name does not parse, or names an impossible combination.
    """
    tokens = [t for t in text.strip().lower().split("-") if t]
    if not tokens or tokens[0] not in ("raw", "encoded"):
        raise OptionsError(
            f"a variant starts with raw or encoded (e.g. raw-c64-gzip, encoded-1m), "
            f"but got {text!r}"
        )
    rest = tokens[1:]
    contiguous = False
    chunk_samples = chunk_bytes = level = None
    codec = shuffle = "none"
    position = 0
    while position < len(rest):
        token = rest[position]
        joined = "-".join(rest[position : position + 2]).split(":")[0]
        if joined in CODECS and "-" in joined:  # blosc-lz4 spans two tokens
            token = "-".join(rest[position : position + 2])
            position += 1
        position += 1
        name, _, level_text = token.partition(":")
        size, samples = _SIZE.match(token), _SAMPLES.match(token)
        if token == "contig":
            contiguous = True
        elif samples:
            chunk_samples = int(samples.group(1))
        elif size:
            chunk_bytes = int(size.group(1)) * (2**10 if size.group(2) == "k" else 2**20)
        elif name in CODECS:
            codec = name
            if level_text and not level_text.isdigit():
                raise OptionsError(f"a codec level is a number, but got {token!r} in {text!r}")
            level = int(level_text) if level_text else None
        elif token in ("byte", "bit"):
            shuffle = token
        else:
            raise OptionsError(
                f"unknown token {token!r} in variant {text!r}: use contig, c<N>, <N>k, <N>m, "
                f"a codec ({', '.join(CODECS)}[:level]), byte or bit"
            )
    spec = VariantSpec(
        mode=tokens[0],
        contiguous=contiguous,
        chunk_samples=chunk_samples,
        chunk_bytes=chunk_bytes,
        compression=Compression(codec=codec, level=level, shuffle=shuffle),
    )
    spec.options()  # refuse impossible combinations now, before any work
    return spec


def parse_variants(texts: str | list[str] | tuple[str, ...]) -> list[VariantSpec]:
    """Return the variants of comma- (or space-) separated names, without duplicates."""
    items = [texts] if isinstance(texts, str) else list(texts)
    names = [n for item in items for n in re.split(r"[,\s]+", item) if n]
    if not names:
        raise OptionsError("give at least one variant, e.g. raw-contig,raw-c64-gzip")
    seen: dict[str, VariantSpec] = {}
    for name in names:
        spec = parse_variant(name)
        seen.setdefault(spec.name, spec)
    return list(seen.values())


# A full comparison: contiguous vs chunked, chunks of one sample to 16 MiB, every codec at
# one chunk size, raw vs encoded.
DEFAULT_VARIANTS: tuple[str, ...] = (
    "raw-contig",
    "raw-c1-zstd",
    "raw-1m",
    "raw-1m-zstd",
    "raw-4m",
    "raw-4m-gzip",
    "raw-4m-lzf",
    "raw-4m-lz4",
    "raw-4m-zstd",
    "raw-16m-zstd",
    "encoded-contig",
    "encoded-1m",
)

# ``--quick``: one of each kind, all readable without plugins.
QUICK_VARIANTS: tuple[str, ...] = ("raw-contig", "raw-c1-gzip", "raw-16m-gzip", "encoded-1m")

# ``--quick`` for images of several sizes stored at their own size: raw pixels are then a
# byte blob chunked by bytes (no "one sample per chunk"); encoded gets a contiguous variant.
QUICK_VARIANTS_MIXED: tuple[str, ...] = (
    "raw-contig",
    "raw-16m-gzip",
    "encoded-contig",
    "encoded-1m",
)


@dataclass(frozen=True)
class VariantChoice:
    """The variants a comparison builds, and why, in the user's terms."""

    names: tuple[str, ...]
    reason: str


def _stored_sizes(survey: SizeSurvey, size: tuple[int, int] | None) -> bool:
    """Whether raw pixels would be stored at each image's own, differing size."""
    return size is None and not survey.uniform


def quick_variants(survey: SizeSurvey, size: tuple[int, int] | None = None) -> VariantChoice:
    """Return the ``--quick`` variants that images of ``survey`` stored at ``size`` allow."""
    if _stored_sizes(survey, size):
        return VariantChoice(
            QUICK_VARIANTS_MIXED,
            f"The images have {survey.describe()}. Raw pixels of several sizes are stored "
            "at each image's own size in one byte blob, which cannot hold exactly one image "
            "per chunk, so the quick comparison builds raw pixels contiguous and in 16 MiB "
            "gzip chunks, and the image files as they are, contiguous and in 1 MiB chunks.",
        )
    if size is not None:
        stored = f"Raw pixels are stored at {size[1]}x{size[0]} (W x H)"
    else:
        stored = f"The images have {survey.describe()}, so raw pixels are stored as they are"
    return VariantChoice(
        QUICK_VARIANTS,
        f"{stored}: the quick comparison builds one layout of each kind, raw pixels "
        "contiguous, one image per gzip chunk and 16 MiB gzip chunks, and the image files as "
        "they are in 1 MiB chunks.",
    )


def variant_problem(
    spec: VariantSpec, survey: SizeSurvey, size: tuple[int, int] | None = None
) -> str | None:
    """Return why ``spec`` cannot be built from images of ``survey``, in its own terms, or None."""
    if spec.mode == "raw" and spec.chunk_samples is not None and _stored_sizes(survey, size):
        count = spec.chunk_samples
        images = "one image" if count == 1 else f"{count} images"
        return (
            f"c{count} stores {images} per chunk, which needs images of one size, and these "
            f"have {survey.describe()}: raw pixels of several sizes are chunked by bytes "
            "(e.g. raw-1m-gzip)"
        )
    return None


@dataclass(frozen=True)
class SkippedVariant:
    """A variant that could not be built, and why."""

    name: str
    reason: str


def choose_variants(
    variants: tuple[str, ...] | str, survey: SizeSurvey, size: tuple[int, int] | None
) -> tuple[list[VariantSpec], list[SkippedVariant], str]:
    """Return the variants to build, those the images do not allow (and why), and the plan."""
    choice = quick_variants(survey, size) if variants == "quick" else None
    specs, skipped = [], []
    for spec in parse_variants(list(choice.names if choice else variants)):
        problem = variant_problem(spec, survey, size)
        if problem is None:
            specs.append(spec)
        else:
            skipped.append(SkippedVariant(spec.name, problem))
    return specs, skipped, choice.reason if choice else ""
