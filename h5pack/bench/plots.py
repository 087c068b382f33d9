"""The PNG plots of ``compare``'s report (the ``plot`` extra: matplotlib)."""

from __future__ import annotations

from pathlib import Path

from h5pack._types import StrPath
from h5pack.bench.access import PATTERN_TITLES, PATTERNS
from h5pack.bench.compare import CompareReport
from h5pack.errors import install_line

PLOT_HINT = f"PNG plots need matplotlib: {install_line('plot')}"


def plots_available() -> bool:
    """Return whether matplotlib can be imported (the ``plot`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


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
        f"{v.name}\n(contiguous)"
        if v.layout == "contiguous"
        else f"{v.name}\n({v.samples_per_chunk:.0f}/chunk)"
        for v in variants
    ]
    patterns = [p for p in PATTERNS if any(p in v.patterns for v in variants)]
    figure, axes = plt.subplots(figsize=(max(6.0, 1.1 * len(variants) + 2), 4.8))
    width = 0.8 / max(1, len(patterns))
    for k, pattern in enumerate(patterns):
        rates = [v.rate(pattern) for v in variants]
        errors = [
            [
                max(0.0, v.rate(pattern) - v.patterns[pattern].timing.low),
                max(0.0, v.patterns[pattern].timing.high - v.rate(pattern)),
            ]
            if pattern in v.patterns
            else [0.0, 0.0]
            for v in variants
        ]
        positions = [i + (k - (len(patterns) - 1) / 2) * width for i in range(len(variants))]
        axes.bar(
            positions,
            rates,
            width,
            yerr=list(zip(*errors, strict=True)) if errors else None,
            label=PATTERN_TITLES[pattern],
            capsize=2,
        )
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
        axes.scatter(v.file_bytes / 1e6, v.rate("chunk") or v.rate("sequential"), s=30)
        axes.annotate(
            v.name,
            (v.file_bytes / 1e6, v.rate("chunk") or v.rate("sequential")),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
        )
    axes.set_xlabel("file size (MB)")
    axes.set_ylabel("chunk-aware images/s (median)")
    axes.set_title("File size vs throughput (up and left is better)")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    second = out / "size_vs_throughput.png"
    figure.savefig(second, dpi=110)
    plt.close(figure)
    return [first, second]
