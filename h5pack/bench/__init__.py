"""Layout comparison (``compare``), loader benchmarks (``bench_loader``) and mixes (``mix_plan``).

Functions return data (result types live in their modules); ``bench.report`` and the CLI
render it. Nothing here imports torch until a loader is measured.
"""

from __future__ import annotations

from h5pack.bench.access import pack_shape
from h5pack.bench.compare import CompareOptions, compare
from h5pack.bench.loaders import FullShuffleBatchSampler, PatternLoader
from h5pack.bench.measure import BenchOptions, MeasureOptions, bench_loader, measure_pack
from h5pack.bench.mixture import bench_mix, mix_plan
from h5pack.bench.ranking import recommend
from h5pack.bench.reading import TrainingRead
from h5pack.bench.timing import time_interleaved
from h5pack.bench.variants import parse_variant, parse_variants, quick_variants

__all__ = [
    "BenchOptions",
    "CompareOptions",
    "FullShuffleBatchSampler",
    "MeasureOptions",
    "PatternLoader",
    "TrainingRead",
    "bench_loader",
    "bench_mix",
    "compare",
    "measure_pack",
    "mix_plan",
    "pack_shape",
    "parse_variant",
    "parse_variants",
    "quick_variants",
    "recommend",
    "time_interleaved",
]
