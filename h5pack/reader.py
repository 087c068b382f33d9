"""Read samples from a pack, one read per chunk (or contiguous run), never one per sample."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from h5pack import format as fmt
from h5pack._types import StrPath
from h5pack.layout import DEFAULT_CHUNK_BYTES, ChunkMap, cache_settings, chunk_samples_for


def chunk_map_of(meta: fmt.PackMeta) -> ChunkMap:
    """Return the groups of samples that are read together in ``meta``'s pack.

    A chunked pack groups by HDF5 chunk. A contiguous pack has no chunks; it is grouped
    in runs of about ``DEFAULT_CHUNK_BYTES``, which is what a sampler should keep together
    for sequential reads.
    """
    if meta.storage == "array":
        if meta.chunks is not None:
            return ChunkMap.regular(meta.num_samples, meta.chunks[0])
        sample_bytes = int(np.prod(meta.images_shape[1:]))
        per_group = chunk_samples_for(max(1, sample_bytes), DEFAULT_CHUNK_BYTES)
        return ChunkMap.regular(meta.num_samples, per_group)
    assert meta.offsets is not None  # read_meta guarantees offsets for blob storage
    group_bytes = meta.chunks[0] if meta.chunks is not None else DEFAULT_CHUNK_BYTES
    return ChunkMap.for_blob(meta.offsets, group_bytes)


def stored_chunk_bytes(meta: fmt.PackMeta) -> int:
    """Return the uncompressed bytes of one chunk (or one read group for contiguous packs)."""
    if meta.chunks is not None:
        return int(np.prod(meta.chunks))
    if meta.storage == "array":
        sample_bytes = int(np.prod(meta.images_shape[1:]))
        return sample_bytes * chunk_samples_for(max(1, sample_bytes), DEFAULT_CHUNK_BYTES)
    return DEFAULT_CHUNK_BYTES


def is_compressed(meta: fmt.PackMeta) -> bool:
    """Return whether the pack's images pass through an HDF5 filter."""
    return bool(meta.filter_ids)


