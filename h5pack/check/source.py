"""``verify --source``: a pack against the source it was made from, sample by sample.

Every source sample is accounted for by its key: *missing* (in the pack, not the source),
*extra* (in the source, neither in the pack nor skipped by the conversion), *skipped*,
another label, or *changed*: a stored field or the image differs (encoded packs compare
bytes, or pixels where ``--max-side`` re-encoded; raw packs prepare the file again and
compare pixels within a tolerance).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath, parse_choice
from h5pack.check.report import Problem, VerifyReport
from h5pack.core import format as fmt
from h5pack.core.decode import BACKENDS, RESIZE_METHODS, decode_image
from h5pack.core.fields import (
    BytesField,
    MaskField,
    StoredField,
    TextField,
    fields_of,
    stored_fields,
)
from h5pack.errors import DecodeError, H5PackError
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.write.fitting import fitted_columns
from h5pack.write.options import DEFAULT_QUALITY
from h5pack.write.pipeline import DecodeSpec, Prepared, prepare_sample
from h5pack.write.sources import Sample, SampleSource, sample_source
from h5pack.write.sources.base import load

FIELD_TOLERANCE = 0.01  # float fields (box coordinates in pixels) may differ by this much


@dataclass(frozen=True)
class SourceShard:
    """One pack compared with the source (a set has one per shard; ``name`` "" for a pack)."""

    name: str
    path: str
    meta: fmt.PackMeta
    paths: list[str]


def compare_source(
    report: VerifyReport,
    shards: Sequence[SourceShard],
    source: StrPath | SampleSource,
    *,
    labels_csv: StrPath | None,
    sample: int | None,
    seed: int,
    tolerance: float,
) -> VerifyReport:
    """Return ``report`` with the differences between the packs and their source.

    Every source sample must be in exactly one shard (the first holder is compared here);
    ``sample`` content comparisons are drawn over all shards together. ``labels_csv`` None:
    the one the first shard records, if it still exists.
    """
    recorded = shards[0].meta.options.get("labels_csv")
    if labels_csv is None and recorded is not None and Path(recorded).exists():
        labels_csv = recorded
    found = sample_source(source, labels_csv=labels_csv)
    in_folder = {s.key: s for s in found.samples}
    unreadable = {p.path: p.reason for p in found.problems if p.path not in in_folder}
    in_pack: dict[str, tuple[int, int]] = {}
    for number, shard in enumerate(shards):
        for index, relative in enumerate(shard.paths):
            in_pack.setdefault(relative, (number, index))
    skipped = {s.path for shard in shards for s in shard.meta.skipped}
    where = "the pack set" if len(shards) > 1 or shards[0].name else "the pack"
    problems = list(report.problems)
    counts: Counter[str] = Counter()

    def name_of(label: int, classes: tuple[str, ...]) -> str | None:
        return classes[label] if 0 <= label < len(classes) else None

    def add(kind: str, held: tuple[int, int] | None, relative: str, message: str) -> None:
        counts[kind] += 1
        index, shard = (None, "") if held is None else (held[1], shards[held[0]].name)
        problems.append(Problem(index, relative, message, shard=shard))

    extra = f"extra: in the source folder, not in {where}"
    for relative, file in in_folder.items():
        held = in_pack.get(relative)
        if held is None:
            if relative in skipped:
                counts["skipped"] += 1
            else:
                add("extra", None, relative, extra)
            continue
        meta = shards[held[0]].meta
        packed = name_of(int(meta.labels[held[1]]), meta.classes)
        label = name_of(file.label, found.classes)
        if packed != label:
            message = f"class {packed!r} in {where}, {label!r} in the source"
            add("mismatched", held, relative, message)
    for relative, reason in unreadable.items():
        if relative in skipped:
            counts["skipped"] += 1
        elif relative in in_pack:
            message = f"the source file cannot be read: {reason}"
            add("changed", in_pack[relative], relative, message)
        else:
            add("extra", None, relative, f"{extra} ({reason})")
    for relative, held in in_pack.items():
        if relative not in in_folder and relative not in unreadable:
            add("missing", held, relative, f"missing: in {where}, not in the source folder")
    # candidates: (shard, index) of every sample whose file is in the folder, in set order
    candidates = np.array(
        sorted(in_pack[r] for r in in_folder if r in in_pack), dtype=np.int64
    ).reshape(-1, 2)
    if sample is not None and sample < len(candidates):
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(len(candidates), size=sample, replace=False))
        candidates = candidates[chosen]
    differences: list[Problem] = []
    for number, shard in enumerate(shards):
        indices = candidates[candidates[:, 0] == number, 1]
        if indices.size:
            found_here = _compare_content(shard, found, in_folder, indices, tolerance)
            differences.extend(replace(d, shard=shard.name) for d in found_here)
    problems.extend(differences)
    return replace(
        report,
        problems=tuple(problems),
        num_source=len(in_folder) + len(unreadable),
        missing=counts["missing"],
        extra=counts["extra"],
        skipped=counts["skipped"],
        mismatched=counts["mismatched"],
        changed=counts["changed"] + len({(d.shard, d.index) for d in differences}),
        num_compared=len(candidates),
    )


def _decode_spec(meta: fmt.PackMeta) -> DecodeSpec:
    """Return what the conversion made of each file, from the options the pack records."""
    options: dict[str, Any] = dict(meta.options)
    size = options.get("size")
    max_side = options.get("max_side")
    return DecodeSpec(
        mode=meta.mode,
        size=(int(size[0]), int(size[1])) if size else None,
        resize=parse_choice(str(options.get("resize")), RESIZE_METHODS) or "stretch",
        channels=meta.channels,
        backend=parse_choice(str(options.get("backend")), BACKENDS) or "pillow",
        max_side=int(max_side) if max_side else None,
        quality=int(options.get("quality") or DEFAULT_QUALITY),
    )


def _compare_content(
    shard: SourceShard,
    found: SampleSource,
    in_folder: dict[str, Sample],
    indices: np.ndarray,
    tolerance: float,
) -> list[Problem]:
    """Compare samples ``indices`` of one pack with their source files, a chunk group at a time."""
    spec = _decode_spec(shard.meta)
    problems: list[Problem] = []
    options = ReaderOptions(direct=False, verify_checksums=False)
    fields = {f.name: f for f in stored_fields(fields_of(shard.meta))}
    listed = {f.name for f in found.listing.fields} & set(fields)
    position = {s.key: k for k, s in enumerate(found.samples)} if listed else {}
    with PackReader(shard.path, options, meta=shard.meta) as reader:
        groups = reader.chunk_map.chunks_of(indices)
        for group in np.unique(groups).tolist():
            batch = indices[groups == group]
            try:
                stored = reader.read_stored(batch)
                values = reader.read_fields(batch, list(fields))
            except Exception:  # damaged chunks are reported by the sample checks already
                continue
            keys = [shard.paths[i] for i in batch.tolist()]
            columns = found.columns(np.array([position[r] for r in keys])) if listed else {}
            for k, (index, data) in enumerate(zip(batch.tolist(), stored, strict=True)):
                file = in_folder[keys[k]]
                message, source = _difference(shard.meta, spec, index, data, file, tolerance)
                messages = [message]
                stored_hw = tuple(int(v) for v in shard.meta.shapes[index][:2])
                given = {
                    name: [columns[name][k] if name in listed else file.fields[name]]
                    for name in fields
                    if name in listed or name in file.fields
                }
                try:  # in the stored image's frame, as the conversion wrote them
                    given = fitted_columns(
                        [fields[name] for name in given],
                        given,
                        np.array([stored_hw]),
                        np.array([source or stored_hw]),
                        [keys[k]],
                        spec.resize if spec.size is not None else "stretch",
                    )
                except (H5PackError, ValueError, TypeError) as err:
                    messages.append(f"its fields do not fit the source image ({err})")
                    given = {}
                messages.extend(
                    _field_difference(fields[name], values[name][k], value[0], name in listed)
                    for name, value in given.items()
                )
                problems.extend(
                    Problem(index, keys[k], f"changed: {m}") for m in messages if m is not None
                )
    return problems


def _field_difference(field: StoredField, stored: Any, given: Any, stored_form: bool) -> str | None:
    """Return how a stored field's value differs from the source's (both as stored), or None."""
    name = field.name
    ours = np.asarray(field.column([stored], 1)[0])
    try:
        theirs = np.asarray(given if stored_form else field.column([given], 1)[0])
    except (H5PackError, ValueError, TypeError) as err:
        return f"field {name!r}: the source's value is no {field.kind} value ({err})"
    if isinstance(field, TextField | BytesField) and not isinstance(field, MaskField):
        mine, source = ours.tobytes(), theirs.tobytes()  # compared whole
        if mine == source:
            return None
        if isinstance(field, TextField):
            return f"field {name!r} is {mine.decode()!r:.60}, {source.decode()!r:.60} in the source"
        return f"field {name!r} is {mine!r:.60}, {source!r:.60} in the source"
    if ours.shape != theirs.shape:
        return f"field {name!r} has shape {ours.shape}, {theirs.shape} in the source"
    if ours.size and ours.dtype.kind == "f":
        worst = float(np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max())
        if worst <= FIELD_TOLERANCE:
            return None
        return f"field {name!r} differs from the source's by up to {worst:g}"
    if np.array_equal(ours, theirs):
        return None
    changed = int(np.count_nonzero(ours.reshape(-1) != theirs.reshape(-1)))
    return f"field {name!r} differs from the source's in {changed} of {ours.size} values"


def _difference(
    meta: fmt.PackMeta,
    spec: DecodeSpec,
    index: int,
    stored: np.ndarray,
    file: Sample,
    tolerance: float,
) -> tuple[str | None, tuple[int, int] | None]:
    """Return how sample ``index`` differs from its source ``file`` (or None), and its (H, W)."""
    try:
        data = load(file.image)
    except DecodeError as err:
        return f"the source file cannot be read ({err})", None
    if meta.mode == "encoded" and isinstance(data, bytes) and stored.tobytes() == data:
        return None, None
    again = prepare_sample(spec, data, file.key, 0)
    if not isinstance(again, Prepared) or again.data is None:
        return f"the source file does not decode any more ({getattr(again, 'reason', '')})", None
    message = _decoded_difference(
        meta, spec, index, stored, again, (file.key, len(data)), tolerance
    )
    return message, again.source


def _decoded_difference(
    meta: fmt.PackMeta,
    spec: DecodeSpec,
    index: int,
    stored: np.ndarray,
    again: Prepared,
    file: tuple[str, int],
    tolerance: float,
) -> str | None:
    """Return how a stored sample differs from its source file prepared again, or None."""
    assert again.data is not None
    key, size = file
    if meta.mode == "encoded":
        if not spec.max_side:
            return (
                f"the file's bytes differ from the pack's ({size} in the folder, "
                f"{stored.size} in the pack)"
            )
        if again.data.tobytes() == stored.tobytes():
            return None
        name = f"{meta.path}[{index}]"
        try:
            ours = decode_image(stored.tobytes(), name=name, channels=meta.channels)
            theirs = decode_image(again.data.tobytes(), name=key, channels=meta.channels)
        except DecodeError as err:
            return f"cannot be compared ({err})"
        return _pixel_difference(ours, theirs, tolerance)
    shape = tuple(int(s) for s in meta.shapes[index])
    return _pixel_difference(stored.reshape(shape), again.data.reshape(again.shape), tolerance)


def _pixel_difference(ours: np.ndarray, theirs: np.ndarray, tolerance: float) -> str | None:
    """Return how two decoded images differ beyond ``tolerance``, or None."""
    if ours.ndim == 2:
        ours = ours[:, :, None]
    if theirs.ndim == 2:
        theirs = theirs[:, :, None]
    if ours.shape != theirs.shape:
        (h, w, c), (sh, sw, sc) = ours.shape, theirs.shape
        return f"the source decodes to {sw}x{sh}x{sc} (WxHxC), the pack holds {w}x{h}x{c}"
    mean = float(np.abs(ours.astype(np.int16) - theirs.astype(np.int16)).mean())
    if mean > tolerance:
        return (
            f"the pixels differ from the source file's (mean difference {mean:.2f} levels, "
            f"tolerance {tolerance:g})"
        )
    return None
