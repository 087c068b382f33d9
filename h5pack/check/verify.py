"""Whether a pack is intact: ``verify_pack`` (``h5pack verify``)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.check.probe import probe_pack
from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.packset import is_packset, meta_digest
from h5pack.core.source import is_url
from h5pack.errors import DecodeError, FormatError, OptionsError, PackReplacedError
from h5pack.read.packset import PackSource

# Mean absolute difference (0..255 levels) below which decoded pixels count as the same
# image: decoders of different versions differ by a level here and there, a re-encoded,
# edited or rotated image by far more.
DEFAULT_TOLERANCE = 1.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pack: the sample (index, or None) and path concerned, and what.

    Attributes:
        index: The sample (in a pack set, its index within ``shard``), or None.
        path: The sample's (or a source file's) relative path, or "".
        message: What is wrong.
        shard: In a pack set: the shard file concerned (the manifest for the set as a
            whole), or "" when the problem is a source file in no shard.
    """

    index: int | None
    path: str
    message: str
    shard: str = ""

    def __str__(self) -> str:
        if self.index is not None:
            where = f"sample {self.index}"
        elif self.path:
            where = "source"
        else:
            where = "" if self.shard else "pack"
        if self.path:
            where += f" ({self.path})"
        if self.shard:
            where = f"{self.shard}: {where}" if where else self.shard
        return f"{where}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of ``verify_pack``.

    Attributes:
        path: The pack (a pack set's manifest, or its first pack for a list).
        num_samples: Samples in the pack (set).
        num_verified: Samples whose digests matched and that decoded to their shape.
        problems: Everything found wrong, by sample index and path (and shard).
        num_shards: Shards of a pack set (0 for a pack).
        num_source: Images found in the source folder, when one was given.
        missing: Samples in the pack whose file is not in the source folder.
        extra: Images in the source folder that are not in the pack and were not skipped
            at conversion.
        skipped: Images in the source folder that the conversion skipped (the pack
            records them): accounted for, not a problem.
        mismatched: Samples whose label differs from the source's.
        changed: Samples whose content differs from their source file's.
        num_compared: Samples whose content was compared with their source file.
    """

    path: str
    num_samples: int
    num_verified: int
    problems: tuple[Problem, ...]
    num_shards: int = 0
    num_source: int | None = None
    missing: int = 0
    extra: int = 0
    skipped: int = 0
    mismatched: int = 0
    changed: int = 0
    num_compared: int = 0

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems


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
        assert meta.offsets is not None
        assert meta.sizes is not None
        offsets, sizes = meta.offsets, meta.sizes
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
    return [
        Problem(
            None,
            "",
            f"metadata {name!r} does not match the CRC32 recorded at conversion: it is damaged",
        )
        for name in damaged
    ]


def verify_pack(
    path: PackSource,
    *,
    source: StrPath | None = None,
    labels_csv: StrPath | None = None,
    sample: int | None = None,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    progress: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> VerifyReport:
    """Check a pack: its metadata digests, structure, every sample; optionally its source.

    Samples are read chunk by chunk and checked against both their CRC32 and (format 1.1)
    their XXH3-64. A chunk that cannot be read (a corrupt compressed chunk) is reported for
    its range of samples; nothing raises for damaged data or damaged metadata that still
    locates the samples. A pack set (its directory or manifest, or a list of packs) is
    checked by ``verify_packset``.

    Args:
        path: The pack.
        source: The image folder it was made from: every image there must be in the pack
            (or recorded as skipped) with the same class and content, and nothing else.
        labels_csv: Labels CSV of the source (default: the one recorded in the pack, if it
            still exists).
        sample: Compare the content of this many samples, chosen at random with ``seed``,
            instead of all (presence and labels are always checked for every file).
        seed: Seed of that choice.
        tolerance: Raw packs: the largest mean absolute difference (levels) between the
            stored pixels and the source file decoded (and resized) again that counts as
            the same image.
        progress: Called with the number of samples just checked.
        timeout_s: Read the metadata in a child process first, under this time limit (see
            ``probe_pack``); ``None`` reads it in this process.
        storage_options: The remote client's settings for a URL. A remote pack's samples
            are read through HDF5 over ranged GETs (not from its compact index's chunk
            table), so verify also checks that HDF5's metadata and the index agree.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, or its metadata is too damaged to locate the
            samples.
    """
    if is_packset(path):
        from h5pack.check.packset import verify_packset

        if any(is_url(p) for p in ([path] if isinstance(path, str | os.PathLike) else path)):
            raise OptionsError(
                "verify reads one remote pack at a time: give each shard's URL "
                "(h5pack info lists them)"
            )
        return verify_packset(
            path,
            source=source,
            labels_csv=labels_csv,
            sample=sample,
            seed=seed,
            tolerance=tolerance,
            progress=progress,
            timeout_s=timeout_s,
        )
    assert isinstance(path, str | os.PathLike)  # is_packset: one path
    text = os.fspath(path)
    if timeout_s is not None and not is_url(text):
        probe_pack(text, timeout_s=timeout_s, strict=False)
    checked = check_pack(text, progress=progress, storage_options=storage_options)
    if source is None:
        return checked.report
    from h5pack.check.source import SourceShard, compare_source

    meta = checked.meta
    csv = labels_csv if labels_csv is not None else meta.options.get("labels_csv")
    if csv is not None and labels_csv is None and not Path(csv).exists():
        csv = None
    return compare_source(
        checked.report,
        [SourceShard(name="", path=text, meta=meta, paths=checked.paths)],
        source,
        labels_csv=csv,
        sample=sample,
        seed=seed,
        tolerance=tolerance,
    )


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
    storage_options: Mapping[str, Any] | None = None,
) -> CheckedPack:
    """Check one pack's metadata digests, structure and every sample (no source, no probe).

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, or its metadata is too damaged to locate the
            samples.
    """
    from h5pack.read.reader import PackReader, ReaderOptions

    text = os.fspath(path)
    step = progress or (lambda n: None)
    index_problems: list[Problem] = []
    with fmt.open_h5(text, storage_options=storage_options) as handle:
        meta = fmt.read_meta(handle, text, check_digests=False)
        real = getattr(handle, "h5", None)  # a URL's compact index: HDF5's own metadata too
        if real is not None and meta_digest(fmt.read_meta(real(), text, check_digests=False)) != (
            meta_digest(meta)
        ):
            index_problems.append(
                Problem(None, "", "its compact index does not say what HDF5's metadata says")
            )
        try:
            paths = fmt.read_paths(handle, meta, check=False)
            problems = _metadata_problems(meta, paths)
        except FormatError as err:  # the samples can still be checked, by index
            paths = [""] * meta.num_samples
            problems = _metadata_problems(meta, None)
            problems.append(Problem(None, "", str(err)))
    problems.extend(index_problems)
    problems.extend(_structure_problems(meta, paths))
    checks = _sample_checks(meta)
    verified = 0
    options = ReaderOptions(direct=False, verify_checksums=False, storage_options=storage_options)
    try:
        reader = PackReader(text, options, meta=meta)
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
                problems.append(
                    Problem(
                        indices.start,
                        paths[indices.start],
                        f"samples {indices.start}..{indices.stop - 1} (chunk group {group}) "
                        f"cannot be read: {cause}",
                    )
                )
                step(len(indices))
                continue
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


SampleCheck = tuple[str, np.ndarray, Callable[[np.ndarray], int], int]


def _sample_checks(meta: fmt.PackMeta) -> list[SampleCheck]:
    """Return ``(name, recorded, digest, hex width)`` of each per-sample digest to check.

    A table whose own digest did not match is not used: every sample would fail it.
    """
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
