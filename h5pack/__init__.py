"""h5pack: pack image folders into chunked HDF5 and read them at the speed of the storage.

Torch-dependent names (``H5ImageDataset``, ``make_loader``...) are imported on first use so
that ``h5pack convert`` and ``h5pack info`` start without importing torch; type checkers see
them through the ``TYPE_CHECKING`` imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from h5pack._version import __version__
from h5pack.errors import (
    CacheClosedError,
    DecodeError,
    FormatError,
    H5PackError,
    OptionsError,
    PackNotFoundError,
    SourceError,
    TargetExistsError,
    VerifyError,
)

if TYPE_CHECKING:
    from h5pack.check import pack_info, packset_info, verify_pack, verify_packset
    from h5pack.core.fields import (
        ArrayField,
        BoxesField,
        BytesField,
        CategoryField,
        InstanceMasksField,
        JSONField,
        MaskField,
        MultiLabelField,
        RaggedField,
        ScalarField,
        TextField,
    )
    from h5pack.core.format import PackMeta, load_meta
    from h5pack.core.layout import Compression
    from h5pack.read.access import Pack
    from h5pack.read.access import Pack as open
    from h5pack.read.boxes import CropSpec
    from h5pack.read.reader import PackReader, ReaderOptions
    from h5pack.training.cache import CacheSpec
    from h5pack.training.dataset import H5ImageDataset, H5IterableDataset
    from h5pack.training.loader import make_loader, seed_everything
    from h5pack.training.mixed import H5MixDataset
    from h5pack.training.prefetch import DevicePrefetcher
    from h5pack.training.sampler import ChunkBatchSampler, ChunkSampler, EpochSpec
    from h5pack.training.weighted import WeightedMix
    from h5pack.write.convert import convert, convert_on_dask, convert_set, write_arrays
    from h5pack.write.merge import MergeReport, merge_packs
    from h5pack.write.options import ConvertOptions
    from h5pack.write.shards import PackSetReport, ShardReport

_MODULES = {
    "h5pack.training.dataset": ("H5ImageDataset", "H5IterableDataset"),
    "h5pack.training.mixed": ("H5MixDataset",),
    "h5pack.training.weighted": ("WeightedMix",),
    "h5pack.training.sampler": ("ChunkSampler", "ChunkBatchSampler", "EpochSpec"),
    "h5pack.training.cache": ("CacheSpec",),
    "h5pack.read.boxes": ("CropSpec",),
    "h5pack.training.loader": ("make_loader", "seed_everything"),
    "h5pack.training.prefetch": ("DevicePrefetcher",),
    "h5pack.write.convert": ("convert", "write_arrays", "convert_set", "convert_on_dask"),
    "h5pack.write.shards": ("PackSetReport", "ShardReport"),
    "h5pack.write.merge": ("merge_packs", "MergeReport"),
    "h5pack.write.options": ("ConvertOptions",),
    "h5pack.core.layout": ("Compression",),
    "h5pack.check": ("pack_info", "verify_pack", "packset_info", "verify_packset"),
    "h5pack.read.reader": ("PackReader", "ReaderOptions"),
    "h5pack.core.format": ("PackMeta", "load_meta"),
    "h5pack.read.access": ("Pack",),
    "h5pack.core.fields": (
        "ArrayField",
        "BoxesField",
        "BytesField",
        "CategoryField",
        "InstanceMasksField",
        "JSONField",
        "MaskField",
        "MultiLabelField",
        "RaggedField",
        "ScalarField",
        "TextField",
    ),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

# Every public name; tests/test_api.py checks that each lazy one resolves.
__all__ = [
    "ArrayField",
    "BoxesField",
    "BytesField",
    "CacheClosedError",
    "CacheSpec",
    "CategoryField",
    "ChunkBatchSampler",
    "ChunkSampler",
    "Compression",
    "ConvertOptions",
    "CropSpec",
    "DecodeError",
    "DevicePrefetcher",
    "EpochSpec",
    "FormatError",
    "H5ImageDataset",
    "H5IterableDataset",
    "H5MixDataset",
    "H5PackError",
    "InstanceMasksField",
    "JSONField",
    "MaskField",
    "MergeReport",
    "MultiLabelField",
    "OptionsError",
    "Pack",
    "PackMeta",
    "PackNotFoundError",
    "PackReader",
    "PackSetReport",
    "RaggedField",
    "ReaderOptions",
    "ScalarField",
    "ShardReport",
    "SourceError",
    "TargetExistsError",
    "TextField",
    "VerifyError",
    "WeightedMix",
    "__version__",
    "convert",
    "convert_on_dask",
    "convert_set",
    "load_meta",
    "make_loader",
    "merge_packs",
    "open",
    "pack_info",
    "packset_info",
    "seed_everything",
    "verify_pack",
    "verify_packset",
    "write_arrays",
]


def __getattr__(name: str) -> Any:
    if name == "open":  # h5pack.open(path) -> Pack, as zarr.open and h5py.File
        name = "Pack"
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'h5pack' has no attribute {name!r}")
