"""Resolve a conversion's storage: mode, array or blob, layout, chunks, and work batches.

NOTE [ Padding ]: what a pack stores beyond its samples' bytes is padding, kept on disk
when uncompressed; each default keeps it under ``PADDING_TARGET``. An uncompressed blob is
contiguous by default (no chunks, samples back to back); an uncompressed array's automatic
chunk leaves (almost) no empty rows in the last chunk (``even_chunk_samples``); a chunked
blob's chunk is halved from the byte target until aligning the samples at hand
(NOTE [ Aligned blobs ]) wastes at most that share (``blob_chunk_bytes``). Compressed
chunks squeeze zeros away, so for them the choice only saves decompressing zeros.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from h5pack.core.format import Mode, Storage
from h5pack.core.layout import DEFAULT_CHUNK_BYTES, array_chunk_shape, chunk_samples_for
from h5pack.errors import OptionsError
from h5pack.write.blocks import aligned_offsets
from h5pack.write.images import ImagesSpec
from h5pack.write.options import DEFAULT_QUALITY, ConvertOptions
from h5pack.write.pipeline import DecodeSpec

BLOB_SLOT_BYTES = 4 * 2**20

PADDING_TARGET = 0.01  # share of the images dataset (NOTE [ Padding ])
MIN_BLOB_CHUNK_BYTES = 64 * 2**10  # below it, per-chunk costs stop being negligible
ESTIMATE_SAMPLES = 4096  # sample sizes tried when a blob's chunk is chosen
# Up to this many samples, a chunk is tried on this many more random orders of them.
FEW_SAMPLES = 256
FEW_SAMPLE_ORDERS = 15


@dataclass(frozen=True)
class StoragePlan:
    """The resolved storage of a conversion: what workers make and how it is laid out."""

    mode: Mode
    spec: ImagesSpec
    decode: DecodeSpec
    group_samples: int
    chunk_bytes: int
    reason: str

    @property
    def storage(self) -> Storage:
        """``"array"`` or ``"blob"``."""
        return self.spec.storage


def size_text(size: tuple[int, int]) -> str:
    """Return an ``(H, W)`` size as people read image sizes: ``"W x H"``, e.g. ``"640x480"``."""
    return f"{size[1]}x{size[0]}"


def plan_storage(
    options: ConvertOptions,
    sizes: Counter[tuple[int, int]] | None,
    *,
    num_samples: int,
    can_encode: bool = True,
    sample_bytes: Callable[[int | None], np.ndarray] | None = None,
) -> StoragePlan:
    """Choose mode, storage, layout and chunks from the options and the images' sizes.

    ``sizes`` counts the images of each (H, W) (None when not needed); ``can_encode``:
    the samples have encoded bytes; ``sample_bytes(limit)``: the stored bytes of the first
    ``limit`` samples in write order (all with None), which size an encoded blob's chunk
    or a contiguous blob (without it: the byte target, and a staged blob).
    """
    channels = options.channels
    sizes = sizes if sizes is not None else Counter()
    common = next(iter(sizes)) if len(sizes) == 1 else None
    if options.mode == "encoded" or (
        options.mode == "auto" and options.size is None and can_encode and len(sizes) > 1
    ):
        mode: Mode = "encoded"
        if options.mode == "encoded":
            reason = "encoded mode: the files' bytes are stored as they are"
        else:
            examples = ", ".join(size_text(s) for s, _ in sizes.most_common(2))
            reason = (
                f"auto mode chose encoded (original file bytes): the images come in "
                f"{len(sizes)} sizes (e.g. {examples}); pass --size N (or H,W) to store raw pixels"
            )
        if options.max_side is not None:
            reason += f"; files over {options.max_side} px are re-encoded to JPEG"
        shape = None
    else:
        mode = "raw"
        prefix = "auto mode chose raw pixels" if options.mode == "auto" else "raw mode"
        if options.size is not None:
            shape = (*options.size, channels)
            reason = f"{prefix}: every image is resized to {size_text(options.size)}"
        elif common is not None:
            shape = (*common, channels)
            reason = f"{prefix}: all {num_samples} images are {size_text(common)}"
        else:
            shape = None
            reason = (
                f"{prefix}: the images come in {len(sizes)} sizes, so pixels are stored at "
                "their original sizes (a byte blob with shapes); pass --size N (or H,W) for one "
                "size"
            )
    if shape is None:
        if mode == "raw":  # the stored bytes are known from the headers
            pixels: Counter[int] = Counter()
            for (h, w), count in sizes.items():
                pixels[h * w * channels] += count
            sample_bytes = partial(_sizes_sample, pixels, options.seed)
        elif options.max_side is not None:  # re-encoded files have sizes of their own
            sample_bytes = None
        return _blob_plan(options, mode, reason, sample_bytes, num_samples)
    sample_shape: tuple[int, int, int] = (int(shape[0]), int(shape[1]), int(shape[2]))
    decode = DecodeSpec(
        mode="raw",
        size=options.size,
        resize=options.resize,
        channels=channels,
        backend=options.backend,
        fixed_shape=sample_shape,
    )
    one_sample = sample_shape[0] * sample_shape[1] * sample_shape[2]
    if options.layout == "contiguous":
        spec = ImagesSpec("array", sample_shape, None)
        group = chunk_samples_for(one_sample, DEFAULT_CHUNK_BYTES)
        return StoragePlan(mode, spec, decode, group, 0, reason)
    chunks = array_chunk_shape(
        sample_shape,
        chunk_samples=options.chunk_samples,
        chunk_shape=options.chunk_shape,
        chunk_bytes=options.chunk_bytes,
    )
    if options.chunk_samples is None and options.chunk_shape is None:
        # Never more samples than the pack; uncompressed, no empty rows (NOTE [ Padding ]).
        rows = max(1, min(chunks[0], num_samples))
        if options.compression.codec == "none":
            rows = even_chunk_samples(num_samples, rows)
        chunks = (rows, *chunks[1:])
    spec = ImagesSpec("array", sample_shape, chunks, options.compression)
    return StoragePlan(mode, spec, decode, chunks[0], 0, reason)


def even_chunk_samples(num_samples: int, most: int) -> int:
    """Return the samples per chunk, at most ``most``, that waste the fewest rows.

    The largest down to ``most / 2`` wasting at most ``PADDING_TARGET / 2``, else the least.
    """
    if num_samples <= 0 or most <= 0:
        return max(1, most)
    candidates = range(most, max(1, (most + 1) // 2) - 1, -1)

    def waste(k: int) -> int:
        return -(-num_samples // k) * k - num_samples

    for k in candidates:
        if waste(k) <= num_samples * PADDING_TARGET / 2:
            return k
    return min(candidates, key=lambda k: (waste(k), -k))


def _sizes_sample(counts: Counter[int], seed: int, limit: int | None) -> np.ndarray:
    """Return ``limit`` (all with None) of the sizes counted, in a seeded random order."""
    values = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    weights = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
    rng = np.random.default_rng(seed)
    if limit is None or int(weights.sum()) <= limit:
        return rng.permutation(np.repeat(values, weights))
    return rng.choice(values, size=limit, p=weights / weights.sum())


def blob_chunk_bytes(
    sample_bytes: np.ndarray,
    *,
    target: int,
    whole_last_chunk: bool = False,
    num_samples: int | None = None,
) -> int:
    """Return the chunk size of an aligned blob of samples of ``sample_bytes``.

    The largest of ``target`` and its halvings down to ``MIN_BLOB_CHUNK_BYTES`` that pads
    at most ``PADDING_TARGET`` (for a few samples, in the worst of a few orders), or else
    the one that pads least. ``whole_last_chunk`` counts the last chunk's rest (stored
    when uncompressed); ``num_samples`` scales a subset's last chunk to the whole blob.
    """
    sizes = np.asarray(sample_bytes, dtype=np.int64).reshape(-1)
    candidates = [target]
    while candidates[-1] // 2 >= MIN_BLOB_CHUNK_BYTES:
        candidates.append(candidates[-1] // 2)
    if not sizes.size or not int(sizes.sum()):
        return target
    scale = max(1.0, (num_samples or 0) / sizes.size)
    # A small pack's padding depends on its order: the worst of a few orders is taken.
    orders = [sizes]
    if sizes.size <= FEW_SAMPLES:
        rng = np.random.default_rng(0)
        orders += [rng.permutation(sizes) for _ in range(FEW_SAMPLE_ORDERS)]
    best, best_padding = target, float("inf")
    for chunk in candidates:
        padding = max(
            _padding_share(order, chunk, whole_last_chunk=whole_last_chunk, scale=scale)
            for order in orders
        )
        if padding <= PADDING_TARGET:
            return chunk
        if padding < best_padding:
            best, best_padding = chunk, padding
    return best


def _padding_share(
    sizes: np.ndarray, chunk: int, *, whole_last_chunk: bool, scale: float = 1.0
) -> float:
    """Return the share of padding in a blob of ``sizes`` (times ``scale``) aligned to ``chunk``."""
    end = int(aligned_offsets(sizes, chunk)[-1]) * scale
    stored = end
    if whole_last_chunk and end > chunk:  # a blob within one chunk gets a chunk its size
        stored = -(-end // chunk) * chunk
    return float((stored - int(sizes.sum()) * scale) / stored)


def resolved_layout(options: ConvertOptions, storage: Storage) -> str:
    """Return ``"chunked"`` or ``"contiguous"``: the options' layout, or what auto means."""
    if options.layout != "auto":
        return options.layout
    uncompressed = options.compression.codec == "none"
    if storage == "blob" and uncompressed and options.chunk_bytes is None:
        return "contiguous"
    return "chunked"


