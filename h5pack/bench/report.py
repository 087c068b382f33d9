"""Render ``compare``'s results: the ranked table, report.json, report.md and PNG plots."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.bench.access import PATTERN_TITLES, PATTERNS, ReadCount
from h5pack.bench.compare import CompareReport
from h5pack.bench.measure import BenchResult, PatternResult
from h5pack.bench.ranking import VariantResult, pixel_groups
from h5pack.bench.timing import Timing
from h5pack.core.store import Store
from h5pack.core.units import human_bytes
from h5pack.errors import install_line

PLOT_HINT = f"PNG plots need matplotlib: {install_line('plot')}"
NOT_CANDIDATE = "*"
PARTIAL = "†"
NOTES = (
    "random, chunk-aware and sequential: one dataset read through h5pack's loader in a "
    "full shuffle, in ChunkBatchSampler's order and in pack order, as training reads it.",
    "Throughput is the median of the timed runs (each of one or more whole epochs, or of "
    f"an epoch's first batches where marked {PARTIAL}), ± half the spread between the "
    "slowest and fastest; MB/s counts the bytes delivered; CPU/image is the chunk-aware "
    "runs' CPU time of the whole process tree (the loader's workers included) per image. "
    "Page cache warm. An epoch over a compressed pack starts from a fresh loader, so no "
    "decompressed chunk carries over between epochs.",
    "chunks/sample: chunks read whole (and decompressed when compressed) per sample, full "
    "shuffle → chunk-aware; read/sample: bytes read from the file per sample, likewise; "
    "both counted from the pack's chunks and the loader's window (see access.py's note "
    "'Chunk work per sample').",
    "shuffle: jump entropy of the chunk-aware order relative to a full shuffle (1.00 = as "
    "random by this measure, MosaicML Streaming's); it does not replace checking accuracy.",
    f"{NOT_CANDIDATE} after a name: the loader cannot batch this pack as read, so it is "
    "never recommended (see below the table).",
    f"{PARTIAL}N%: the figure rests on the first N% of an epoch, not whole epochs (a slow "
    "pattern is cut at --quick's short epoch budget), and so do its chunks/sample and "
    "read/sample; run without --quick for whole epochs.",
    "pixels/file: the decoded pixels' bytes over the file's (h5pack info's ratio is the "
    "stored bytes over the file's: the codec's compression alone).",
)
COLUMNS = (
    "#",
    "variant",
    "file",
    "pixels/file",
    "convert",
    "random img/s",
    "chunk-aware img/s",
    "sequential img/s",
    "MB/s",
    "chunks/sample",
    "read/sample",
    "shuffle",
    "CPU/image",
)


def _rate(result: PatternResult | None, *, spread: bool = False) -> str:
    if result is None:
        return "-"
    text = f"{result.images_per_s:,.0f}"
    text = f"{text} ±{50 * result.timing.spread:.0f}%" if spread else text
    return text + (f"{PARTIAL}{100 * result.epoch_fraction:.0f}%" if result.partial else "")


def _pair(variant: VariantResult, attribute: str, as_bytes: bool) -> str:
    values = []
    for pattern in ("random", "chunk"):
        result = variant.patterns.get(pattern)
        if result is None:
            values.append("-")
            continue
        value = getattr(result.reads, attribute)
        text = human_bytes(value) if as_bytes else f"{value:.3g}"
        values.append(text + (PARTIAL if result.partial else ""))
    return " → ".join(values)


def pixels_line(report: CompareReport) -> str | None:
    """Return the legend of the table's kinds of pixels (A, B...) when it ranks them apart."""
    groups = pixel_groups(report.variants)
    if len(groups) < 2 or report.options.across_pixels:  # the recommendation says so then
        return None
    kinds = "; ".join(f"{chr(65 + k)} = {g[0].pixels}" for k, g in enumerate(groups))
    return (
        f"Ranked apart, since they hold different pixels: {kinds}. A smaller image reads "
        "faster but is other data; --across-pixels ranks every pack together."
    )


