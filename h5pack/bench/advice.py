"""What would help a loader on one pack: the advice of ``bench --diagnose``.

The words live in ``h5pack.training.advice``, which the loader's stall report shares; this
module gathers the facts of the pack a benchmark measures.

Advice is chosen for the pack measured and the loader's settings (``PackFacts``): an
encoded pack is told about the decoded cache, a raw one about its codec, an uncompressed
one about compression, and larger chunks are suggested only for small ones.
"""

from __future__ import annotations

from h5pack.bench.sources import pack_files, source_bytes
from h5pack.bench.throughput import Setup
from h5pack.core import jpegbox
from h5pack.core.machine import available_memory_bytes
from h5pack.training.advice import SMALL_CHUNK_BYTES, PackFacts, advise, share_labels

__all__ = ["SMALL_CHUNK_BYTES", "PackFacts", "advise", "pack_facts", "share_labels"]


def pack_facts(setup: Setup) -> PackFacts:
    """Return the facts of the pack ``setup`` reads, with the memory available now."""
    from h5pack.check import pack_info

    storage = setup.options.remote.storage_options
    # a set's shards share one layout
    info = pack_info(pack_files(setup.source, storage)[0], storage_options=storage)
    meta = setup.loader.dataset.meta
    return PackFacts(
        mode=meta.mode,
        codec=info.codec,
        layout=info.layout,
        chunk_bytes=info.chunk_bytes,
        file_bytes=source_bytes(setup.source, storage),
        image_bytes=int(sum(int(h) * int(w) * int(c) for h, w, c in meta.shapes)),
        available_bytes=available_memory_bytes(),
        workers=setup.loader.workers,
        transforms=setup.options.transforms,
        size=setup.train.size,
        cached=setup.options.cache is not None,
        whole_jpegs=jpegbox.unavailable_reason() or "",
    )