class PackReader:
    """Read samples of a pack grouped by chunk; a context manager, read-only.

    Args:
        path: The pack.
        cache_bytes: HDF5 chunk-cache size; ``None`` sizes it for ``window_chunks`` chunks
            (and turns it off for uncompressed packs, where it only costs).
        window_chunks: How many chunks a reader keeps in use at once (the sampler's window).
        locking: HDF5 file locking; ``False`` for network file systems.
        backend: Decoder for encoded packs (``"pillow"`` or ``"opencv"``).

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, or is of a newer format version.
    """

    def __init__(
        self,
        path: StrPath,
        *,
        cache_bytes: int | None = None,
        window_chunks: int = 1,
        locking: bool | None = None,
        backend: str = "pillow",
    ) -> None:
        self.path = os.fspath(path)
        self.backend = backend
        with fmt.open_h5(self.path, locking=locking) as probe:
            self.meta = fmt.read_meta(probe, self.path)
        self.chunk_map = chunk_map_of(self.meta)
        settings: dict[str, Any] = cache_settings(
            compressed=is_compressed(self.meta),
            window_chunks=window_chunks,
            chunk_bytes=stored_chunk_bytes(self.meta),
        )
        if cache_bytes is not None:
            settings["rdcc_nbytes"] = cache_bytes
        self._file: h5py.File = fmt.open_h5(self.path, locking=locking, **settings)
        self._images: h5py.Dataset = self._file[fmt.IMAGES]
        self._compressed = is_compressed(self.meta)
        self._paths: list[str] | None = None

    # -- context manager -------------------------------------------------------------
    def close(self) -> None:
        """Close the file."""
        if self._file.id.valid:
            self._file.close()

    def __enter__(self) -> PackReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __len__(self) -> int:
        return self.meta.num_samples

    @property
    def paths(self) -> list[str]:
        """Every sample's relative source path, in pack order (read on first use)."""
        if self._paths is None:
            self._paths = fmt.read_paths(self._file)
        return self._paths

    # -- reading ---------------------------------------------------------------------
    def read_stored(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return the stored form of each sample in ``indices``, in that order.

        Array storage gives HWC uint8 arrays; blob storage gives the 1-D uint8 bytes of
        the sample (flat pixels, or the encoded file). Indices are grouped by chunk and
        each chunk is read once per call.

        Raises:
            IndexError: an index is out of range.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self.meta.num_samples
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"index {bad} is out of range for a pack of {n} samples")
        idx = np.where(idx < 0, idx + n, idx)
        out: list[np.ndarray | None] = [None] * idx.size
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        groups = self.chunk_map.chunks_of(sorted_idx)
        boundaries = np.flatnonzero(np.diff(groups)) + 1
        for positions, wanted in zip(
            np.split(order, boundaries), np.split(sorted_idx, boundaries), strict=True
        ):
            for pos, sample in zip(positions, self._read_group(wanted), strict=True):
                out[int(pos)] = sample
        return out  # type: ignore[return-value]  # every slot is filled above

    def _read_group(self, wanted: np.ndarray) -> list[np.ndarray]:
        """Read sorted indices that all live in one group."""
        if self.meta.storage == "array":
            return self._read_array_group(wanted)
        return self._read_blob_group(wanted)

    def _runs(self, wanted: np.ndarray) -> list[tuple[int, int]]:
        """Return the [lo, hi) ranges to read for sorted ``wanted`` indices of one group.

        A compressed chunk is decompressed whole whatever is selected, so it is read in
        one span; uncompressed data is read as runs of consecutive indices, so nothing
        unwanted crosses from the disk.
        """
        lo, hi = int(wanted[0]), int(wanted[-1]) + 1
        if self._compressed:
            return [(lo, hi)]
        unique = np.unique(wanted)
        breaks = np.flatnonzero(np.diff(unique) > 1) + 1
        return [(int(run[0]), int(run[-1]) + 1) for run in np.split(unique, breaks)]

    def _read_array_group(self, wanted: np.ndarray) -> list[np.ndarray]:
        result: list[np.ndarray] = []
        for lo, hi in self._runs(wanted):
            block = self._images[lo:hi]
            inside = wanted[(wanted >= lo) & (wanted < hi)]
            result.extend(block[int(i) - lo] for i in inside)
        return result

    def _read_blob_group(self, wanted: np.ndarray) -> list[np.ndarray]:
        offsets, sizes = self.meta.offsets, self.meta.sizes
        assert offsets is not None  # blob storage, see read_meta
        assert sizes is not None
        result: list[np.ndarray] = []
        for lo, hi in self._runs(wanted):
            base = int(offsets[lo])
            block = self._images[base : int(offsets[hi - 1]) + int(sizes[hi - 1])]
            for i in wanted[(wanted >= lo) & (wanted < hi)]:
                start = int(offsets[i]) - base
                result.append(block[start : start + int(sizes[i])])
        return result

    def read_chunk(self, chunk: int) -> list[np.ndarray]:
        """Return the stored form of every sample in group ``chunk``."""
        indices = self.chunk_map.samples(chunk)
        return self.read_stored(np.arange(indices.start, indices.stop))

    def decode(self, index: int, stored: np.ndarray) -> np.ndarray:
        """Return sample ``index`` as an HWC uint8 array from its stored form.

        Raises:
            DecodeError: an encoded sample does not decode.
        """
        if self.meta.storage == "array":
            return stored
        if self.meta.mode == "raw":
            h, w, c = (int(s) for s in self.meta.shapes[index])
            return stored.reshape(h, w, c)
        from h5pack.decode import decode_image

        return decode_image(
            stored.tobytes(),
            name=f"{self.path}[{index}] ({self.paths[index]})",
            backend=self.backend,  # type: ignore[arg-type]
            channels=self.meta.channels,
        )

    def read_images(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Return each sample in ``indices`` as an HWC uint8 array."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        stored = self.read_stored(idx)
        return [self.decode(int(i), s) for i, s in zip(idx, stored, strict=True)]

    def iter_chunks(self) -> Iterator[tuple[range, list[np.ndarray]]]:
        """Yield ``(indices, stored samples)`` for every group, in pack order."""
        for chunk in range(self.chunk_map.num_chunks):
            indices = self.chunk_map.samples(chunk)
            yield indices, self.read_stored(np.arange(indices.start, indices.stop))