def _blob_plan(
    options: ConvertOptions,
    mode: Mode,
    reason: str,
    sample_bytes: Callable[[int | None], np.ndarray] | None,
    num_samples: int,
) -> StoragePlan:
    if options.chunk_samples is not None or options.chunk_shape is not None:
        raise OptionsError(
            "these images are stored as one byte blob chunked by bytes (they differ in size), "
            "so --chunk-samples/--chunk-shape do not apply: use --chunk-bytes, or --size N "
            "(or H,W) for a fixed-size array"
        )
    blob_bytes = None
    if resolved_layout(options, "blob") == "contiguous":
        # No chunks: the samples are packed back to back (BlobAssembler(0)).
        chunk_bytes, chunks = 0, None
        if sample_bytes is not None:
            blob_bytes = int(sample_bytes(None).sum())
        if options.layout == "auto":
            reason += "; uncompressed, so stored contiguous, with no padding"
    elif options.chunk_bytes is not None or sample_bytes is None:
        chunk_bytes = options.target_chunk_bytes
        chunks = (chunk_bytes,)
    else:
        uncompressed = options.compression.codec == "none"
        chunk_bytes = blob_chunk_bytes(
            sample_bytes(ESTIMATE_SAMPLES),
            target=options.target_chunk_bytes,
            whole_last_chunk=uncompressed,
            num_samples=num_samples,
        )
        chunks = (chunk_bytes,)
    spec = ImagesSpec("blob", None, chunks, options.compression, blob_bytes)
    decode = DecodeSpec(
        mode=mode,
        flat=True,
        channels=options.channels,
        backend=options.backend,
        max_side=options.max_side,
        quality=options.quality or DEFAULT_QUALITY,
    )
    return StoragePlan(mode, spec, decode, 0, chunk_bytes, reason)


def batch_size(plan: StoragePlan) -> int:
    """Files per stage-1 task: large enough to amortise the hand-off, small enough to balance."""
    if plan.storage == "array":
        return max(1, min(32, plan.group_samples // 2))
    return 16 if plan.mode == "encoded" else 4


def sample_slot_bytes(plan: StoragePlan) -> int:
    """Bytes of a stage-1 slot: one batch of fixed-size samples, or a budget for blobs."""
    if plan.spec.sample_shape is not None:
        h, w, c = plan.spec.sample_shape
        return batch_size(plan) * h * w * c
    return max(BLOB_SLOT_BYTES, plan.chunk_bytes // 2)


def block_slot_bytes(plan: StoragePlan) -> int:
    """Bytes of a stage-2 slot: a block, or its stored chunks if bigger (with headroom)."""
    if plan.spec.sample_shape is not None:
        h, w, c = plan.spec.sample_shape
        raw = plan.group_samples * h * w * c
    else:
        raw = plan.chunk_bytes
    return raw + raw // 8 + 2**16
