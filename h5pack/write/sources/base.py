"""What a conversion reads: a ``SampleSource`` of keyed samples, whatever the input.

NOTE [ Sample sources ]: convert, ``--shards``, ``--dask`` and ``verify --source`` see
every input through this one interface (decision 0050). A source lists its samples in a
deterministic order, each a ``Sample``: its ``key`` (a relative path, an archive member),
the ``image`` to decode (encoded bytes, pixels, or a ``FileRange`` that a worker process
reads itself) and its other ``fields`` already parsed (``{"label": 3}``). Entries that
cannot be samples are the source's ``problems``: skipped with a warning naming each key,
or refused with ``--strict``. ``split`` cuts the write order into shards, the same way in
every process.
"""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from h5pack._types import StrPath
from h5pack.core.fields import StoredField
from h5pack.core.format import SkippedFile
from h5pack.core.packset import shard_slice
from h5pack.core.source import ByteSource
from h5pack.core.store import Store, is_url, open_store
from h5pack.errors import DecodeError, H5PackError, OptionsError
from h5pack.write.options import ConvertOptions

_OPENED: OrderedDict[tuple[int, Store, str], ByteSource] = OrderedDict()


def opened(store: Store, url: str) -> ByteSource:
    """Return this process's source of the object ``url`` (made on first use, 16 kept)."""
    key = (os.getpid(), store, url)
    found = _OPENED.pop(key, None) or store.source(url)
    _OPENED[key] = found
    while len(_OPENED) > 16:  # dropped, not closed: another thread may be reading it
        _OPENED.popitem(last=False)
    return found


def read_object(store: Store, url: str, offset: int, size: int) -> bytes:
    """Return ``size`` bytes of the object ``url`` at ``offset`` (-1: all; else DecodeError)."""
    try:
        source = opened(store, url)
        end = source.size() if size < 0 else offset + size
        data = bytes(source.read(offset, end))
    except (OSError, H5PackError) as err:
        raise DecodeError(f"{url}: cannot read bytes {offset}-{offset + size}: {err}") from err
    if size >= 0 and len(data) != size:
        raise DecodeError(f"{url}: truncated: {len(data)} of {size} bytes at {offset}")
    return data


@dataclass(frozen=True, slots=True)
class FileRange:
    """The bytes of a file to decode: all of it, or ``size`` bytes at ``offset``.

    Picklable, so a worker reads the bytes itself: a local file, or an object of ``store``
    (NOTE [ Sources in a bucket ]). Subclasses read members stored otherwise; one with
    ``in_parent`` is read by the conversion's process, in write order (``ship``).
    """

    path: str
    offset: int = 0
    size: int = -1  # -1: to the end of the file
    store: Store | None = None  # None: a local file
    in_parent: ClassVar[bool] = False

    def read(self) -> bytes:
        """Return the bytes (DecodeError naming the path when they cannot be read)."""
        if self.store is not None:
            return read_object(self.store, self.path, self.offset, self.size)
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                # Opening a FIFO for reading would block until a writer comes.
                raise DecodeError(f"{self.path}: not a regular file, cannot read it")
            with open(self.path, "rb") as f:
                if self.size < 0:
                    return f.read()
                data = os.pread(f.fileno(), self.size, self.offset)
        except OSError as err:
            raise DecodeError(f"{self.path}: cannot read: {err.strerror or err}") from err
        if len(data) != self.size:
            raise DecodeError(f"{self.path}: truncated: {len(data)} of {self.size} bytes")
        return data

    def nbytes(self) -> int:
        """Return how many bytes ``read`` gives (0 when unknown)."""
        if self.size >= 0:
            return self.size
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0


@dataclass(frozen=True, slots=True)
class Unreadable(FileRange):
    """An image that could not be read where it was shipped from: ``read`` says why."""

    reason: str = ""

    def read(self) -> bytes:
        """Raise the DecodeError met when the image was read."""
        raise DecodeError(self.reason)


Image = bytes | bytearray | memoryview | np.ndarray | FileRange
"""What a sample gives to decode: encoded bytes, HWC uint8 pixels, or where the bytes lie."""


def ship(image: Image) -> Image:
    """Return what a worker gets for ``image``: its bytes if only this process reads it."""
    if not isinstance(image, FileRange) or not image.in_parent:
        return image
    try:
        return image.read()
    except DecodeError as err:
        return Unreadable(image.path, reason=str(err))


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: its key (stored as its source path), the image, its other fields.

    ``fields`` is read-only, so that samples may share one (``label_fields``).
    """

    key: str
    image: Image
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> int:
        """The class id, ``-1`` when unlabelled."""
        return int(self.fields.get("label", -1))


def label_fields(labels: Sequence[int]) -> list[Mapping[str, Any]]:
    """Return ``{"label": label}`` for each of ``labels``, one shared mapping per class."""
    shared: dict[int, Mapping[str, Any]] = {}
    return [shared.setdefault(label, {"label": label}) for label in labels]


def load(image: Image) -> bytes | np.ndarray:
    """Return the bytes (or pixels) of ``image``, reading a ``FileRange`` (DecodeError)."""
    if isinstance(image, FileRange):
        return image.read()
    if isinstance(image, np.ndarray):
        return image
    return bytes(image)


def image_bytes(samples: Iterable[Sample]) -> np.ndarray:
    """Return the stored bytes of each sample's image as it stands (int64; 0 if unknown)."""
    sizes = []
    for sample in samples:
        image = sample.image
        if isinstance(image, FileRange):
            sizes.append(image.nbytes())
        elif isinstance(image, np.ndarray | memoryview):
            sizes.append(image.nbytes)
        else:
            sizes.append(len(image))
    return np.asarray(sizes, dtype=np.int64)


