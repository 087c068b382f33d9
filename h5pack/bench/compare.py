"""``compare``: build pack variants of one image folder (or take packs) and measure each.

Every variant is read as training will read it (``TrainingRead``: the loader's size, crop
and flip) under each access pattern through one loader, and a variant is recommended only
when the loader can batch it (``h5pack.bench.ranking``). A pack larger than the page cache
is measured with a cold cache (see the note "Packs larger than memory" there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.bench.access import NAIVE
from h5pack.bench.measure import MEASURED, MeasureOptions, PatternResult, measure_pack
from h5pack.bench.ranking import (
    Recommendation,
    SkippedVariant,
    VariantResult,
    front_runners,
    pixel_groups,
    rank_key,
    recommend,
)
from h5pack.bench.reading import (
    SizeSurvey,
    TrainChoice,
    TrainingRead,
    auto_note,
    batch_problem,
    resolve_training_read,
    survey_folder,
    survey_pack,
)
from h5pack.bench.scale import IMAGENET_TRAIN, ScaleProjection, project
from h5pack.bench.sources import is_set_path, pack_files, source_bytes
from h5pack.bench.system import Machine, machine_info
from h5pack.bench.variants import (
    DEFAULT_VARIANTS,
    VariantChoice,
    VariantSpec,
    parse_variants,
    quick_variants,
    variant_problem,
)
from h5pack.core.machine import available_memory_bytes
from h5pack.core.packset import MANIFEST_NAME
from h5pack.core.source import is_url
from h5pack.errors import OptionsError, SourceError
from h5pack.read.packset import describe
from h5pack.training.advice import CACHE_SHARE

EventKind = Literal["start", "step", "note"]


@dataclass(frozen=True)
class CompareEvent:
    """Progress of a comparison (the CLI renders it as a progress bar).

    Attributes:
        kind: ``"start"`` (``total`` steps follow), ``"step"`` (one done; ``message``
            says what runs next) or ``"note"`` (a variant skipped, a pack kept...).
        message: One line.
        total: Steps of the whole comparison (``"start"`` only).
    """

    kind: EventKind
    message: str
    total: int | None = None


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """What ``compare`` builds and how it measures.

    Attributes:
        variants: Variant names (``h5pack.bench.variants``) built from an image folder, or
            ``"quick"``: four chosen from what the folder's images allow
            (``variants.quick_variants``).
        size: ``(H, W)`` raw variants are stored at (the conversion's ``--size``); None
            keeps the images' size.
        train: How training reads the images (``TrainingRead``: size, crop, flip), or
            ``"auto"`` (see the note "Training size by default" in ``bench.reading``).
        measure: How each pack is measured (its ``train`` and ``cold`` are set per pack).
        convert_workers: Conversion processes (None: every core).
        memory_bytes: Memory available to the page cache; None reads it when the
            comparison starts.
        seed: Seed of the stored sample order.
        dataset_size: Samples of the training set the packs stand for: the report also
            projects each pack's chunk work per sample to that size (``bench.scale``);
            None: ImageNet-1k's 1,281,167, or the packs' own size when larger.
        across_pixels: Rank packs holding different pixels (other sizes or images)
            together, on speed alone (see "Like with like" in ``bench.ranking``).
    """

    variants: tuple[str, ...] | Literal["quick"] = DEFAULT_VARIANTS
    size: tuple[int, int] | None = None
    train: TrainChoice = "auto"
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    convert_workers: int | None = None
    memory_bytes: int | None = None
    seed: int = 0
    dataset_size: int | None = None
    across_pixels: bool = False

    def __post_init__(self) -> None:
        if self.dataset_size is not None and (
            isinstance(self.dataset_size, bool)
            or not isinstance(self.dataset_size, int)
            or self.dataset_size < 1
        ):
            raise OptionsError(
                "dataset_size should be a positive number of samples, but got "
                f"dataset_size={self.dataset_size!r}"
            )
        if self.variants != "quick":
            parse_variants(list(self.variants))  # refuse a bad name before any work
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise OptionsError(f"size should be two positive integers, but got size={self.size!r}")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise OptionsError(
                f"memory_bytes should be positive, but got memory_bytes={self.memory_bytes}"
            )
        if not (self.train == "auto" or isinstance(self.train, TrainingRead)):
            raise OptionsError(
                f"train should be a TrainingRead or 'auto', but got train={self.train!r}"
            )

    @classmethod
    def quick(cls, **changes: Any) -> CompareOptions:
        """Return the ``--quick`` settings: four variants, two repeats, short budgets."""
        measure = MeasureOptions(
            repeats=2,
            warmup=1,
            min_run_s=0.1,
            epoch_budget_s=2.0,
            naive_budget_s=0.25,
            naive_min_samples=8,
            budget_s=5.0,
        )
        return cls(**{"variants": "quick", "measure": measure, **changes})

    def to_json(self) -> dict[str, Any]:
        """Return the options as JSON-ready data."""
        data = dataclasses.asdict(self)
        data["variants"] = self.variants if self.variants == "quick" else list(self.variants)
        data["size"] = list(self.size) if self.size else None
        data["train"] = self.train if self.train == "auto" else self.train.to_json()
        data["measure"]["patterns"] = list(self.measure.patterns)
        data["measure"]["train"] = self.measure.train.to_json()
        return data


@dataclass(frozen=True, kw_only=True)
class CompareReport:
    """Everything ``compare`` measured.

    Attributes:
        source: The image folder, or the packs given.
        variants: Each measured variant, ranked by chunk-aware throughput (fastest first)
            among the packs holding the same pixels (the largest images first; see "Like
            with like" in ``bench.ranking``).
        skipped: Variants that could not be built.
        machine: Where it ran.
        options: The comparison's options (JSON-ready).
        recommendation: The variant to use, or None when nothing was measured.
        work_dir: Where kept packs are, else None.
        train: How the packs were read (``TrainingRead.to_json``).
        sizes: The images' sizes, in words.
        plan: Why these variants were built, or "" for given packs and named variants.
        available_bytes: Memory available when the comparison started (None: unknown).
        projections: Each chunked variant's chunk work per sample at the dataset size
            (``bench.scale``), in the ranking's order.
    """

    source: str
    variants: tuple[VariantResult, ...]
    skipped: tuple[SkippedVariant, ...]
    machine: Machine
    options: dict[str, Any]
    recommendation: Recommendation | None
    work_dir: str | None
    train: dict[str, Any] = field(default_factory=dict)
    sizes: str = ""
    plan: str = ""
    available_bytes: int | None = None
    projections: tuple[ScaleProjection, ...] = ()

    @property
    def read_note(self) -> str:
        """One line: how the packs were read, and why when chosen automatically."""
        return str(self.train.get("note", ""))


def _describe_pack(
    path: str,
    name: str,
    *,
    convert_s: float | None,
    command: str | None,
    patterns: dict[str, PatternResult],
    keep: bool,
    problem: str | None,
    cold: bool,
    storage_options: Mapping[str, Any] | None = None,
) -> VariantResult:
    from h5pack.check import pack_info

    # a set's shards share one layout
    info = pack_info(pack_files(path, storage_options)[0], storage_options=storage_options)
    view = describe(path, storage_options=storage_options)
    meta = view.meta
    image_bytes = int(np.prod(meta.shapes, axis=1, dtype=np.int64).sum())
    sizes = SizeSurvey.of((int(h), int(w)) for h, w, *_ in meta.shapes)
    return VariantResult(
        name=name,
        path=path if keep else None,
        mode=meta.mode,
        storage=meta.storage,
        layout=info.layout,
        codec=info.codec,
        chunk_bytes=info.chunk_bytes,
        samples_per_chunk=float(np.mean(view.chunk_map.sizes())) if meta.num_samples else 0.0,
        num_samples=meta.num_samples,
        file_bytes=source_bytes(path, storage_options),
        image_bytes=image_bytes,
        convert_s=convert_s,
        command=command,
        patterns=patterns,
        problem=problem,
        cold=cold,
        pixels=f"{meta.num_samples:,} images, {sizes.describe()}",
    )


def steps_per_pack(measure: MeasureOptions, *, remote: bool = False) -> int:
    """Progress steps of measuring one pack (a remote one: no naive read)."""
    steps = 0
    for pattern in MEASURED:
        if pattern in measure.patterns and not (remote and pattern == "naive"):
            steps += measure.repeats + (0 if pattern == "naive" else measure.warmup)
    return steps


@contextlib.contextmanager
def _work_dir(work_dir: StrPath | None, keep: bool) -> Iterator[Path]:
    if work_dir is not None:
        path = Path(work_dir)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    made = Path(tempfile.mkdtemp(prefix="h5pack-compare-"))
    try:
        yield made
    finally:
        if not keep:
            shutil.rmtree(made, ignore_errors=True)


@dataclass(frozen=True)
class _Plan:
    """What one comparison reads, and how: resolved once, before any work."""

    train: TrainingRead
    survey: SizeSurvey
    available_bytes: int | None
    cache_bytes: float | None

    def measure(self, options: MeasureOptions, file_bytes: int) -> MeasureOptions:
        cold = self.cache_bytes is not None and file_bytes > self.cache_bytes
        return dataclasses.replace(options, train=self.train, cold=cold)


def _plan(options: CompareOptions, survey: SizeSurvey) -> _Plan:
    available = options.memory_bytes or available_memory_bytes()
    return _Plan(
        train=resolve_training_read(options.train, survey),
        survey=survey,
        available_bytes=available,
        cache_bytes=CACHE_SHARE * available if available else None,
    )


def _choose_variants(
    options: CompareOptions, survey: SizeSurvey
) -> tuple[list[VariantSpec], list[SkippedVariant], str]:
    """Return the variants to build, those the images do not allow (and why), and the plan."""
    if options.variants == "quick":
        choice: VariantChoice = quick_variants(survey, options.size)
        names, reason = list(choice.names), choice.reason
    else:
        names, reason = list(options.variants), ""
    specs, skipped = [], []
    for spec in parse_variants(names):
        problem = variant_problem(spec, survey, options.size)
        if problem is None:
            specs.append(spec)
        else:
            skipped.append(SkippedVariant(spec.name, problem))
    return specs, skipped, reason


def compare(
    sources: StrPath | Sequence[StrPath],
    options: CompareOptions | None = None,
    *,
    work_dir: StrPath | None = None,
    keep: bool = False,
    on_event: Callable[[CompareEvent], None] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> CompareReport:
    """Measure pack layouts side by side on one image folder, or measure given packs.

    Args:
        sources: An image folder (the variants of ``options`` are built from it), or one
            or more packs or pack sets (a set's directory or manifest), each measured as it
            is: a set as one pack, through the loader's own support for sets. Packs and
            sets may be URLs (``s3://bucket/pack.h5``, a set's prefix or manifest); an
            image folder must be local (the variants are built on local disk).
        options: What to build and how to measure (default ``CompareOptions()``).
        work_dir: Where variants are written (default: a temporary folder).
        keep: Keep the variants built (else each is deleted once measured).
        on_event: Called with progress events.
        storage_options: The remote client's settings for URLs, beyond the environment's
            (never written into the report).

    Returns:
        The measurements, ranked, with a recommendation.

    Raises:
        SourceError: a source does not exist, or several sources mix folders and packs.
        FormatError: a given file is not a pack.
        OptionsError: a bad option.
    """
    options = options or CompareOptions()
    emit = on_event or (lambda event: None)
    items = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    # a URL stays a string (Path would fold its '//'); describe() says when it is missing
    paths: list[Any] = [os.fspath(p) if is_url(p) else Path(p) for p in items]
    if not paths:
        raise SourceError("give an image folder or at least one pack to compare")
    local = [p for p in paths if isinstance(p, Path)]
    for path in local:
        if not path.exists():
            raise SourceError(f"{path}: no such folder or pack")
    folder = len(local) == 1 == len(paths) and local[0].is_dir() and not is_set_path(local[0])
    if not folder and any(p.is_dir() and not is_set_path(p) for p in local):
        raise SourceError(
            "compare takes one image folder, or packs only (a pack set counts as one); "
            f"got a mix: {', '.join(map(str, paths))}"
        )
    per_pack = steps_per_pack(options.measure)
    results: list[VariantResult] = []
    skipped: list[SkippedVariant] = []
    kept_dir: str | None = None
    reason = ""
    if folder:
        emit(CompareEvent("note", "reading the image sizes"))
        survey = survey_folder(paths[0])
        plan = _plan(options, survey)
        specs, skipped, reason = _choose_variants(options, survey)
        for skip in skipped:
            emit(CompareEvent("note", f"skipped {skip.name}: {skip.reason}"))
        emit(CompareEvent("start", f"building {len(specs)} variants", len(specs) * (1 + per_pack)))
        with _work_dir(work_dir, keep) as where:
            for spec in specs:
                result = _build_and_measure(paths[0], spec, where, options, plan, emit)
                if isinstance(result, SkippedVariant):
                    for _ in range(per_pack):
                        emit(CompareEvent("step", f"{spec.name}: skipped"))
                    skipped.append(result)
                else:
                    results.append(result)
                    results = _pruned(results, keep)
            results = settle(results, options, plan.train, emit)
            if not keep:
                results = [_removed(r) for r in results]
            kept_dir = os.fspath(where) if keep else None
    else:
        surveys = [survey_pack(path, storage_options) for path in paths]
        survey = _merged(surveys)
        plan = _plan(options, survey)
        remote = [is_url(p) for p in paths]
        steps = sum(steps_per_pack(options.measure, remote=r) for r in remote)
        emit(CompareEvent("start", f"measuring {len(paths)} packs", steps))
        if any(remote) and NAIVE in options.measure.patterns:
            emit(CompareEvent("note", "a remote pack is measured through the loader only"))
        names = _unique_names(paths)
        for path, name, own in zip(paths, names, surveys, strict=True):
            emit(CompareEvent("note", f"measuring {name}"))
            measure = plan.measure(options.measure, source_bytes(path, storage_options))
            patterns = measure_pack(
                path, measure, on_step=_stepper(emit, name), storage_options=storage_options
            )
            results.append(
                _describe_pack(
                    os.fspath(path),
                    name,
                    convert_s=None,
                    command=None,
                    patterns=patterns,
                    keep=True,
                    problem=batch_problem(own, plan.train),
                    cold=measure.cold and not is_url(path),
                    storage_options=storage_options,
                )
            )
        results = settle(results, options, plan.train, emit)
    ranked = tuple(
        result
        for group in ([results] if options.across_pixels else pixel_groups(results))
        for result in sorted(group, key=rank_key, reverse=True)
    )
    projections = projections_of(ranked, options)
    train = {**plan.train.to_json(), "note": auto_note(plan.train, plan.survey)}
    return CompareReport(
        source=os.fspath(paths[0]) if folder else ", ".join(map(os.fspath, paths)),
        variants=ranked,
        skipped=tuple(skipped),
        machine=machine_info(
            local[0] if local and not folder else (work_dir or tempfile.gettempdir())
        ),
        options=options.to_json(),
        recommendation=recommend(
            ranked,
            train=plan.train,
            available_bytes=plan.available_bytes,
            across_pixels=options.across_pixels,
        ),
        work_dir=kept_dir,
        train=train,
        sizes=plan.survey.describe(),
        plan=reason,
        available_bytes=plan.available_bytes,
        projections=projections,
    )


def projections_of(
    ranked: Sequence[VariantResult], options: CompareOptions
) -> tuple[ScaleProjection, ...]:
    """Return each chunked variant's chunk work per sample at the dataset size.

    See the note "Why the gain is invisible on small data" in ``bench.scale``.
    """
    largest = max((v.num_samples for v in ranked), default=0)
    size = options.dataset_size or max(IMAGENET_TRAIN, largest)
    found = []
    for variant in ranked:
        measured = variant.patterns.get("chunk")
        workers = measured.workers if measured is not None else 0
        projection = project(variant, size, batch_size=options.measure.batch_size, workers=workers)
        if projection is not None:
            found.append(projection)
    return tuple(found)


def _merged(surveys: Sequence[SizeSurvey]) -> SizeSurvey:
    counts: dict[tuple[int, int], int] = {}
    for survey in surveys:
        for size, count in survey.counts.items():
            counts[size] = counts.get(size, 0) + count
    images = sum(counts.values())
    return SizeSurvey(counts, images, sum(s.total for s in surveys))


def _stepper(emit: Callable[[CompareEvent], None], name: str) -> Callable[[str], None]:
    def step(pattern: str) -> None:
        emit(CompareEvent("step", f"{name}: {pattern}"))

    return step


def _unique_names(paths: Sequence[Path | str]) -> list[str]:
    names = [_short_name(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [os.fspath(p) for p in paths]


def _short_name(path: Path | str) -> str:
    """A pack's stem, a set's folder name; a URL's last key part likewise."""
    if isinstance(path, str):  # a URL
        parts = [part for part in path.split("/") if part]
        last = parts[-1] if parts else path
        if last == MANIFEST_NAME or path.endswith("/"):
            return parts[-2] if last == MANIFEST_NAME and len(parts) > 1 else last
        return Path(last).stem
    return path.parent.name if is_set_path(path) and not path.is_dir() else path.stem


def _build_and_measure(
    source: Path,
    spec: VariantSpec,
    where: Path,
    options: CompareOptions,
    plan: _Plan,
    emit: Callable[[CompareEvent], None],
) -> VariantResult | SkippedVariant:
    from h5pack.write.convert import convert

    target = where / f"{spec.name.replace(':', '_')}.h5"
    emit(CompareEvent("note", f"converting {spec.name}"))
    try:
        report = convert(
            source,
            target,
            spec.options(size=options.size, workers=options.convert_workers, seed=options.seed),
            overwrite=True,
        )
    except OptionsError as err:
        emit(CompareEvent("note", f"skipped {spec.name}: {err}"))
        emit(CompareEvent("step", f"{spec.name}: skipped"))
        return SkippedVariant(spec.name, str(err))
    emit(CompareEvent("step", f"{spec.name}: converted"))
    try:
        measure = plan.measure(options.measure, os.path.getsize(target))
        patterns = measure_pack(target, measure, on_step=_stepper(emit, spec.name))
        return _describe_pack(
            os.fspath(target),
            spec.name,
            convert_s=report.elapsed_s,
            command=spec.command(os.fspath(source), target.name, size=options.size),
            patterns=patterns,
            keep=True,  # until the settling round; compare removes it unless kept
            problem=batch_problem(survey_pack(target), plan.train),
            cold=measure.cold,
        )
    except BaseException:
        target.unlink(missing_ok=True)
        raise


# A variant slower than this share of the fastest so far can no longer be a front-runner:
# its pack is removed at once (unless kept), so the disk holds a few packs at a time.
_SETTLE_SHARE = 0.5


def _removed(result: VariantResult) -> VariantResult:
    if result.path is not None:
        Path(result.path).unlink(missing_ok=True)
    return dataclasses.replace(result, path=None)


def _pruned(results: list[VariantResult], keep: bool) -> list[VariantResult]:
    """Remove the packs of variants that can no longer be front-runners (unless ``keep``)."""
    if keep:
        return results
    best = max((rank_key(r) for r in results if r.batchable), default=0.0)
    return [
        _removed(r) if not r.batchable or rank_key(r) < _SETTLE_SHARE * best else r for r in results
    ]


def settle(
    results: Sequence[VariantResult],
    options: CompareOptions,
    train: TrainingRead,
    emit: Callable[[CompareEvent], None] | None = None,
) -> list[VariantResult]:
    """Time the front-runners again side by side, their epochs alternating; return all.

    Each variant was measured on its own, minutes apart: a change in the machine's load in
    between moves one against another (see "A recommendation stable run to run" in
    ``bench.ranking``). The front-runners still on disk, measured warm, are read again in
    the chunk-aware order through ``time_interleaved`` (A B A B ...), and their chunk-aware
    timings are replaced by that round's.
    """
    from h5pack.bench.loaders import PatternLoader, open_dataset
    from h5pack.bench.measure import epoch_fraction
    from h5pack.bench.timing import time_interleaved

    measure = options.measure
    eligible = [
        r
        for r in results
        if r.batchable and r.path is not None and not r.cold and "chunk" in r.patterns
    ]
    front = front_runners(eligible)
    if len(front) < 2 or measure.repeats < 2 or "chunk" not in measure.patterns:
        return list(results)
    if emit is not None:
        emit(CompareEvent("note", f"timing {', '.join(r.name for r in front)} side by side"))
    loaders = {}
    try:
        for r in front:
            assert r.path is not None
            dataset = open_dataset(
                r.path,
                train,
                seed=measure.seed,
                cache=measure.cache,
                cache_bytes=measure.cache_bytes,
            )
            loaders[r.name] = PatternLoader(
                dataset,
                "chunk",
                batch_size=measure.batch_size,
                workers=measure.workers,
                seed=measure.seed,
                budget_s=measure.epoch_budget_s,
            )
        timings = time_interleaved(
            dict(loaders),
            repeats=max(3, measure.repeats),
            warmup=measure.warmup,
            min_run_s=measure.min_run_s,
            target_spread=measure.target_spread,
            budget_s=measure.budget_s,
        )
    finally:
        for loader in loaders.values():
            loader.close()
    settled = []
    for r in results:
        if r.name not in timings:
            settled.append(r)
            continue
        chunk = dataclasses.replace(
            r.patterns["chunk"],
            timing=timings[r.name],
            side_by_side=True,
            epoch_fraction=epoch_fraction(timings[r.name], r.num_samples),
        )
        settled.append(dataclasses.replace(r, patterns={**r.patterns, "chunk": chunk}))
    return settled
