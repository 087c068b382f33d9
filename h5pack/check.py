"""What is inside a pack (``pack_info``) and whether it is intact (``verify_pack``)."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core import format as fmt
from h5pack.core.layout import FILTER_NAMES, PLUGIN_FILTERS, Compression, chunk_map_of
from h5pack.errors import DecodeError, FormatError, OptionsError


@dataclass(frozen=True, kw_only=True)
class PackInfo:
    """A summary of a pack, for people (``h5pack info``) and machines (``--json``).

    Attributes:
        path: The pack.
        file_bytes: Size of the file.
        format_version: Format version of the pack.
        tool_version: h5pack version that wrote it.
        created_utc: When it was written.
        num_samples: Samples in the pack.
        classes: ``(name, samples)`` for each class, in label order.
        unlabelled: Samples with label -1.
        mode: ``"raw"`` or ``"encoded"``.
        storage: ``"array"`` or ``"blob"``.
        dtype: Element type of the images dataset.
        images_shape: Shape of the images dataset.
        sample_shape: (H, W, C) when every sample has it, else None.
        channels: 1 or 3.
        layout: ``"chunked"`` or ``"contiguous"``.
        chunk_shape: Chunk shape of the images dataset, or None.
        chunk_bytes: Uncompressed bytes of one chunk (0 when contiguous).
        num_chunks: Chunks stored.
        samples_per_chunk: Mean samples per chunk group (see ``layout.ChunkMap``).
        codec: Human description of the compression, ``"none"`` without.
        filter_ids: HDF5 filter ids on the images dataset.
        plugins: What reading the pack needs beyond HDF5 (``hdf5plugin`` filters).
        stored_bytes: Uncompressed bytes of every sample (padding excluded).
        disk_bytes: Bytes the images dataset takes in the file.
        compression_ratio: ``stored_bytes / disk_bytes``.
        shuffled: Whether samples were written in a shuffled order.
        skipped: Files left out at conversion.
        options: The conversion options recorded in the pack.
    """

    path: str
    file_bytes: int
    format_version: int
    tool_version: str
    created_utc: str
    num_samples: int
    classes: tuple[tuple[str, int], ...]
    unlabelled: int
    mode: str
    storage: str
    dtype: str
    images_shape: tuple[int, ...]
    sample_shape: tuple[int, int, int] | None
    channels: int
    layout: str
    chunk_shape: tuple[int, ...] | None
    chunk_bytes: int
    num_chunks: int
    samples_per_chunk: float
    codec: str
    filter_ids: tuple[int, ...]
    plugins: tuple[str, ...]
    stored_bytes: int
    disk_bytes: int
    compression_ratio: float
    shuffled: bool | None
    skipped: tuple[fmt.SkippedFile, ...]
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        data = asdict(self)
        data["classes"] = [{"name": name, "samples": count} for name, count in self.classes]
        data["skipped"] = [{"path": s.path, "reason": s.reason} for s in self.skipped]
        for key in ("images_shape", "sample_shape", "chunk_shape", "filter_ids", "plugins"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data


def _codec(meta: fmt.PackMeta) -> str:
    recorded = meta.options.get("compression")
    if isinstance(recorded, dict):
        try:
            compression = Compression(**recorded)
        except (OptionsError, TypeError):
            pass
        else:
            if compression.codec != "none" or not meta.filter_ids:
                return compression.describe()
    if not meta.filter_ids:
        return "none"
    return " + ".join(FILTER_NAMES.get(i, f"filter {i}") for i in meta.filter_ids)


def pack_info(path: StrPath) -> PackInfo:
    """Return a summary of the pack at ``path``.

    Raises:
        FileNotFoundError: the path does not exist.
        FormatError: the file is not a valid pack.
    """
    text = os.fspath(path)
    with fmt.open_h5(text) as handle:
        meta = fmt.read_meta(handle, text)
        images = handle[fmt.IMAGES]
        disk_bytes = int(images.id.get_storage_size())
        num_chunks = int(images.id.get_num_chunks()) if images.chunks else 0
        dtype = str(images.dtype)
    counts = Counter(int(label) for label in meta.labels)
    if meta.storage == "array":
        stored_bytes = meta.num_samples * math.prod(meta.images_shape[1:])
    else:
        assert meta.sizes is not None  # blob storage
        stored_bytes = int(meta.sizes.sum())
    chunk_map = chunk_map_of(meta)
    shuffled = meta.options.get("shuffle_samples")
    return PackInfo(
        path=text,
        file_bytes=Path(text).stat().st_size,
        format_version=meta.format_version,
        tool_version=meta.tool_version,
        created_utc=meta.created_utc,
        num_samples=meta.num_samples,
        classes=tuple((name, counts.get(i, 0)) for i, name in enumerate(meta.classes)),
        unlabelled=counts.get(-1, 0),
        mode=meta.mode,
        storage=meta.storage,
        dtype=dtype,
        images_shape=meta.images_shape,
        sample_shape=meta.fixed_shape,
        channels=meta.channels,
        layout="chunked" if meta.chunks else "contiguous",
        chunk_shape=meta.chunks,
        chunk_bytes=math.prod(meta.chunks) if meta.chunks else 0,
        num_chunks=num_chunks,
        samples_per_chunk=meta.num_samples / max(1, chunk_map.num_chunks),
        codec=_codec(meta),
        filter_ids=meta.filter_ids,
        plugins=tuple(PLUGIN_FILTERS[i] for i in meta.filter_ids if i in PLUGIN_FILTERS),
        stored_bytes=stored_bytes,
        disk_bytes=disk_bytes,
        compression_ratio=stored_bytes / disk_bytes if disk_bytes else 0.0,
        shuffled=bool(shuffled) if shuffled is not None else None,
        skipped=meta.skipped,
        options=dict(meta.options),
    )


# -- verify -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pack: the sample (index, or None) and path concerned, and what."""

    index: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"sample {self.index}" if self.index is not None else "source"
        return f"{where} ({self.path}): {self.message}" if self.path else f"{where}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of ``verify_pack``.

    Attributes:
        path: The pack.
        num_samples: Samples in the pack.
        num_verified: Samples whose checksum matched and that decoded to their shape.
        problems: Everything found wrong, by sample index and path.
        num_source: Images found in the source, when one was given.
        missing: Source images absent from the pack (not counting files skipped at
            conversion, which the pack records).
        extra: Pack samples absent from the source.
        mismatched: Samples whose label differs from the source's.
    """

    path: str
    num_samples: int
    num_verified: int
    problems: tuple[Problem, ...]
    num_source: int | None = None
    missing: int = 0
    extra: int = 0
    mismatched: int = 0

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
        if relative in seen:
            add(index, f"path also stored for sample {seen[relative]}")
        seen.setdefault(relative, index)
    return problems


def verify_pack(
    path: StrPath,
    *,
    source: StrPath | None = None,
    labels_csv: StrPath | None = None,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check a pack: structure, every checksum, every sample decodes; optionally the source.

    Samples are read chunk by chunk. A chunk that cannot be read (a corrupt compressed
    chunk) is reported for its range of samples; nothing raises for damaged data.

    Args:
        path: The pack.
        source: The image folder it was made from: every image there must be in the pack
            (unless recorded as skipped) with the same class name, and nothing else.
        labels_csv: Labels CSV of the source (default: the one recorded in the pack, if it
            still exists).
        progress: Called with the number of samples just checked.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, or its metadata cannot be read.
    """
    from h5pack.read.reader import PackReader, ReaderOptions

    text = os.fspath(path)
    step = progress or (lambda n: None)
    try:
        reader = PackReader(text, ReaderOptions(direct=False))
    except FormatError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as err:
        raise FormatError(f"{text}: the pack's metadata cannot be read ({err})") from err
    with reader:
        meta = reader.meta
        try:
            paths = reader.paths
        except (OSError, ValueError, RuntimeError) as err:
            raise FormatError(f"{text}: the pack's paths cannot be read ({err})") from err
        problems = _structure_problems(meta, paths)
        verified = 0
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
                message = _check_sample(meta, i, data, paths[i])
                if message is None:
                    verified += 1
                else:
                    problems.append(Problem(i, paths[i], message))
            step(len(indices))
    report = VerifyReport(
        path=text, num_samples=meta.num_samples, num_verified=verified, problems=tuple(problems)
    )
    if source is None:
        return report
    csv = labels_csv if labels_csv is not None else meta.options.get("labels_csv")
    if csv is not None and labels_csv is None and not Path(csv).exists():
        csv = None
    return _compare_source(report, meta, paths, source, csv)


