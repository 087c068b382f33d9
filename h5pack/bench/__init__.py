"""Layout comparison and loader benchmarks; functions return data, the CLI renders it.

- ``compare``: build pack variants of an image folder (or take packs) and measure each as
  training will read it, every access pattern through one loader (``h5pack compare``);
- ``bench_loader``: throughput of given loader settings on one pack (``h5pack bench``);
- ``mix_plan`` / ``bench_mix``: a mix of sources by weight (``info``/``bench --weights``);
- ``h5pack.bench.report``: tables, report.json, report.md and plots.

Result types live in their modules (``bench.measure``, ``bench.ranking``...). Nothing here
imports torch until a loader is measured.
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
