"""Resolve a conversion's storage: mode, array or blob, chunks, and how work is batched."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from h5pack.core.format import Mode, Storage
from h5pack.core.layout import DEFAULT_CHUNK_BYTES, array_chunk_shape, chunk_samples_for
from h5pack.errors import OptionsError
from h5pack.write.images import ImagesSpec
from h5pack.write.options import ConvertOptions
from h5pack.write.pipeline import DecodeSpec

# Room per stage-1 slot of blob storage (file bytes or pixels of one batch).
BLOB_SLOT_BYTES = 4 * 2**20


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


def _size_text(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def plan_storage(
    options: ConvertOptions,
    sizes: Counter[tuple[int, int]] | None,
    *,
    num_samples: int,
    can_encode: bool = True,
) -> StoragePlan:
    """Choose mode, storage and chunks from the options and the images' (H, W) sizes.

    Args:
        options: The conversion options.
        sizes: How many images have each (H, W), from their headers; None when not needed
            (``size`` given, or encoded mode).
        num_samples: Samples to pack (the automatic chunk never holds more).
        can_encode: Whether the samples have encoded bytes (not so for arrays).

    Raises:
        OptionsError: the options do not fit the images (e.g. ``chunk_samples`` for images
            of several sizes, which are stored as a blob chunked by bytes).
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
            examples = ", ".join(_size_text(s) for s, _ in sizes.most_common(2))
            reason = (
                f"auto mode chose encoded (original file bytes): the images come in "
                f"{len(sizes)} sizes (e.g. {examples}); pass --size H W to store raw pixels"
            )
        if options.max_side is not None:
            reason += f"; files over {options.max_side} px are re-encoded to JPEG"
        shape = None
    else:
        mode = "raw"
        prefix = "auto mode chose raw pixels" if options.mode == "auto" else "raw mode"
        if options.size is not None:
            shape = (*options.size, channels)
            reason = f"{prefix}: every image is resized to {_size_text(options.size)}"
        elif common is not None:
            shape = (*common, channels)
            reason = f"{prefix}: all {num_samples} images are {_size_text(common)}"
        else:
            shape = None
            reason = (
                f"{prefix}: the images come in {len(sizes)} sizes, so pixels are stored at "
                "their original sizes (a byte blob with shapes); pass --size H W for one size"
            )
    if shape is None:
        return _blob_plan(options, mode, reason)
    sample_shape: tuple[int, int, int] = (int(shape[0]), int(shape[1]), int(shape[2]))
    decode = DecodeSpec(
        mode="raw",
        size=options.size,
        resize=options.resize,
        channels=channels,
        backend=options.backend,
        fixed_shape=sample_shape,
    )
    sample_bytes = sample_shape[0] * sample_shape[1] * sample_shape[2]
    if options.layout == "contiguous":
        spec = ImagesSpec("array", sample_shape, None)
        group = chunk_samples_for(sample_bytes, DEFAULT_CHUNK_BYTES)
        return StoragePlan(mode, spec, decode, group, 0, reason)
    chunks = array_chunk_shape(
        sample_shape,
        chunk_samples=options.chunk_samples,
        chunk_shape=options.chunk_shape,
        chunk_bytes=options.chunk_bytes,
    )
    if options.chunk_samples is None and options.chunk_shape is None:
        # A chunk sized from a byte target never holds more samples than the pack.
        chunks = (max(1, min(chunks[0], num_samples)), *chunks[1:])
    spec = ImagesSpec("array", sample_shape, chunks, options.compression)
    return StoragePlan(mode, spec, decode, chunks[0], 0, reason)


def _blob_plan(
    options: ConvertOptions, mode: Mode, reason: str
) -> StoragePlan:
    if options.chunk_samples is not None or options.chunk_shape is not None:
        raise OptionsError(
            "these images are stored as one byte blob chunked by bytes (they differ in size), "
            "so --chunk-samples/--chunk-shape do not apply: use --chunk-bytes, or --size H W "
            "for a fixed-size array"
        )
    chunk_bytes = options.target_chunk_bytes
    chunks = None if options.layout == "contiguous" else (chunk_bytes,)
    spec = ImagesSpec("blob", None, chunks, options.compression)
    decode = DecodeSpec(
        mode=mode,
        flat=True,
        channels=options.channels,
        backend=options.backend,
        max_side=options.max_side,
        quality=options.effective_quality,
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
