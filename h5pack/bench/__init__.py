"""Layout comparison and loader benchmarks; functions return data, the CLI renders it.

- ``compare``: build pack variants of an image folder (or take packs) and measure each
  under three access patterns (``h5pack compare``);
- ``bench_loader`` / ``diagnose``: throughput of given loader settings on one pack, and
  where the time goes (``h5pack bench``);
- ``measure_pack``: one pack under the three access patterns;
- ``h5pack.bench.report``: tables, report.json, report.md and plots.

Nothing here imports torch until a loader is measured.
"""

from __future__ import annotations

from h5pack.bench.access import PATTERNS, ReadCount, replay_h5py, replay_reader, storage_layout
from h5pack.bench.compare import (
    CompareEvent,
    CompareOptions,
    CompareReport,
    Recommendation,
    VariantResult,
    compare,
    recommend,
)
from h5pack.bench.measure import MeasureOptions, PatternResult, measure_pack
from h5pack.bench.system import Machine, drop_page_cache, machine_info, resident_fraction
from h5pack.bench.throughput import (
    BOTTLENECKS,
    BenchOptions,
    BenchResult,
    Diagnosis,
    bench_loader,
    diagnose,
)
from h5pack.bench.timing import Timing, time_repeats
from h5pack.bench.variants import (
    DEFAULT_VARIANTS,
    QUICK_VARIANTS,
    VariantSpec,
    parse_variant,
    parse_variants,
)

__all__ = [
    "BOTTLENECKS",
    "DEFAULT_VARIANTS",
    "PATTERNS",
    "QUICK_VARIANTS",
    "BenchOptions",
    "BenchResult",
    "CompareEvent",
    "CompareOptions",
    "CompareReport",
    "Diagnosis",
    "Machine",
    "MeasureOptions",
    "PatternResult",
    "ReadCount",
    "Recommendation",
    "Timing",
    "VariantResult",
    "VariantSpec",
    "bench_loader",
    "compare",
    "diagnose",
    "drop_page_cache",
    "machine_info",
    "measure_pack",
    "parse_variant",
    "parse_variants",
    "recommend",
    "replay_h5py",
    "replay_reader",
    "resident_fraction",
    "storage_layout",
    "time_repeats",
]
