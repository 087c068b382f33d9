"""What would help a loader on one pack, in words: the stall report's (``stats()``) advice.

It names one of three ``BOTTLENECKS``, in words for the pack and the loader (``PackFacts``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from h5pack.core import jpegbox
from h5pack.core.layout import describe_codec
from h5pack.core.units import human_bytes

BOTTLENECKS: tuple[str, ...] = ("loader", "decode", "storage")

CACHE_SHARE = 0.5  # of the available memory: a pack up to this counts as in the page cache
SMALL_CHUNK_BYTES = 2**20  # below it, chunks are worth enlarging (fewer, larger reads)


@dataclass(frozen=True)
class PackFacts:
    """What the advice depends on: the pack measured and the loader's settings.

    ``codec`` as ``info`` words it (``"none"``); ``chunk_bytes`` 0 when contiguous;
    ``size`` None when read as stored; ``cached``: through the decoded cache;
    ``whole_jpegs``: why JPEGs are decoded whole, not their crop box alone ("" if not).
    """

    mode: str
    codec: str
    layout: str
    chunk_bytes: int
    file_bytes: int
    image_bytes: int
    available_bytes: int | None
    workers: int
    transforms: bool
    size: tuple[int, int] | None
    cached: bool = False
    whole_jpegs: str = ""

    @property
    def compressed(self) -> bool:
        """Whether the images pass through a codec."""
        return self.codec != "none"

    @property
    def large(self) -> bool:
        """Larger than the page cache can hold next to training."""
        return bool(self.available_bytes) and self.file_bytes > CACHE_SHARE * (
            self.available_bytes or 0
        )


def share_labels(facts: PackFacts) -> dict[str, str]:
    """Return what each share is for this pack, e.g. ``decode: "decoding, crop and resize"``."""
    if facts.mode == "encoded":
        reading = "decoding the files"
    elif facts.compressed:
        reading = f"decompressing ({facts.codec})"
    else:
        reading = "copying from the page cache (nothing to decompress)"
    if facts.size is not None:
        reading += ", crop and resize"
    own = "filling batches"
    if facts.workers:
        own += ", handing them over from worker processes"
    if facts.transforms:
        own += ", the per-sample transform"
    return {"loader": own, "decode": reading, "storage": "reading from disk"}


def advise(bottleneck: str, facts: PackFacts) -> str:
    """Return what would help with ``bottleneck`` on this pack, in the user's terms."""
    advice = _advice(bottleneck, facts)[0]
    if bottleneck == "decode" and facts.mode == "encoded" and facts.size and facts.whole_jpegs:
        advice += (
            f"; every JPEG is decoded whole because {facts.whole_jpegs}: with the box "
            "decoder only each crop's box is, about 20% less CPU per image"
        )
    return advice


def short_fix(bottleneck: str, facts: PackFacts) -> str:
    """Return the first thing to try against ``bottleneck`` on this pack, in a few words."""
    return _advice(bottleneck, facts)[1]


