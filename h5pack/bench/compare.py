"""``compare``: build pack variants of one image folder (or take packs) and measure each."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from h5pack._types import StrPath
from h5pack.bench.measure import MeasureOptions, PatternResult, measure_pack
from h5pack.bench.system import Machine, machine_info
from h5pack.bench.variants import DEFAULT_VARIANTS, QUICK_VARIANTS, VariantSpec, parse_variants
from h5pack.core import format as fmt
from h5pack.core.layout import chunk_map_of
from h5pack.errors import OptionsError, SourceError

EventKind = Literal["start", "step", "note"]

# A variant within this fraction of the fastest counts as "as fast" for the recommendation,
# which then prefers the smallest file among them.
AS_FAST = 0.9


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
        variants: Variant names (``h5pack.bench.variants``) built from an image folder.
        size: ``(H, W)`` of raw variants; None keeps the images' size.
        measure: How each pack is measured.
        convert_workers: Conversion processes (None: every core).
        seed: Seed of the stored sample order.
    """

    variants: tuple[str, ...] = DEFAULT_VARIANTS
    size: tuple[int, int] | None = None
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    convert_workers: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        parse_variants(list(self.variants))  # refuse a bad name before any work
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise OptionsError(f"size should be two positive integers, but got {self.size!r}")

    @classmethod
    def quick(cls, **changes: Any) -> CompareOptions:
        """Return the ``--quick`` settings: four variants, two repeats, short budgets."""
        measure = MeasureOptions(repeats=2, warmup=1, random_budget_s=0.25, random_min_samples=8)
        return cls(**{"variants": QUICK_VARIANTS, "measure": measure, **changes})

    def to_json(self) -> dict[str, Any]:
        """Return the options as JSON-ready data."""
        data = dataclasses.asdict(self)
        data["variants"] = list(self.variants)
        data["size"] = list(self.size) if self.size else None
        data["measure"]["patterns"] = list(self.measure.patterns)
        return data


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    """One pack measured.

    Attributes:
        name: The variant's name (or the pack's file name).
        path: The pack, or None when it was removed after measuring.
        mode: ``"raw"`` or ``"encoded"``.
        storage: ``"array"`` or ``"blob"``.
        layout: ``"chunked"`` or ``"contiguous"``.
        codec: Compression, e.g. ``"gzip level 4"`` or ``"none"``.
        chunk_bytes: Uncompressed bytes of one chunk (0 when contiguous).
        samples_per_chunk: Mean samples per chunk group.
        num_samples: Samples in the pack.
        file_bytes: Size of the pack.
        image_bytes: Decoded bytes of every image (what training receives).
        convert_s: Conversion wall time, None for a pack given as it is.
        command: The ``h5pack convert`` command that builds it, None for a given pack.
        patterns: Each access pattern's result.
    """

    name: str
    path: str | None
    mode: str
    storage: str
    layout: str
    codec: str
    chunk_bytes: int
    samples_per_chunk: float
    num_samples: int
    file_bytes: int
    image_bytes: int
    convert_s: float | None
    command: str | None
    patterns: dict[str, PatternResult]

    @property
    def ratio(self) -> float:
        """Decoded image bytes over file bytes (how much smaller than raw pixels)."""
        return self.image_bytes / self.file_bytes if self.file_bytes else 0.0

    def rate(self, pattern: str = "chunk") -> float:
        """Median images per second of ``pattern`` (0 when not measured)."""
        result = self.patterns.get(pattern)
        return result.images_per_s if result else 0.0


