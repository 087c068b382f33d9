"""PyTorch datasets over a pack: map-style ``H5ImageDataset`` and ``H5IterableDataset``."""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any, Literal, overload

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from h5pack._types import StrPath
from h5pack.core.format import PackMeta, load_meta
from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.read.reader import PackReader, chunk_map_of, is_compressed, stored_chunk_bytes
from h5pack.training.sampler import distributed_defaults, plan_epoch, window_for

# NOTE [ h5py handles and fork ]
#
# An HDF5 handle must not cross ``fork`` (the child would share the parent's library state)
# and cannot be pickled for ``spawn``/``forkserver``. The datasets hold a path and open a
# ``PackReader`` lazily, once per process (keyed on the pid); ``__getstate__`` drops it, so
# every DataLoader start method works and each worker opens its own handle, with hdf5plugin
# registered by ``format.open_h5`` in that worker.

Output = Literal["tensor", "hwc", "pil"]
OUTPUTS: tuple[str, ...] = ("tensor", "hwc", "pil")


def empty_uint8(shape: Sequence[int]) -> torch.Tensor:
    """Return an uninitialised uint8 tensor; in a DataLoader worker, in shared memory.

    A batch built in shared memory crosses to the main process without the extra copy
    the worker's pickler would otherwise make (``default_collate`` does the same).
    """
    if get_worker_info() is None:
        return torch.empty(tuple(shape), dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(max(1, math.prod(shape)))  # type: ignore[no-untyped-call]
    return (
        torch.empty(0, dtype=torch.uint8)
        .set_(storage)
        .view(-1)[: math.prod(shape)]
        .view(tuple(shape))
    )


class SampleBatch(Sequence[tuple[Any, ...]]):
    """The samples of one ``__getitems__`` call, and the whole batch when already built.

    A sequence of ``(image, label[, path])`` like any PyTorch dataset's batch, so any
    collate function works; ``h5pack.training.loader.collate`` takes ``images`` and ``labels``
    directly instead of stacking the samples again. When the batch was built at once the
    per-sample tuples are views made on access, not before.

    Attributes:
        images: ``(B, C, H, W)`` uint8 tensor (channels-last memory) or ``(B, H, W, C)``
            array, or None when the samples were produced one by one.
        labels: ``(B,)`` int64 tensor, or None (with a ``target_transform``).
        paths: Source paths with ``return_path``, else None.
    """

    def __init__(
        self,
        samples: list[tuple[Any, ...]] | None = None,
        *,
        images: Any = None,
        labels: torch.Tensor | None = None,
        label_values: list[Any] | None = None,
        paths: list[str] | None = None,
    ) -> None:
        self._samples = samples
        self.images = images
        self.labels = labels
        self._label_values = label_values or []
        self.paths = paths

    def __len__(self) -> int:
        return len(self._samples) if self._samples is not None else len(self._label_values)

    @overload
    def __getitem__(self, j: int) -> tuple[Any, ...]: ...

    @overload
    def __getitem__(self, j: slice) -> list[tuple[Any, ...]]: ...

    def __getitem__(self, j: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        if self._samples is not None:
            return self._samples[j]
        label = self._label_values[j]
        if self.paths is None:
            return (self.images[j], label)
        return (self.images[j], label, self.paths[j])


class H5ImageDataset(Dataset[tuple[Any, ...]]):
    """Map-style dataset over a pack: ``(image, label)`` or ``(image, label, path)``.

    Works with every mode and layout the converter writes. ``__getitems__`` (PyTorch's
    batched fetch) groups the requested indices by chunk and reads each chunk once; a
    compressed chunk is then kept in a window of ``window_chunks`` decompressed chunks, so
    with ``ChunkBatchSampler`` each chunk is decompressed once per epoch. The file is opened
    lazily once per process (see the note "h5py handles and fork").

    Args:
        path: The pack.
        transform: Any callable applied to each image (torchvision v2 transforms work).
        target_transform: Any callable applied to each label (an int, -1 when unlabeled).
        output: ``"tensor"``: (C, H, W) uint8 tensor; ``"hwc"``: (H, W, C) uint8 array;
            ``"pil"``: a PIL image.
        return_path: Also return the sample's source path.
        cache_bytes: Bytes of decompressed chunks kept per process. Default: the sampler's
            window (``make_loader`` sets ``window_chunks``), else ``sampler.window_for``.
        window_chunks: Decompressed chunks kept per process (see ``cache_bytes``).
        locking: HDF5 file locking; ``False`` for network file systems that do not support
            it, or to read a pack that a writer still holds.
        backend: Decoder of encoded packs, ``"pillow"`` or ``"opencv"``.
        direct: Read chunks with the direct chunk path where it applies.
        threads: Threads decompressing chunks in parallel (direct path; codecs that release
            the GIL), useful when reading in the main process.
        verify_checksums: Check every sample against its recorded CRC32 as it is read
            (``PackReader``); a damaged sample raises ``FormatError`` instead of being served.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, or of a newer format version.
        OptionsError: an unknown ``output``.
    """

    def __init__(
        self,
        path: StrPath,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        output: Output = "tensor",
        return_path: bool = False,
        cache_bytes: int | None = None,
        window_chunks: int | None = None,
        locking: bool | None = None,
        backend: str = "pillow",
        direct: bool = True,
        threads: int = 0,
        verify_checksums: bool = False,
    ) -> None:
        if output not in OUTPUTS:
            raise OptionsError(f"output should be one of {', '.join(OUTPUTS)}, but got {output!r}")
        self.path = os.fspath(path)
        self.meta: PackMeta = load_meta(self.path, locking=locking)
        self.chunk_map: ChunkMap = chunk_map_of(self.meta)
        self.chunk_bytes = stored_chunk_bytes(self.meta)
        self.compressed = is_compressed(self.meta)
        self.transform = transform
        self.target_transform = target_transform
        self.output: Output = output
        self.return_path = return_path
        self.cache_bytes = cache_bytes
        self.window_chunks = window_chunks
        self.locking = locking
        self.backend = backend
        self.direct = direct
        self.threads = threads
        self.verify_checksums = verify_checksums
        self._reader: PackReader | None = None
        self._pid = -1

    # -- process-local file ------------------------------------------------------------
    @property
    def reader(self) -> PackReader:
        """This process's reader, opened on first use (see "h5py handles and fork")."""
        if self._reader is None or self._pid != os.getpid():
            window = self.window_chunks or window_for(
                window_chunks=None, window_bytes=None, chunk_bytes=self.chunk_bytes, num_workers=0
            )
            self._reader = PackReader(
                self.path,
                cache_bytes=self.cache_bytes,
                window_chunks=window,
                locking=self.locking,
                backend=self.backend,
                direct=self.direct,
                threads=self.threads,
                verify_checksums=self.verify_checksums,
            )
            self._pid = os.getpid()
        return self._reader

    def close(self) -> None:
        """Close this process's reader (it reopens on the next read)."""
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_pid"] = -1
        return state

    # -- Dataset protocol ----------------------------------------------------------------
    def __len__(self) -> int:
        return self.meta.num_samples

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; labels index into them."""
        return self.meta.classes

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label, in pack order."""
        return self.meta.labels

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        sample = self.__getitems__([index])[0]
        if self.output == "tensor" and self.transform is None:
            # one sample on its own: a plain contiguous (C, H, W) tensor
            return (sample[0].contiguous(), *sample[1:])
        return sample

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """Return the samples ``indices``, reading each chunk once (PyTorch's batched fetch).

        Raises:
            IndexError: an index is out of range.
            DecodeError: an encoded sample does not decode.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self.meta.num_samples
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"index {bad} is out of range for a pack of {n} samples")
        idx = np.where(idx < 0, idx + n, idx)
        reader = self.reader
        paths = [reader.paths[i] for i in idx.tolist()] if self.return_path else None
        raw_labels = self.meta.labels[idx]
        if self.target_transform is None:
            labels: list[Any] = raw_labels.tolist()
            label_tensor: torch.Tensor | None = torch.from_numpy(raw_labels.copy())
        else:
            labels = [self.target_transform(int(v)) for v in raw_labels]
            label_tensor = None
        fixed = self.meta.fixed_shape
        if fixed is not None and self.transform is None and self.output != "pil":
            buffer = empty_uint8((idx.size, *fixed))
            reader.read_into(idx, buffer.numpy())
            images: Any = buffer.permute(0, 3, 1, 2) if self.output == "tensor" else buffer.numpy()
            return SampleBatch(images=images, labels=label_tensor, label_values=labels, paths=paths)
        stored = reader.read_stored(idx)
        items = list(zip(idx.tolist(), stored, strict=True))
        if self.meta.mode == "encoded":
            # Pillow and OpenCV release the GIL while decoding: threads decode in parallel.
            hwc = reader.map_threads(lambda item: reader.decode(*item), items)
        else:
            hwc = [reader.decode(i, data) for i, data in items]
        samples = []
        for j, array in enumerate(hwc):
            image = self._convert(array)
            if self.transform is not None:  # in this thread: user transforms may share state
                image = self.transform(image)
            samples.append(self._tuple(image, labels[j], paths, j))
        return SampleBatch(samples, paths=paths)

    def _convert(self, hwc: np.ndarray) -> Any:
        if self.output == "hwc":
            return hwc
        if self.output == "pil":
            return Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc)
        return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))

    def _tuple(self, image: Any, label: Any, paths: list[str] | None, j: int) -> tuple[Any, ...]:
        return (image, label) if paths is None else (image, label, paths[j])


class _Epoch:
    """A stand-in for the shared epoch value once the dataset leaves its process tree."""

    def __init__(self, value: int) -> None:
        self.value = value


class H5IterableDataset(IterableDataset[tuple[Any, ...]]):
    """Iterable-style dataset over a pack: the chunk-aware epoch as a stream of samples.

    Inside ``__iter__`` the chunks are split across ranks and DataLoader workers (no
    ``worker_init_fn`` needed) exactly as ``ChunkBatchSampler`` splits them, windows of
    chunks are shuffled, and every sample comes once per epoch (padding and dropping across
    ranks as described in the sampler's note "Chunk-aware epoch order"). ``set_epoch``
    reaches workers that are already running (persistent workers): the epoch lives in
    shared memory.

    Args:
        path: The pack.
        batch_size: The DataLoader's batch size, so that each worker's stream divides into
            whole batches and only the last batch of an epoch is short.
        shuffle: Shuffle chunks and windows.
        seed: Seed of the order.
        window_chunks: Chunks mixed at once by one worker; default from ``window_bytes``.
        window_bytes: Memory budget of all workers' windows.
        drop_last: As for ``ChunkBatchSampler``.
        num_replicas: Ranks (default from ``torch.distributed``).
        rank: This rank (default from ``torch.distributed``).
        **dataset_kwargs: Passed to ``H5ImageDataset`` (transform, output, return_path...).
    """

    def __init__(
        self,
        path: StrPath,
        *,
        batch_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        window_chunks: int | None = None,
        window_bytes: int | None = None,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        **dataset_kwargs: Any,
    ) -> None:
        if batch_size < 1:
            raise OptionsError(f"batch_size should be >= 1, but got batch_size={batch_size}")
        self.dataset = H5ImageDataset(path, **dataset_kwargs)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.window_chunks = window_chunks
        self.window_bytes = window_bytes
        self.drop_last = drop_last
        self.num_replicas, self.rank = distributed_defaults(num_replicas, rank)
        self._epoch: Any = multiprocessing.get_context().RawValue("q", 0)

    @property
    def epoch(self) -> int:
        """The epoch of the next iteration."""
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (seen by running workers too)."""
        self._epoch.value = int(epoch)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if get_spawning_popen() is None:
            # Shared memory travels only to processes being started; elsewhere (a copy, a
            # pickle to disk) keep the value.
            state["_epoch"] = _Epoch(self.epoch)
        return state

    def __len__(self) -> int:
        n = self.dataset.meta.num_samples
        if n == 0:
            return 0
        if self.drop_last:
            return n // self.num_replicas // self.batch_size * self.batch_size
        return math.ceil(n / self.num_replicas)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        window = window_for(
            window_chunks=self.window_chunks,
            window_bytes=self.window_bytes,
            chunk_bytes=self.dataset.chunk_bytes,
            num_workers=workers,
        )
        if self.dataset.window_chunks is None:
            self.dataset.window_chunks = window
        batches = plan_epoch(
            self.dataset.chunk_map,
            self.batch_size,
            epoch=self.epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            window_chunks=window,
            drop_last=self.drop_last,
            num_replicas=self.num_replicas,
            rank=self.rank,
            num_workers=workers,
        )
        for batch in batches[worker::workers]:
            samples = self.dataset.__getitems__(batch.tolist())
            if samples.images is not None and self.dataset.output == "tensor":
                # detach the samples from the batch buffer: each is collated on its own
                yield from ((s[0].contiguous(), *s[1:]) for s in samples)
            else:
                yield from samples
