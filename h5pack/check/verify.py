"""Whether one pack is intact: ``check_pack``, the checks ``h5pack verify`` runs on each pack."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.check.report import Problem, VerifyReport
from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.fields import fields_of, stored_fields
from h5pack.core.index import CompactIndex
from h5pack.core.packset import meta_digest
from h5pack.core.store import Store
from h5pack.errors import DecodeError, FormatError, PackReplacedError


def _structure_problems(meta: fmt.PackMeta, paths: list[str]) -> list[Problem]:
    """Check what ``read_meta`` does not: per-sample consistency of the metadata."""
    problems: list[Problem] = []
    shapes = meta.shapes

    def add(i: int | None, message: str) -> None:
        problems.append(Problem(i, paths[i] if i is not None and i < len(paths) else "", message))

    if meta.storage == "array":
        expected = np.asarray(meta.images_shape[1:])
        for i in np.flatnonzero(np.any(shapes != expected, axis=1)):
            add(
                int(i),
                f"recorded shape {tuple(shapes[i])} differs from the array's {tuple(expected)}",
            )
    else:
        offsets, sizes = meta.blob_slots()
        if np.any(np.diff(offsets) < 0):
            add(None, "blob offsets are not in increasing order")
        starts = offsets[:-1]
        for i in np.flatnonzero(sizes <= 0)[:10]:
            add(int(i), f"stored size {int(sizes[i])} is not positive")
        unit = meta.blob_chunk_bytes if meta.chunks is not None else 0
        if unit:
            inside = sizes <= unit
            straddles = inside & (starts // unit != (starts + np.maximum(sizes, 1) - 1) // unit)
            for i in np.flatnonzero(straddles):
                add(int(i), f"slot at byte {int(starts[i])} straddles a {unit}-byte chunk boundary")
        if meta.mode == "raw":
            wrong = sizes != np.prod(shapes.astype(np.int64), axis=1)
            for i in np.flatnonzero(wrong):
                add(
                    int(i), f"{int(sizes[i])} stored bytes do not make the shape {tuple(shapes[i])}"
                )
    if np.any(shapes[:, 2] != meta.channels):
        bad = int(np.flatnonzero(shapes[:, 2] != meta.channels)[0])
        add(bad, f"recorded {shapes[bad, 2]} channels, the pack has {meta.channels}")
    order = meta.source_index
    if order.size and (order.min() < 0 or np.unique(order).size != order.size):
        add(None, "source_index is not a set of distinct non-negative positions")
    seen: dict[str, int] = {}
    for index, relative in enumerate(paths):
        if relative and relative in seen:  # "": the paths could not be read
            add(index, f"path also stored for sample {seen[relative]}")
        seen.setdefault(relative, index)
    return problems


def _metadata_problems(meta: fmt.PackMeta, paths: list[str] | None) -> list[Problem]:
    """Report every dataset and attribute that no longer matches its recorded digest."""
    damaged = list(meta.damaged)
    if paths is not None and not fmt.paths_match(meta, paths):
        damaged.append(fmt.PATHS)
    damage = "does not match the CRC32 recorded at conversion: it is damaged"
    return [Problem(None, "", f"metadata {name!r} {damage}") for name in damaged]


@dataclass(frozen=True)
class CheckedPack:
    """What ``check_pack`` found, with the metadata and paths it read (for later checks)."""

    report: VerifyReport
    meta: fmt.PackMeta
    paths: list[str]


def check_pack(
    path: StrPath,
    *,
    progress: Callable[[int], None] | None = None,
    store: Store | None = None,
) -> CheckedPack:
    """Check one pack's metadata digests, structure and every sample (no source, no probe)."""
    from h5pack.read.reader import PackReader, ReaderOptions

    text = os.fspath(path)
    step = progress or (lambda n: None)
    index_problems: list[Problem] = []
    with fmt.open_index(text, store=store) as handle:
        meta = fmt.read_meta(handle, text, check_digests=False)
        # a URL's compact index: HDF5's own metadata must say the same
        if isinstance(handle, CompactIndex) and meta_digest(
            fmt.read_meta(handle.hdf5_index(), text, check_digests=False)
        ) != meta_digest(meta):
            differs = "its compact index does not say what HDF5's metadata says"
            index_problems.append(Problem(None, "", differs))
        try:
            paths = fmt.read_paths(handle, meta, check=False)
            problems = _metadata_problems(meta, paths)
        except FormatError as err:  # the samples can still be checked, by index
            paths = [""] * meta.num_samples
            problems = _metadata_problems(meta, None)
            problems.append(Problem(None, "", str(err)))
        problems.extend(_field_problems(handle.hdf5(), meta))
    problems.extend(index_problems)
    problems.extend(_structure_problems(meta, paths))
    checks = _sample_checks(meta)
    verified = 0
    options = ReaderOptions(direct=False, verify_checksums=False)
    try:
        reader = PackReader(text, options, meta=meta, store=store)
    except PackReplacedError as err:
        raise PackReplacedError(
            f"{text} was replaced while verify read it (another file took its path between "
            "reading its metadata and its images); run verify again once nothing writes it"
        ) from err
    with reader:
        for group in range(reader.chunk_map.num_chunks):
            indices = reader.chunk_map.samples(group)
            try:
                stored = reader.read_stored(np.arange(indices.start, indices.stop))
            except Exception as err:  # any failure to read damaged data is reported, not raised
                # The reader's own FormatError already names the pack and the group.
                cause = err.__cause__ if isinstance(err, FormatError) and err.__cause__ else err
                span = f"samples {indices.start}..{indices.stop - 1} (chunk group {group})"
                failed = f"{span} cannot be read: {cause}"
                problems.append(Problem(indices.start, paths[indices.start], failed))
            else:
                for i, data in zip(indices, stored, strict=True):
                    message = _check_sample(meta, i, data, paths[i], checks)
                    if message is None:
                        verified += 1
                    else:
                        problems.append(Problem(i, paths[i], message))
            step(len(indices))
    report = VerifyReport(
        path=text, num_samples=meta.num_samples, num_verified=verified, problems=tuple(problems)
    )
    return CheckedPack(report, meta, paths)