@dataclass(frozen=True)
class SkippedVariant:
    """A variant that could not be built, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Recommendation:
    """The variant to use for this data and machine, and one line saying why."""

    name: str
    line: str
    command: str | None


@dataclass(frozen=True, kw_only=True)
class CompareReport:
    """Everything ``compare`` measured.

    Attributes:
        source: The image folder, or the packs given.
        variants: Each measured variant, ranked by chunk-aware throughput (fastest first).
        skipped: Variants that could not be built.
        machine: Where it ran.
        options: The comparison's options (JSON-ready).
        recommendation: The variant to use, or None when nothing was measured.
        work_dir: Where kept packs are, else None.
    """

    source: str
    variants: tuple[VariantResult, ...]
    skipped: tuple[SkippedVariant, ...]
    machine: Machine
    options: dict[str, Any]
    recommendation: Recommendation | None
    work_dir: str | None


def rank_key(result: VariantResult) -> float:
    """Sort key of the ranking: chunk-aware throughput, else the best pattern measured."""
    if "chunk" in result.patterns:
        return result.rate("chunk")
    return max((r.images_per_s for r in result.patterns.values()), default=0.0)


def recommend(results: Sequence[VariantResult]) -> Recommendation | None:
    """Pick the smallest pack among those within ``AS_FAST`` of the fastest.

    Throughput is the h5pack loader's (chunk-aware order); a pack nearly as fast but much
    smaller wins, because it also costs less disk and page cache, and its advantage grows
    when storage is slower than the machine this ran on.
    """
    if not results:
        return None
    best = max(rank_key(r) for r in results)
    close = [r for r in results if rank_key(r) >= AS_FAST * best]
    choice = min(close, key=lambda r: (r.file_bytes, -rank_key(r)))
    fastest = max(results, key=rank_key)
    why = f"{rank_key(choice):,.0f} images/s with h5pack's chunk-aware loader"
    if choice is not fastest:
        why += (
            f", within {1 - rank_key(choice) / best:.0%} of the fastest ({fastest.name}) and "
            f"{fastest.file_bytes / choice.file_bytes:.1f}x smaller"
        )
    else:
        why += ", the fastest"
    naive = choice.patterns.get("random")
    if naive is not None and naive.images_per_s > 0:
        speedup = rank_key(choice) / naive.images_per_s
        why += f"; {speedup:,.1f}x" if speedup < 10 else f"; {speedup:,.0f}x"
        why += " naive random access"
    return Recommendation(
        choice.name, f"Use {choice.name} for this data on this machine: {why}.", choice.command
    )


def _describe_pack(
    path: str,
    name: str,
    *,
    convert_s: float | None,
    command: str | None,
    patterns: dict[str, PatternResult],
    keep: bool,
) -> VariantResult:
    from h5pack.check import pack_info

    info = pack_info(path)
    meta = fmt.load_meta(path)
    image_bytes = int(np.prod(meta.shapes, axis=1, dtype=np.int64).sum())
    return VariantResult(
        name=name,
        path=path if keep else None,
        mode=meta.mode,
        storage=meta.storage,
        layout=info.layout,
        codec=info.codec,
        chunk_bytes=info.chunk_bytes,
        samples_per_chunk=float(np.mean(chunk_map_of(meta).sizes())) if meta.num_samples else 0.0,
        num_samples=meta.num_samples,
        file_bytes=os.path.getsize(path),
        image_bytes=image_bytes,
        convert_s=convert_s,
        command=command,
        patterns=patterns,
    )


def steps_per_pack(measure: MeasureOptions) -> int:
    """Progress steps of measuring one pack."""
    steps = 0
    for pattern in measure.patterns:
        steps += measure.repeats + (0 if pattern == "random" else measure.warmup)
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


def compare(
    sources: StrPath | Sequence[StrPath],
    options: CompareOptions | None = None,
    *,
    work_dir: StrPath | None = None,
    keep: bool = False,
    on_event: Callable[[CompareEvent], None] | None = None,
) -> CompareReport:
    """Measure pack layouts side by side on one image folder, or measure given packs.

    Args:
        sources: An image folder (every variant of ``options`` is built from it), or one
            or more packs (measured as they are).
        options: What to build and how to measure (default ``CompareOptions()``).
        work_dir: Where variants are written (default: a temporary folder).
        keep: Keep the variants built (else each is deleted once measured).
        on_event: Called with progress events.

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
    paths = [Path(p) for p in items]
    if not paths:
        raise SourceError("give an image folder or at least one pack to compare")
    for path in paths:
        if not path.exists():
            raise SourceError(f"{path}: no such folder or pack")
    folder = len(paths) == 1 and paths[0].is_dir()
    if not folder and any(p.is_dir() for p in paths):
        raise SourceError(
            "compare takes one image folder, or packs only; "
            f"got a mix: {', '.join(map(str, paths))}"
        )
    per_pack = steps_per_pack(options.measure)
    results: list[VariantResult] = []
    skipped: list[SkippedVariant] = []
    kept_dir: str | None = None
    if folder:
        specs = parse_variants(list(options.variants))
        emit(CompareEvent("start", f"building {len(specs)} variants", len(specs) * (1 + per_pack)))
        with _work_dir(work_dir, keep) as where:
            for spec in specs:
                result = _build_and_measure(paths[0], spec, where, options, keep, emit, per_pack)
                if isinstance(result, SkippedVariant):
                    skipped.append(result)
                else:
                    results.append(result)
            kept_dir = os.fspath(where) if keep else None
    else:
        emit(CompareEvent("start", f"measuring {len(paths)} packs", len(paths) * per_pack))
        names = _unique_names(paths)
        for path, name in zip(paths, names, strict=True):
            emit(CompareEvent("note", f"measuring {name}"))
            patterns = measure_pack(
                path,
                options.measure,
                on_step=_stepper(emit, name),
            )
            results.append(
                _describe_pack(
                    os.fspath(path),
                    name,
                    convert_s=None,
                    command=None,
                    patterns=patterns,
                    keep=True,
                )
            )
    ranked = tuple(sorted(results, key=rank_key, reverse=True))
    return CompareReport(
        source=os.fspath(paths[0]) if folder else ", ".join(map(os.fspath, paths)),
        variants=ranked,
        skipped=tuple(skipped),
        machine=machine_info(paths[0] if not folder else (work_dir or tempfile.gettempdir())),
        options=options.to_json(),
        recommendation=recommend(ranked),
        work_dir=kept_dir,
    )


def _stepper(emit: Callable[[CompareEvent], None], name: str) -> Callable[[str], None]:
    def step(pattern: str) -> None:
        emit(CompareEvent("step", f"{name}: {pattern}"))

    return step


def _unique_names(paths: Sequence[Path]) -> list[str]:
    names = [p.stem for p in paths]
    if len(set(names)) == len(names):
        return names
    return [os.fspath(p) for p in paths]


def _build_and_measure(
    source: Path,
    spec: VariantSpec,
    where: Path,
    options: CompareOptions,
    keep: bool,
    emit: Callable[[CompareEvent], None],
    per_pack: int,
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
        for _ in range(1 + per_pack):
            emit(CompareEvent("step", f"{spec.name}: skipped"))
        return SkippedVariant(spec.name, str(err))
    emit(CompareEvent("step", f"{spec.name}: converted"))
    try:
        patterns = measure_pack(
            target,
            options.measure,
            on_step=_stepper(emit, spec.name),
        )
        return _describe_pack(
            os.fspath(target),
            spec.name,
            convert_s=report.elapsed_s,
            command=spec.command(os.fspath(source), target.name, size=options.size),
            patterns=patterns,
            keep=keep,
        )
    finally:
        if not keep:
            target.unlink(missing_ok=True)
