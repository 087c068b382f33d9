"""``compare``: build pack variants of one image folder (or take packs) and measure each.

Every variant is read as training will read it (``TrainingRead``: the loader's size, crop
and flip) under each access pattern through one loader, and a variant is recommended only
when the loader can batch it (``h5pack.bench.ranking``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.bench.measure import PatternResult, measure_pack
from h5pack.bench.options import CompareEvent, CompareOptions, MeasureOptions
from h5pack.bench.ranking import (
    Recommendation,
    VariantResult,
    pixel_groups,
    rank_key,
    recommend,
)
from h5pack.bench.reading import (
    SizeSurvey,
    TrainingRead,
    auto_note,
    batch_problem,
    resolve_training_read,
    survey_folder,
    survey_pack,
)
from h5pack.bench.system import (
    Machine,
    is_set_path,
    machine_info,
    pack_files,
    source_bytes,
    unique_names,
)
from h5pack.bench.variants import (
    SkippedVariant,
    VariantSpec,
    choose_variants,
)
from h5pack.core.machine import available_memory_bytes
from h5pack.core.store import Store, is_url, open_store
from h5pack.errors import OptionsError, SourceError
from h5pack.read.packset import describe


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
    store: Store | None = None,
) -> VariantResult:
    from h5pack.check import pack_info

    # a set's shards share one layout
    store = store or open_store(path)
    info = pack_info(pack_files(path, store)[0], store=store)
    view = describe(path, store=store)
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
        file_bytes=source_bytes(path, store),
        image_bytes=image_bytes,
        convert_s=convert_s,
        command=command,
        patterns=patterns,
        problem=problem,
        pixels=f"{meta.num_samples:,} images, {sizes.describe()}",
    )


def steps_per_pack(measure: MeasureOptions) -> int:
    """Progress steps of measuring one pack."""
    return len(measure.patterns) * (measure.repeats + measure.warmup)


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
    measure: MeasureOptions


def _plan(options: CompareOptions, survey: SizeSurvey) -> _Plan:
    train = resolve_training_read(options.train, survey)
    available = options.memory_bytes or available_memory_bytes()
    return _Plan(train, survey, available, replace(options.measure, train=train))


def compare(
    sources: StrPath | Sequence[StrPath],
    options: CompareOptions | None = None,
    *,
    work_dir: StrPath | None = None,
    keep: bool = False,
    on_event: Callable[[CompareEvent], None] | None = None,
    store: Store | None = None,
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
        store: The store of the URLs among ``sources`` (``open_store`` with the client's
            settings; None: the environment's settings).

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
        emit(CompareEvent("status", "reading the image sizes"))
        plan = _plan(options, survey_folder(paths[0]))
        specs, skipped, reason = choose_variants(options.variants, plan.survey, options.size)
        for skip in skipped:
            emit(CompareEvent("skipped", f"skipped {skip.name}: {skip.reason}"))
        emit(CompareEvent("phase", f"building {len(specs)} variants", len(specs) * (1 + per_pack)))
        with _work_dir(work_dir, keep) as where:
            for spec in specs:
                result = _build_and_measure(paths[0], spec, where, options, plan, emit, keep)
                if isinstance(result, SkippedVariant):
                    for _ in range(per_pack):
                        emit(CompareEvent("step", f"{spec.name}: skipped"))
                    skipped.append(result)
                else:
                    results.append(result)
            kept_dir = os.fspath(where) if keep else None
    else:
        stores = {
            os.fspath(p): store if store is not None and is_url(p) else open_store(p) for p in paths
        }
        surveys = [survey_pack(path, stores[os.fspath(path)]) for path in paths]
        plan = _plan(options, _merged(surveys))
        emit(CompareEvent("phase", f"measuring {len(paths)} packs", per_pack * len(paths)))
        for path, name, own in zip(paths, unique_names(paths), surveys, strict=True):
            emit(CompareEvent("status", f"measuring {name}"))
            where_kept = stores[os.fspath(path)]
            patterns = measure_pack(
                path, plan.measure, on_step=_stepper(emit, name), store=where_kept
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
                    store=where_kept,
                )
            )
    ranked = tuple(
        result
        for group in ([results] if options.across_pixels else pixel_groups(results))
        for result in sorted(group, key=rank_key, reverse=True)
    )
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
    )


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


def _build_and_measure(
    source: Path,
    spec: VariantSpec,
    where: Path,
    options: CompareOptions,
    plan: _Plan,
    emit: Callable[[CompareEvent], None],
    keep: bool,
) -> VariantResult | SkippedVariant:
    from h5pack.write.convert import convert

    target = where / f"{spec.name.replace(':', '_')}.h5"
    emit(CompareEvent("status", f"converting {spec.name}"))
    try:
        report = convert(
            source,
            target,
            spec.options(size=options.size, workers=options.convert_workers, seed=options.seed),
            overwrite=True,
        )
    except OptionsError as err:
        emit(CompareEvent("skipped", f"skipped {spec.name}: {err}"))
        emit(CompareEvent("step", f"{spec.name}: skipped"))
        return SkippedVariant(spec.name, str(err))
    emit(CompareEvent("step", f"{spec.name}: converted"))
    try:
        patterns = measure_pack(target, plan.measure, on_step=_stepper(emit, spec.name))
        return _describe_pack(
            os.fspath(target),
            spec.name,
            convert_s=report.elapsed_s,
            command=spec.command(os.fspath(source), target.name, size=options.size),
            patterns=patterns,
            keep=keep,
            problem=batch_problem(survey_pack(target), plan.train),
        )
    finally:
        if not keep:
            target.unlink(missing_ok=True)