class SampleSource(ABC):
    """An input of a conversion (NOTE [ Sample sources ]).

    A subclass sets ``kind`` (the name ``--from`` takes) and lists its samples in ``find``,
    which runs on first use. ``root`` names it in messages; ``parallel``: workers decode
    the samples; ``encoded``: they hold encoded bytes (not pixels).
    """

    kind: ClassVar[str]
    root: str = ""
    parallel: ClassVar[bool] = True
    encoded: bool = True

    @abstractmethod
    def find(self) -> Listing:
        """List the samples, in their deterministic order (called once)."""

    @cached_property
    def listing(self) -> Listing:
        """The samples, classes and problems (``find``, once)."""
        return self.find()

    @property
    def samples(self) -> Sequence[Sample]:
        """The samples, in the source's order."""
        return self.listing.samples

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; a sample's ``label`` indexes them (empty when unlabelled)."""
        return self.listing.classes

    @property
    def problems(self) -> tuple[SkippedFile, ...]:
        """Entries that are not samples, and why."""
        return self.listing.problems

    def check(self, options: ConvertOptions) -> None:
        """Refuse (OptionsError) conversion options that do not fit these samples."""
        return

    def columns(self, positions: np.ndarray) -> dict[str, Any]:
        """Return the values of the stored fields at ``positions``."""
        columns = self.listing.columns
        return {f.name: f.take(columns[f.name], positions) for f in self.listing.fields}

    @property
    def notes(self) -> tuple[str, ...]:
        """What a user should hear besides the problems."""
        return self.listing.notes

    def files(self) -> Iterable[Path]:
        """Return the local files the samples are read from (a target must be none of them)."""
        images = (s.image for s in self.samples)
        return (Path(i.path) for i in images if isinstance(i, FileRange) and i.store is None)

    def split(
        self, index: int = 0, num_shards: int = 1, *, seed: int = 0, shuffle: bool = True
    ) -> np.ndarray:
        """Return the positions (in ``samples``) of shard ``index``'s samples, in write order.

        The write order (``write_order``) is cut into ``num_shards`` consecutive slices, the
        same in every process (OptionsError: ``index`` out of range).
        """
        lo, hi = shard_slice(len(self.samples), index, num_shards)
        return self.write_order(seed, shuffle)[lo:hi]

    def write_order(self, seed: int, shuffle: bool) -> np.ndarray:
        """Return the source positions in write order: a permutation seeded by ``seed``."""
        return _permutation(len(self.samples), seed, shuffle)


@lru_cache(maxsize=2)
def _permutation(num: int, seed: int, shuffle: bool) -> np.ndarray:
    if shuffle:
        order = np.random.default_rng(seed).permutation(num).astype(np.int64)
    else:
        order = np.arange(num, dtype=np.int64)
    order.flags.writeable = False
    return order


def interleave(rows: Sequence[int] | np.ndarray, runs: int, seed: int) -> np.ndarray:
    """Return a seeded random interleaving of ``runs`` runs of consecutive groups of ``rows``.

    Each run keeps its order (one reader reads it front to back); each write position draws
    a run at random, every run as often as it has samples.
    """
    runs = min(runs, len(rows))
    ends = np.concatenate([[0], np.cumsum(rows)])[np.arange(runs + 1) * len(rows) // runs]
    num = int(ends[-1])
    turns = np.random.default_rng(seed).permutation(np.repeat(np.arange(runs), np.diff(ends)))
    order = np.empty(num, dtype=np.int64)
    order[np.argsort(turns, kind="stable")] = np.arange(num, dtype=np.int64)
    order.flags.writeable = False
    return order


class PathSource(SampleSource):
    """A source that a path names (a folder, an archive...): what ``sample_source`` opens.

    Args:
        path: Where the samples are.
        labels_csv: A labels CSV (only for kinds with ``takes_labels``; else OptionsError).
        store: The store of a URL ``path`` (default: ``open_store(path)``).
    """

    takes_labels: ClassVar[bool] = False
    detect_first: ClassVar[bool] = False  # detection tries it before the other kinds
    suffixes: ClassVar[tuple[str, ...]] = ()  # the file names it matches end so

    @classmethod
    def matches(cls, path: Path) -> bool:
        """Whether ``path`` looks like this kind of source (``sample_source``'s detection)."""
        return bool(cls.suffixes) and path.name.lower().endswith(cls.suffixes) and path.is_file()

    def __init__(
        self, path: StrPath, *, labels_csv: StrPath | None = None, store: Store | None = None
    ) -> None:
        if labels_csv is not None and not self.takes_labels:
            raise OptionsError(
                f"--labels (labels_csv=) labels the images of a folder; a {self.kind} source "
                "gives its own labels"
            )
        self.root = os.fspath(path) if is_url(path) else os.fspath(Path(path))
        # the root's store (local for a local path); ``given`` also reads the URLs of the
        # other inputs (annotations, masks, a manifest)
        self.store = store if store is not None and is_url(path) else open_store(path)
        self.given = store
        self.labels_csv = os.fspath(labels_csv) if labels_csv is not None else None


@dataclass(frozen=True)
class Listing:
    """What ``SampleSource.find`` returns.

    ``notes``: what a user should hear besides the problems; ``fields``: the stored fields
    besides image, label and key (``core.fields``), their values in ``columns``.
    """

    samples: Sequence[Sample]
    classes: tuple[str, ...] = ()
    problems: tuple[SkippedFile, ...] = ()
    notes: tuple[str, ...] = ()
    fields: tuple[StoredField, ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)
