"""h5pack: pack image folders into chunked HDF5 and read them at the speed of the storage.

Torch-dependent names (``H5ImageDataset``, ``make_loader``...) are imported on first use so
that ``h5pack convert`` and ``h5pack info`` start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "H5ImageDataset": "h5pack.dataset",
    "H5IterableDataset": "h5pack.dataset",
    "ChunkSampler": "h5pack.sampler",
    "ChunkBatchSampler": "h5pack.sampler",
    "make_loader": "h5pack.loader",
    "seed_everything": "h5pack.loader",
    "convert": "h5pack.writer",
    "write_arrays": "h5pack.writer",
    "pack_info": "h5pack.inspect",
    "verify_pack": "h5pack.inspect",
    "PackReader": "h5pack.reader",
    "ConvertOptions": "h5pack.options",
    "PackMeta": "h5pack.format",
    "load_meta": "h5pack.format",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'h5pack' has no attribute {name!r}")