def table_rows(report: CompareReport) -> list[list[str]]:
    """Return the ranked table's rows (strings), one per variant, columns ``COLUMNS``."""
    together = report.options.across_pixels  # one group, else one per kind of pixels
    groups = [list(report.variants)] if together else pixel_groups(report.variants)
    ranks = [
        f"{chr(65 + g)}{rank}" if len(groups) > 1 else str(rank)
        for g, group in enumerate(groups)
        for rank in range(1, len(group) + 1)
    ]
    rows = []
    for rank, variant in zip(ranks, report.variants, strict=True):
        chunk = variant.patterns.get("chunk")
        cpu = chunk.timing.cpu_s_per_image if chunk is not None else None
        convert = variant.convert_s
        rows.append(
            [
                rank,
                variant.name + ("" if variant.batchable else f" {NOT_CANDIDATE}"),
                human_bytes(variant.file_bytes),
                f"{variant.pixels_per_file_byte:.2f}x",
                "-"
                if convert is None
                else f"{convert:.2f} s"
                if convert < 10
                else f"{convert:.0f} s",
                _rate(variant.patterns.get("random")),
                _rate(chunk, spread=True),
                _rate(variant.patterns.get("sequential")),
                f"{chunk.mb_per_s:,.0f}" if chunk else "-",
                _pair(variant, "chunks_per_sample", False),
                _pair(variant, "bytes_per_sample", True),
                f"{chunk.shuffle_vs_random:.2f}" if chunk else "-",
                "-" if cpu is None else f"{1e6 * cpu:,.0f} us",
            ]
        )
    return rows


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] = COLUMNS) -> str:
    """Return ``rows`` as an aligned plain-text table."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _preamble(report: CompareReport) -> list[str]:
    lines = [report.read_note, pixels_line(report), report.plan]
    return [line for line in lines if line]


def format_compare(report: CompareReport) -> str:
    """Return the comparison as a terminal would show it: how read, table, recommendation."""
    parts = [*_preamble(report), format_table(table_rows(report))]
    partial = [
        f"{v.name} ({p})" for v in report.variants for p, r in v.patterns.items() if r.partial
    ]
    if partial:
        parts.append(
            f"{PARTIAL}N%: timed on the first N% of an epoch, not whole epochs: "
            f"{', '.join(partial)}; its chunks/sample is that prefix's (without --quick, "
            "epochs run whole unless one takes over 10 s)."
        )
    parts += [f"skipped {s.name}: {s.reason}" for s in report.skipped]
    recommendation = report.recommendation
    if recommendation is not None:
        parts.append(recommendation.line)
        parts += [f"  {note}" for note in recommendation.notes]
        if recommendation.command:
            parts.append(f"  {recommendation.command}")
    return "\n".join(parts)


def markdown_table(rows: Sequence[Sequence[str]], header: Sequence[str] = COLUMNS) -> str:
    """Return ``rows`` as a GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(report: CompareReport, plots: Sequence[str] = ()) -> str:
    """Return report.md: what ran where, the ranked table, notes and plots."""
    measure = report.options.measure
    lines = [
        "# h5pack compare",
        "",
        f"Source: `{report.source}`  ",
        f"Machine: {report.machine.describe()}  ",
        f"Loader: batch size {measure.batch_size}, workers {measure.workers}, "
        f"{measure.repeats} repeats after {measure.warmup} warm-up epoch(s)",
        "",
    ]
    lines += [*_preamble(report), ""] if _preamble(report) else []
    recommendation = report.recommendation
    if recommendation is not None:
        lines += [f"**{recommendation.line}**", ""]
        lines += [f"- {note}" for note in recommendation.notes]
        lines += [""] if recommendation.notes else []
        if recommendation.command:
            lines += ["```", recommendation.command, "```", ""]
    lines += [markdown_table(table_rows(report)), ""]
    if report.skipped:
        lines += ["Skipped:", ""] + [f"- {s.name}: {s.reason}" for s in report.skipped] + [""]
    lines += ["Notes:", ""] + [f"- {note}" for note in NOTES] + [""]
    lines += [f"![{Path(plot).stem}]({Path(plot).name})\n" for plot in plots]
    lines += [] if plots else [f"({PLOT_HINT})", ""]
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value) if f.repr]  # not settings, secrets
        if isinstance(value, Timing | PatternResult | VariantResult | ReadCount):  # derived
            names += [n for n, a in vars(type(value)).items() if isinstance(a, property)]
        data = {name: _jsonable(getattr(value, name)) for name in names}
        if isinstance(value, PatternResult):
            data |= {k: data["reads"][k] for k in ("chunks_per_sample", "bytes_per_sample")}
        return data
    if isinstance(value, Store):  # its kind; its settings may hold credentials
        return type(value).__name__
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return value


