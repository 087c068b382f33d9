"""Layout comparison and loader benchmarks; functions return data, the CLI renders it.

- ``compare``: build pack variants of an image folder (or take packs) and measure each as
  training will read it, every access pattern through one loader (``h5pack compare``);
- ``bench_loader``: throughput of given loader settings on one pack (``h5pack bench``);
- ``mix_plan`` / ``bench_mix``: a mix of sources by weight (``info``/``bench --weights``);
- ``h5pack.bench.report``: tables, report.json, report.md and plots.

Nothing here imports torch until a loader is measured.
"""

from __future__ import annotations

from h5pack.bench.access import PATTERNS, PackShape, ReadCount, pack_shape
from h5pack.bench.compare import CompareReport, compare
from h5pack.bench.loaders import FullShuffleBatchSampler, PatternLoader
from h5pack.bench.measure import BenchResult, PatternResult, bench_loader, measure_pack
from h5pack.bench.mixture import MixBench, MixPlan, bench_mix, mix_plan
from h5pack.bench.options import BenchOptions, CompareEvent, CompareOptions, MeasureOptions
from h5pack.bench.ranking import Recommendation, VariantResult, recommend
from h5pack.bench.reading import SizeSurvey, TrainingRead, survey_folder, survey_pack
from h5pack.bench.system import Machine, machine_info
from h5pack.bench.timing import Timing, time_interleaved
from h5pack.bench.variants import (
    DEFAULT_VARIANTS,
    QUICK_VARIANTS,
    QUICK_VARIANTS_MIXED,
    VariantSpec,
    parse_variant,
    parse_variants,
    quick_variants,
)

__all__ = [
    "DEFAULT_VARIANTS",
    "PATTERNS",
    "QUICK_VARIANTS",
    "QUICK_VARIANTS_MIXED",
    "BenchOptions",
    "BenchResult",
    "CompareEvent",
    "CompareOptions",
    "CompareReport",
    "FullShuffleBatchSampler",
    "Machine",
    "MeasureOptions",
    "MixBench",
    "MixPlan",
    "PackShape",
    "PatternLoader",
    "PatternResult",
    "ReadCount",
    "Recommendation",
    "SizeSurvey",
    "Timing",
    "TrainingRead",
    "VariantResult",
    "VariantSpec",
    "bench_loader",
    "bench_mix",
    "compare",
    "machine_info",
    "measure_pack",
    "mix_plan",
    "pack_shape",
    "parse_variant",
    "parse_variants",
    "quick_variants",
    "recommend",
    "survey_folder",
    "survey_pack",
    "time_interleaved",
]
