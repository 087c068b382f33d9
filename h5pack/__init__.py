"""h5pack: pack image folders into chunked HDF5 and read them at the speed of the storage.

Torch-dependent names (``H5ImageDataset``, ``make_loader``...) are imported on first use so
that ``h5pack convert`` and ``h5pack info`` start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "H5ImageDataset": "h5pack.training.dataset",
    "H5IterableDataset": "h5pack.training.dataset",
    "ChunkSampler": "h5pack.training.sampler",
    "ChunkBatchSampler": "h5pack.training.sampler",
    "make_loader": "h5pack.training.loader",
    "seed_everything": "h5pack.training.loader",
    "convert": "h5pack.write.convert",
    "write_arrays": "h5pack.write.convert",
    "pack_info": "h5pack.check",
    "verify_pack": "h5pack.check",
    "PackReader": "h5pack.read.reader",
    "ConvertOptions": "h5pack.write.options",
    "PackMeta": "h5pack.core.format",
    "load_meta": "h5pack.core.format",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'h5pack' has no attribute {name!r}")
