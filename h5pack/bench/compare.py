"""``compare``: build pack variants of one image folder (or take packs) and measure each.

Every variant is read as training will read it (``TrainingRead``) under each access
pattern through one loader, and recommended only when the loader can batch it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.bench.measure import MeasureOptions, measure_pack
from h5pack.bench.ranking import Recommendation, VariantResult, pixel_groups, rank_key, recommend
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
from h5pack.bench.system import (
    Machine,
    is_set_path,
    machine_info,
    pack_files,
    source_bytes,
    unique_names,
)
from h5pack.bench.variants import (
    DEFAULT_VARIANTS,
    SkippedVariant,
    VariantSpec,
    choose_variants,
    parse_variants,
)
from h5pack.core.machine import available_memory_bytes
from h5pack.core.store import Store, is_url, open_store
from h5pack.errors import OptionsError, SourceError
from h5pack.read.packset import describe


@dataclass(frozen=True)
class CompareEvent:
    """Progress of a comparison (a ``phase`` of ``total`` steps, ``step``, ``status``...)."""

    kind: Literal["phase", "step", "status", "skipped"]
    message: str
    total: int | None = None
    unit: str = "step"


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """What ``compare`` builds and how it measures.

    ``variants``: names (``bench.variants``) or ``"quick"``; ``size``: what raw variants
    are stored at (None: the images' own); ``measure.train`` is set by ``compare``;
    ``across_pixels``: see "Like with like" in ``bench.ranking``.
    """

    variants: tuple[str, ...] | Literal["quick"] = DEFAULT_VARIANTS
    size: tuple[int, int] | None = None
    train: TrainChoice = "auto"
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    convert_workers: int | None = None
    seed: int = 0
    across_pixels: bool = False

    def __post_init__(self) -> None:
        if self.variants != "quick":
            parse_variants(list(self.variants))  # refuse a bad name before any work

    @classmethod
    def quick(cls, **changes: Any) -> CompareOptions:
        """Return the ``--quick`` settings: four variants, two repeats, short budgets."""
        measure = MeasureOptions(repeats=2, min_run_s=0.1, epoch_budget_s=2.0, budget_s=5.0)
        return cls(**{"variants": "quick", "measure": measure, **changes})


@dataclass(frozen=True, kw_only=True)
class CompareReport:
    """Everything ``compare`` measured."""

    source: str  # the image folder, or the packs given
    variants: tuple[VariantResult, ...]  # fastest first within each kind of pixels
    skipped: tuple[SkippedVariant, ...]
    machine: Machine
    options: CompareOptions
    recommendation: Recommendation | None
    work_dir: str | None  # where kept packs are
    train: dict[str, Any] = field(default_factory=dict)  # ``TrainingRead.to_json`` and a note
    sizes: str = ""  # the images' sizes, in words
    plan: str = ""  # why these variants were built ("" for packs and named variants)
    available_bytes: int | None = None  # memory available when it started

    @property
    def read_note(self) -> str:
        """One line: how the packs were read, and why when chosen automatically."""
        return str(self.train.get("note", ""))


def _measure(
    path: str,
    name: str,
    measure: MeasureOptions,
    emit: Callable[[CompareEvent], None],
    *,
    convert_s: float | None = None,
    command: str | None = None,
    keep: bool = True,
    store: Store | None = None,
) -> VariantResult:
    """Measure the pack ``path`` under each pattern of ``measure`` and describe it."""
    from h5pack.check import pack_info

    store = store or open_store(path)
    patterns = measure_pack(
        path, measure, on_step=lambda p: emit(CompareEvent("step", f"{name}: {p}")), store=store
    )
    info = pack_info(pack_files(path, store)[0], store=store)  # shards share one layout
    view = describe(path, store=store)
    meta = view.meta
    sizes = SizeSurvey.of((int(h), int(w)) for h, w, *_ in meta.shapes)
    assert isinstance(measure.train, TrainingRead)  # resolved by compare
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
        image_bytes=int(np.prod(meta.shapes, axis=1, dtype=np.int64).sum()),
        convert_s=convert_s,
        command=command,
        patterns=patterns,
        problem=batch_problem(sizes, measure.train),
        pixels=f"{meta.num_samples:,} images, {sizes.describe()}",
    )


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
        sources: A local image folder (the variants of ``options`` are built from it), or
            packs or pack sets, each measured as it is; packs and sets may be URLs.
        options: What to build and how to measure (default ``CompareOptions()``).
        work_dir: Where variants are written (default: a temporary folder).
        keep: Keep the variants built (else each is deleted once measured).
        on_event: Called with progress events.
        store: The store of the URLs among ``sources`` (None: the environment's settings).

    Raises:
        SourceError: a source does not exist, or several sources mix folders and packs.
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
    per_pack = len(options.measure.patterns) * (options.measure.repeats + options.measure.warmup)
    results: list[VariantResult] = []
    skipped: list[SkippedVariant] = []
    reason = ""
    kept_dir: str | None = None
    available = available_memory_bytes()
    if folder:
        emit(CompareEvent("status", "reading the image sizes"))
        survey = survey_folder(paths[0])
        train = resolve_training_read(options.train, survey)
        measure = replace(options.measure, train=train)
        specs, skipped, reason = choose_variants(options.variants, survey, options.size)
        for skip in skipped:
            emit(CompareEvent("skipped", f"skipped {skip.name}: {skip.reason}"))
        emit(CompareEvent("phase", f"building {len(specs)} variants", len(specs) * (1 + per_pack)))
        where = Path(work_dir or tempfile.mkdtemp(prefix="h5pack-compare-"))
        where.mkdir(parents=True, exist_ok=True)
        try:
            for spec in specs:
                built = _build_one(paths[0], spec, where, options, measure, emit, keep)
                if isinstance(built, SkippedVariant):
                    for _ in range(per_pack):
                        emit(CompareEvent("step", f"{spec.name}: skipped"))
                    skipped.append(built)
                else:
                    results.append(built)
        finally:
            if not keep and work_dir is None:
                shutil.rmtree(where, ignore_errors=True)
        kept_dir = os.fspath(where) if keep else None
    else:
        stores = {
            os.fspath(p): store if store is not None and is_url(p) else open_store(p) for p in paths
        }
        counts = Counter[tuple[int, int]]()
        for path in paths:
            counts.update(survey_pack(path, stores[os.fspath(path)]).counts)
        survey = SizeSurvey(dict(counts), counts.total(), counts.total())
        train = resolve_training_read(options.train, survey)
        measure = replace(options.measure, train=train)
        emit(CompareEvent("phase", f"measuring {len(paths)} packs", per_pack * len(paths)))
        for path, name in zip(paths, unique_names(paths), strict=True):
            emit(CompareEvent("status", f"measuring {name}"))
            kept = stores[os.fspath(path)]
            results.append(_measure(os.fspath(path), name, measure, emit, store=kept))
    ranked = tuple(
        result
        for group in ([results] if options.across_pixels else pixel_groups(results))
        for result in sorted(group, key=rank_key, reverse=True)
    )
    return CompareReport(
        source=os.fspath(paths[0]) if folder else ", ".join(map(os.fspath, paths)),
        variants=ranked,
        skipped=tuple(skipped),
        machine=machine_info(
            local[0] if local and not folder else (work_dir or tempfile.gettempdir())
        ),
        options=options,
        recommendation=recommend(
            ranked, train=train, available_bytes=available, across_pixels=options.across_pixels
        ),
        work_dir=kept_dir,
        train={**train.to_json(), "note": auto_note(train, survey)},
        sizes=survey.describe(),
        plan=reason,
        available_bytes=available,
    )


def _build_one(
    source: Path,
    spec: VariantSpec,
    where: Path,
    options: CompareOptions,
    measure: MeasureOptions,
    emit: Callable[[CompareEvent], None],
    keep: bool,
) -> VariantResult | SkippedVariant:
    """Convert ``source`` to ``spec`` in ``where`` and measure it (removed after, unless kept)."""
    from h5pack.write.convert import convert

    target = where / f"{spec.name.replace(':', '_')}.h5"
    emit(CompareEvent("status", f"converting {spec.name}"))
    settings = spec.options(size=options.size, workers=options.convert_workers, seed=options.seed)
    try:
        made = convert(source, target, settings, overwrite=True)
    except OptionsError as err:
        emit(CompareEvent("skipped", f"skipped {spec.name}: {err}"))
        emit(CompareEvent("step", f"{spec.name}: skipped"))
        return SkippedVariant(spec.name, str(err))
    emit(CompareEvent("step", f"{spec.name}: converted"))
    try:
        return _measure(
            os.fspath(target),
            spec.name,
            measure,
            emit,
            convert_s=made.elapsed_s,
            command=spec.command(os.fspath(source), target.name, size=options.size),
            keep=keep,
        )
    finally:
        if not keep:
            target.unlink(missing_ok=True)
