"""Samples gathered into blocks (runs of whole chunks): fixed-size rows, or an aligned blob."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

UNALIGNED_BLOCK_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Block:
    """Data starting at row ``start`` of the images dataset, at a chunk boundary."""

    start: int
    data: np.ndarray


class ArrayAssembler:
    """Gather fixed-size samples into blocks of ``group_samples`` (one chunk along N).

    With ``reuse``, every block is a view of one buffer, valid until the next ``add``.
    """

    def __init__(
        self, sample_shape: tuple[int, int, int], group_samples: int, *, reuse: bool = False
    ) -> None:
        self.group_samples = group_samples
        self.reuse = reuse
        self.count = 0
        self._block = np.empty((group_samples, *sample_shape), dtype=np.uint8)
        self._fill = 0

    def add(self, sample: np.ndarray) -> Iterator[Block]:
        """Place the next sample; yield a block when one is complete."""
        self._block[self._fill] = sample
        self._fill += 1
        self.count += 1
        if self._fill == self.group_samples:
            yield self._flush()

    def finish(self) -> Iterator[Block]:
        """Yield the last, partial block."""
        if self._fill:
            yield self._flush()

    def _flush(self) -> Block:
        block = Block(self.count - self._fill, self._block[: self._fill])
        if not self.reuse:
            self._block = np.empty_like(self._block)
        self._fill = 0
        return block


def aligned_offsets(sizes: np.ndarray, chunk_bytes: int) -> np.ndarray:
    """Return the N + 1 slot boundaries ``BlobAssembler`` gives samples of ``sizes``.

    NOTE [ Aligned blobs ] as a pure function; ``chunk_bytes=0`` packs them back to back.
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    if chunk_bytes <= 0:
        np.cumsum(sizes, out=offsets[1:])
        return offsets
    step = chunk_bytes
    chunk = fill = 0
    for i, size in enumerate(sizes.tolist()):
        if fill and fill + size > step:  # not in the rest of this chunk: the next one
            chunk, fill = chunk + 1, 0
        offsets[i] = chunk * step + fill
        offsets[i + 1] = offsets[i] + size
        if size > step:  # a sample larger than a chunk owns its chunks
            chunk, fill = chunk - (-size // step), 0
        else:
            fill += size
            if fill == step:
                chunk, fill = chunk + 1, 0
    return offsets


class BlobAssembler:
    """Place variable-size samples into a byte blob of aligned chunks.

    NOTE [ Aligned blobs ]: a sample that does not fit the rest of the current chunk starts
    the next one (the rest is zero padding, in the slot before); one larger than a chunk
    starts at a boundary and owns its chunks. So a group of samples is a run of whole
    chunks (docs/ARCHITECTURE.md, "Aligned blobs"). ``chunk_bytes=0``: no chunks, samples
    back to back in blocks of ``UNALIGNED_BLOCK_BYTES``. ``reuse`` as for ``ArrayAssembler``.
    """

    def __init__(self, chunk_bytes: int, *, capacity: int = 1024, reuse: bool = False) -> None:
        self.aligned = chunk_bytes > 0
        self.reuse = reuse
        self.count = 0
        self._step = chunk_bytes if self.aligned else UNALIGNED_BLOCK_BYTES
        self._offsets = np.zeros(max(1, capacity), dtype=np.int64)
        self._sizes = np.zeros(max(1, capacity), dtype=np.int64)
        self._buffer = np.zeros(self._step, dtype=np.uint8)
        self._spare: np.ndarray | None = None
        self._fill = 0
        self._chunk = 0  # index of the chunk (block) being filled
        self.end = 0  # one past the last byte of data

    def add(self, sample: np.ndarray) -> Iterator[Block]:
        """Place the next sample (1-D uint8); yield every block it completes."""
        if not self.aligned:
            yield from self._add_unaligned(sample)
            return
        size = int(sample.size)
        step = self._step
        if size > step:
            if self._fill:
                yield self._flush()
            start = self._chunk * step
            self._record(start, size)
            self._chunk += math.ceil(size / step)
            self.end = start + size
            yield Block(start, sample)
            return
        if self._fill + size > step:
            yield self._flush()
        start = self._chunk * step + self._fill
        self._buffer[self._fill : self._fill + size] = sample
        self._fill += size
        self._record(start, size)
        self.end = start + size
        if self._fill == step:
            yield self._flush()

    def _add_unaligned(self, sample: np.ndarray) -> Iterator[Block]:
        size = int(sample.size)
        step = self._step
        self._record(self.end, size)
        self.end += size
        done = 0
        while done < size:
            if self._fill == 0 and size - done >= step:
                # Whole blocks straight from the sample, no copy.
                whole = (size - done) // step * step
                yield Block(self._chunk * step, sample[done : done + whole])
                self._chunk += whole // step
                done += whole
                continue
            take = min(size - done, step - self._fill)
            self._buffer[self._fill : self._fill + take] = sample[done : done + take]
            self._fill += take
            done += take
            if self._fill == step:
                yield self._flush()

    def finish(self) -> Iterator[Block]:
        """Yield the last chunk, trimmed to its data."""
        if self._fill:
            yield Block(self._chunk * self._step, self._buffer[: self._fill])
            self._chunk += 1
            self._fill = 0

    @property
    def sizes(self) -> np.ndarray:
        """The byte count of every sample placed so far."""
        return self._sizes[: self.count]

    def final_offsets(self) -> np.ndarray:
        """Return the N + 1 slot boundaries; the last is the end of the data."""
        return np.append(self._offsets[: self.count], self.end)

    def _record(self, start: int, size: int) -> None:
        if self.count == len(self._offsets):
            self._offsets = np.resize(self._offsets, 2 * self.count)
            self._sizes = np.resize(self._sizes, 2 * self.count)
        self._offsets[self.count] = start
        self._sizes[self.count] = size
        self.count += 1

    def _flush(self) -> Block:
        # The whole chunk, padding included: only the last block is shorter.
        block = Block(self._chunk * self._step, self._buffer)
        if self.reuse:  # two buffers take turns; the yielded one stays intact
            spare = self._spare
            self._buffer = spare if spare is not None else np.empty_like(block.data)
            self._spare = block.data
            self._buffer[:] = 0  # padding of the next chunk
        else:
            self._buffer = np.zeros(self._step, dtype=np.uint8)
        self._chunk += 1
        self._fill = 0
        return block
