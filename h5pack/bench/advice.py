"""What would help a loader on one pack: the advice of ``bench --diagnose``.

Advice is chosen for the pack measured and the loader's settings (``PackFacts``): an
encoded pack is told about the decoded cache, a raw one about its codec, an uncompressed
one about compression, and larger chunks are suggested only for small ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from h5pack.bench.ranking import CACHE_SHARE
from h5pack.bench.sources import pack_files, source_bytes
from h5pack.bench.system import available_memory_bytes
from h5pack.bench.throughput import Setup
from h5pack.bench.units import human_bytes

# Below this size, chunks are worth enlarging (fewer, larger reads from disk).
SMALL_CHUNK_BYTES = 2**20


@dataclass(frozen=True)
class PackFacts:
    """What the advice depends on: the pack measured and the loader's settings.

    Attributes:
        mode: ``"raw"`` or ``"encoded"``.
        codec: The compression, as ``info`` words it (``"none"`` without).
        layout: ``"chunked"`` or ``"contiguous"``.
        chunk_bytes: Uncompressed bytes of one chunk (0 when contiguous).
        file_bytes: Size of the pack.
        image_bytes: Decoded bytes of every image.
        available_bytes: Memory available, None when unknown.
        workers: DataLoader worker processes.
        transforms: Whether a per-sample Python transform runs.
        size: The training size, None when read as stored.
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


def pack_facts(setup: Setup) -> PackFacts:
    """Return the facts of the pack ``setup`` reads, with the memory available now."""
    from h5pack.check import pack_info

    info = pack_info(pack_files(setup.source)[0])  # a set's shards share one layout
    meta = setup.loader.dataset.meta
    return PackFacts(
        mode=meta.mode,
        codec=info.codec,
        layout=info.layout,
        chunk_bytes=info.chunk_bytes,
        file_bytes=source_bytes(setup.source),
        image_bytes=int(sum(int(h) * int(w) * int(c) for h, w, c in meta.shapes)),
        available_bytes=available_memory_bytes(),
        workers=setup.loader.workers,
        transforms=setup.options.transforms,
        size=setup.train.size,
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
    if bottleneck == "loader":
        if facts.transforms:
            return (
                "the per-sample Python transform dominates: normalise on the GPU "
                "(DevicePrefetcher(normalize=...)) or lighten the transform"
            )
        if facts.workers and facts.mode == "raw":
            return (
                "worker processes pay for every batch crossing a process boundary: read "
                "this raw pack in the main process (--workers 0, which num_workers='auto' "
                "picks for raw packs)"
            )
        return (
            "the loader's own work (allocating and filling batches) is the limit, not the "
            "pack: a different layout would not help; larger batches amortise the per-batch "
            "cost"
        )
    if bottleneck == "decode":
        if facts.mode == "encoded":
            return (
                "decoding the image files every epoch: make_loader(cache='decoded', ...) "
                f"decodes each image once (about {human_bytes(facts.image_bytes)} decoded, "
                + (
                    f"{human_bytes(facts.available_bytes)} of memory available"
                    if facts.available_bytes
                    else "the memory available unknown"
                )
                + "), or store decoded pixels (h5pack convert --mode raw --size H W); more "
                "cores decode more images at once"
            )
        if facts.compressed:
            if facts.codec.startswith(("lz4", "blosc")):
                return (
                    f"decompressing {facts.codec}, already a fast codec: an uncompressed "
                    "pack (--compression none) skips it, at "
                    f"{facts.image_bytes / max(1, facts.file_bytes):.1f}x the file size"
                )
            return (
                f"decompressing {facts.codec}: a faster codec (--compression lz4) "
                "decompresses several times faster, for a somewhat larger file"
            )
        if facts.size is not None:
            return (
                "cutting and resizing every image: storing the images near the training "
                "size (h5pack convert --size H W) makes each resize cheaper"
            )
        return (
            "copying samples out of the page cache: there is nothing to decompress or decode; "
            "only fewer bytes per image would help"
        )
    advice = "reading from disk: "
    if not facts.compressed and facts.mode == "raw":
        advice += "compression (--compression lz4 or zstd) would read fewer bytes per image"
    else:
        ratio = facts.image_bytes / facts.file_bytes if facts.file_bytes else 0.0
        advice += (
            f"the pack is already {ratio:.1f}x smaller than its pixels; a faster disk would "
            f"help, or memory to keep its {human_bytes(facts.file_bytes)} in the page cache"
        )
    if facts.layout == "chunked" and 0 < facts.chunk_bytes < SMALL_CHUNK_BYTES:
        advice += (
            f"; its chunks of {human_bytes(facts.chunk_bytes)} are small: larger ones "
            "(--chunk-bytes 8MiB) read in fewer, larger requests"
        )
    return advice