def _advice(bottleneck: str, facts: PackFacts) -> tuple[str, str]:
    """``advise``'s words and ``short_fix``'s, for one bottleneck."""
    if bottleneck == "loader":
        if facts.transforms:
            return (
                "the per-sample Python transform dominates: normalise on the GPU "
                "(DevicePrefetcher(normalize=...)) or lighten the transform",
                "normalise on the GPU (DevicePrefetcher(normalize=...))",
            )
        if facts.workers and facts.mode == "raw" and facts.size is None:
            return (
                "worker processes pay for every batch crossing a process boundary: read "
                "this raw pack in the main process (--workers 0, which num_workers='auto' "
                "picks for raw packs read as stored)",
                "num_workers=0 (a raw pack reads fastest in the main process)",
            )
        return (
            "the loader's own work (allocating and filling batches) is the limit, not the "
            "pack: a different layout would not help; larger batches amortise the per-batch "
            "cost",
            "larger batches",
        )
    if bottleneck == "storage":
        advice = "reading from disk: "
        if not facts.compressed and facts.mode == "raw":
            advice += "compression (--compression lz4 or zstd) would read fewer bytes per image"
            fix = "convert with --compression lz4 (fewer bytes per image)"
        else:
            ratio = facts.image_bytes / facts.file_bytes if facts.file_bytes else 0.0
            advice += (
                f"the pack is already {ratio:.1f}x smaller than its pixels; a faster disk would "
                f"help, or memory to keep its {human_bytes(facts.file_bytes)} in the page cache"
            )
            fix = "a faster disk, or memory for the page cache"
        if facts.layout == "chunked" and 0 < facts.chunk_bytes < SMALL_CHUNK_BYTES:
            advice += (
                f"; its chunks of {human_bytes(facts.chunk_bytes)} are small: larger ones "
                "(--chunk-bytes 8MiB) read in fewer, larger requests"
            )
        return advice, fix
    if facts.mode == "encoded" and facts.cached:
        return (
            "decoding the image files, with the decoded cache on: the first epoch decodes "
            "every image, later ones those the cache could not hold (a larger "
            "cache_bytes holds more; about "
            f"{human_bytes(facts.image_bytes)} decoded) and those whose crop box takes a "
            "reduced decode; store decoded pixels (h5pack convert --mode raw --size N "
            "(or H,W)) to decode none; more cores decode more images at once",
            "convert --mode raw --size N (no decoding at all)",
        )
    if facts.mode == "encoded":
        available = (
            f"{human_bytes(facts.available_bytes)} of memory available"
            if facts.available_bytes
            else "the memory available unknown"
        )
        return (
            "decoding the image files every epoch: make_loader(cache='decoded', ...) "
            f"decodes each image once (about {human_bytes(facts.image_bytes)} decoded, "
            f"{available}), or store decoded pixels (h5pack convert --mode raw --size N "
            "(or H,W)); more cores decode more images at once",
            "make_loader(cache='decoded', ...) (decode each image once)",
        )
    if facts.compressed and facts.codec.startswith(("lz4", "blosc")):
        return (
            f"decompressing {facts.codec}, already a fast codec: an uncompressed "
            "pack (--compression none) skips it, at "
            f"{facts.image_bytes / max(1, facts.file_bytes):.1f}x the file size",
            "convert with --compression none",
        )
    if facts.compressed:
        return (
            f"decompressing {facts.codec}: a faster codec (--compression lz4) "
            "decompresses several times faster, for a somewhat larger file",
            "convert with --compression lz4",
        )
    if facts.size is not None:
        return (
            "cutting and resizing every image: storing the images near the training "
            "size (h5pack convert --size N (or H,W)) makes each resize cheaper",
            "convert --size N near the training size",
        )
    return (
        "copying samples out of the page cache: there is nothing to decompress or decode; "
        "only fewer bytes per image would help",
        "fewer bytes per image",
    )


def dataset_facts(dataset: Any, *, workers: int) -> PackFacts:
    """Return the facts of ``dataset`` (an ``H5ImageDataset``) read with ``workers``."""
    from h5pack.errors import H5PackError
    from h5pack.training.cache import default_cache_bytes

    meta = dataset.meta
    try:
        available: int | None = default_cache_bytes(fraction=1.0)
    except H5PackError:
        available = None
    shards = dataset.view.shards
    files = [shard.path for shard in shards] if shards else [meta.path]
    return PackFacts(
        mode=meta.mode,
        codec=describe_codec(meta),
        layout="chunked" if meta.chunks else "contiguous",
        chunk_bytes=math.prod(meta.chunks) if meta.chunks else 0,
        file_bytes=sum(_size(path) for path in files),
        image_bytes=int(meta.shapes.prod(axis=1).sum()),
        available_bytes=available,
        workers=workers,
        transforms=dataset.transform is not None,
        size=None if dataset.crop is None else dataset.crop.size,
        cached=dataset.cache is not None,
        whole_jpegs=jpegbox.unavailable_reason() or "",
    )


def _size(path: Any) -> int:
    try:
        return os.path.getsize(path)
    except (OSError, TypeError):
        return 0
