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
    from h5pack.write.convert import convert, write_arrays
    from h5pack.write.dask import convert_on_dask
    from h5pack.write.merge import MergeReport, merge_packs
    from h5pack.write.options import ConvertOptions
    from h5pack.write.shards import PackSetReport, ShardReport, convert_set

_LAZY = {
    "H5ImageDataset": "h5pack.training.dataset",
    "H5IterableDataset": "h5pack.training.dataset",
    "H5MixDataset": "h5pack.training.mixed",
    "WeightedMix": "h5pack.training.weighted",
    "ChunkSampler": "h5pack.training.sampler",
    "ChunkBatchSampler": "h5pack.training.sampler",
    "EpochSpec": "h5pack.training.sampler",
    "CacheSpec": "h5pack.training.cache",
    "CropSpec": "h5pack.read.boxes",
    "make_loader": "h5pack.training.loader",
    "seed_everything": "h5pack.training.loader",
    "DevicePrefetcher": "h5pack.training.prefetch",
    "convert": "h5pack.write.convert",
    "write_arrays": "h5pack.write.convert",
    "convert_set": "h5pack.write.shards",
    "PackSetReport": "h5pack.write.shards",
    "ShardReport": "h5pack.write.shards",
    "convert_on_dask": "h5pack.write.dask",
    "merge_packs": "h5pack.write.merge",
    "MergeReport": "h5pack.write.merge",
    "ConvertOptions": "h5pack.write.options",
    "Compression": "h5pack.core.layout",
    "pack_info": "h5pack.check",
    "verify_pack": "h5pack.check",
    "packset_info": "h5pack.check",
    "verify_packset": "h5pack.check",
    "PackReader": "h5pack.read.reader",
    "ReaderOptions": "h5pack.read.reader",
    "PackMeta": "h5pack.core.format",
    "Pack": "h5pack.read.access",
    "ArrayField": "h5pack.core.fields",
    "BoxesField": "h5pack.core.fields",
    "BytesField": "h5pack.core.fields",
    "CategoryField": "h5pack.core.fields",
    "InstanceMasksField": "h5pack.core.fields",
    "JSONField": "h5pack.core.fields",
    "MaskField": "h5pack.core.fields",
    "MultiLabelField": "h5pack.core.fields",
    "RaggedField": "h5pack.core.fields",
    "ScalarField": "h5pack.core.fields",
    "TextField": "h5pack.core.fields",
    "load_meta": "h5pack.core.format",
}

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