def _field_problems(handle: Any, meta: fmt.PackMeta) -> list[Problem]:
    """Report every dataset of the pack's stored fields that does not match its digest."""
    try:
        fields = stored_fields(fields_of(meta))
    except FormatError as err:
        return [Problem(None, "", str(err))]
    problems = []
    for stored in fields:
        try:
            found = stored.digests(handle)
        except Exception as err:  # any failure to read damaged data is reported, not raised
            problems.append(Problem(None, "", f"field {stored.name!r} cannot be read: {err}"))
            continue
        damage = "does not match the CRC32 recorded at conversion: it is damaged"
        problems.extend(
            Problem(None, "", f"field {stored.name!r}: {name!r} {damage}")
            for name in fmt.damaged_names(meta.digests, found)
        )
    return problems


SampleCheck = tuple[str, np.ndarray, Callable[[np.ndarray], int], int]


def _sample_checks(meta: fmt.PackMeta) -> list[SampleCheck]:
    """Return ``(name, recorded, digest, hex width)`` of each usable per-sample digest table."""
    checks: list[SampleCheck] = []
    if fmt.CHECKSUMS not in meta.damaged:
        checks.append(("CRC32", meta.checksums, integrity.crc32, 8))
    usable = meta.sample_xxh3 is not None and integrity.has_sample_digest()
    if usable and fmt.SAMPLE_XXH3 not in meta.damaged:
        assert meta.sample_xxh3 is not None
        checks.append(("XXH3-64", meta.sample_xxh3, integrity.sample_digest, 16))
    return checks


def _check_sample(
    meta: fmt.PackMeta, index: int, data: np.ndarray, name: str, checks: list[SampleCheck]
) -> str | None:
    """Return what is wrong with one stored sample, or None."""
    data = np.ascontiguousarray(data)
    for algorithm, recorded, digest, width in checks:
        got, expected = digest(data), int(recorded[index])
        if got != expected:
            return (
                f"checksum mismatch: {algorithm} of the stored bytes is {got:0{width}x}, "
                f"the pack recorded {expected:0{width}x}"
            )
    shape = tuple(int(s) for s in meta.shapes[index])
    if meta.mode == "raw":
        if data.size != math.prod(shape):
            return f"{data.size} stored bytes do not make the recorded shape {shape}"
        return None
    from h5pack.core.decode import decode_image

    backend = meta.options.get("backend", "pillow")
    try:
        image = decode_image(
            data.tobytes(),
            name=name,
            backend=backend if backend in ("pillow", "opencv") else "pillow",
            channels=meta.channels,
        )
    except DecodeError as err:
        return f"does not decode: {err}"
    if tuple(image.shape) != shape:
        return f"decodes to {tuple(image.shape)}, the pack recorded {shape}"
    return None