def _check_sample(meta: fmt.PackMeta, index: int, data: np.ndarray, name: str) -> str | None:
    """Return what is wrong with one stored sample, or None."""
    data = np.ascontiguousarray(data)
    crc = fmt.checksum(data)
    if crc != int(meta.checksums[index]):
        return (
            f"checksum mismatch: CRC32 of the stored bytes is {crc:08x}, "
            f"the pack recorded {int(meta.checksums[index]):08x}"
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


def _compare_source(
    report: VerifyReport,
    meta: fmt.PackMeta,
    paths: list[str],
    source: StrPath,
    labels_csv: StrPath | None,
) -> VerifyReport:
    """Add the differences between the pack and its source folder to ``report``."""
    from h5pack.write.scan import scan

    found = scan(source, labels_csv=labels_csv)

    def name_of(label: int, classes: tuple[str, ...]) -> str | None:
        return classes[label] if label >= 0 else None

    in_source = {f.relative: name_of(f.label, found.classes) for f in found.files}
    in_pack = {rel: i for i, rel in enumerate(paths)}
    skipped = {s.path for s in meta.skipped}
    problems = list(report.problems)
    missing = extra = mismatched = 0
    for relative, label in in_source.items():
        index = in_pack.get(relative)
        if index is None:
            if relative not in skipped:
                missing += 1
                problems.append(Problem(None, relative, "in the source but not in the pack"))
            continue
        packed = name_of(int(meta.labels[index]), meta.classes)
        if packed != label:
            mismatched += 1
            problems.append(
                Problem(index, relative, f"class {packed!r} in the pack, {label!r} in the source")
            )
    for relative, index in in_pack.items():
        if relative not in in_source:
            extra += 1
            problems.append(Problem(index, relative, "in the pack but not in the source"))
    return VerifyReport(
        path=report.path,
        num_samples=report.num_samples,
        num_verified=report.num_verified,
        problems=tuple(problems),
        num_source=len(found.files),
        missing=missing,
        extra=extra,
        mismatched=mismatched,
    )
