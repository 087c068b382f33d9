"""PyTorch datasets over a pack: map-style ``H5ImageDataset`` and ``H5IterableDataset``.

The public home of the dataset names: ``training.mapstyle`` holds the map-style dataset,
``training.stream`` the iterable one, ``training.batch`` what they share; importing this
module also imports ``training.mixed``, which ``H5ImageDataset(weights=...)`` builds.
"""

from h5pack.core.vocabulary import OUTPUTS, Output
from h5pack.training.batch import (
    SampleBatch,
    SharedEpoch,
    check_source,
    empty_uint8,
    fields_for,
    source_of,
)
from h5pack.training.mapstyle import H5ImageDataset
from h5pack.training.mixed import H5MixDataset
from h5pack.training.stream import EpochPlanner, H5IterableDataset

__all__ = [
    "OUTPUTS",
    "EpochPlanner",
    "H5ImageDataset",
    "H5IterableDataset",
    "H5MixDataset",
    "Output",
    "SampleBatch",
    "SharedEpoch",
    "check_source",
    "empty_uint8",
    "fields_for",
    "source_of",
]