def to_json(report: CompareReport | BenchResult) -> dict[str, Any]:
    """Return a result as JSON-ready data (derived rates included)."""
    return dict(_jsonable(report))


@dataclass(frozen=True)
class ReportFiles:
    """What ``write_report`` wrote; ``plot_message``: why there are no plots, or None."""

    json: Path
    markdown: Path
    plots: tuple[Path, ...]
    plot_message: str | None


def write_report(report: CompareReport, out_dir: StrPath, *, plots: bool = True) -> ReportFiles:
    """Write report.json, report.md and (with matplotlib) PNG plots into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, message = [], None
    if plots and report.variants:
        try:
            written = write_plots(report, out)
        except ImportError:  # no matplotlib (the ``plot`` extra)
            message = PLOT_HINT
    json_path = out / "report.json"
    json_path.write_text(json.dumps(to_json(report), indent=2) + "\n", encoding="utf-8")
    md_path = out / "report.md"
    md_path.write_text(to_markdown(report, [p.name for p in written]), encoding="utf-8")
    return ReportFiles(json_path, md_path, tuple(written), message)


def write_plots(report: CompareReport, out_dir: StrPath) -> list[Path]:
    """Write throughput.png and size_vs_throughput.png (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    # grouped by mode and codec, by chunk size inside a group
    variants = sorted(
        report.variants, key=lambda v: (v.mode, v.codec, v.layout, v.samples_per_chunk)
    )
    names = [
        v.name
        + ("\n(contiguous)" if v.layout == "contiguous" else f"\n({v.samples_per_chunk:.0f}/chunk)")
        for v in variants
    ]
    patterns = [p for p in PATTERNS if any(p in v.patterns for v in variants)]
    figure, axes = plt.subplots(figsize=(max(6.0, 1.1 * len(variants) + 2), 4.8))
    width = 0.8 / max(1, len(patterns))
    for k, pattern in enumerate(patterns):
        rates = [v.rate(pattern) for v in variants]
        spans = [v.interval(pattern) for v in variants]
        errors = [[r - low for r, (low, _) in zip(rates, spans, strict=True)]]
        errors.append([high - r for r, (_, high) in zip(rates, spans, strict=True)])
        positions = [i + (k - (len(patterns) - 1) / 2) * width for i in range(len(variants))]
        axes.bar(positions, rates, width, yerr=errors, label=PATTERN_TITLES[pattern], capsize=2)
    axes.set_yscale("log")
    axes.set_ylabel("images/s (median, log scale)")
    axes.set_xticks(range(len(variants)), names, rotation=45, ha="right", fontsize=8)
    axes.set_title("Throughput by variant (chunk size) and access pattern")
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    first = out / "throughput.png"
    figure.savefig(first, dpi=110)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(7.0, 4.8))
    for v in variants:
        point = (v.file_bytes / 1e6, v.rate("chunk") or v.rate("sequential"))
        axes.scatter(*point, s=30)
        axes.annotate(v.name, point, fontsize=7, xytext=(4, 3), textcoords="offset points")
    axes.set_xlabel("file size (MB)")
    axes.set_ylabel("chunk-aware images/s (median)")
    axes.set_title("File size vs throughput (up and left is better)")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    second = out / "size_vs_throughput.png"
    figure.savefig(second, dpi=110)
    plt.close(figure)
    return [first, second]
