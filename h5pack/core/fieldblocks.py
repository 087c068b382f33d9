"""The chunks of a pack's stored fields, read whole and kept while their samples are served."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np


class FieldBlocks:
    """Chunks of the stored fields' datasets, read whole and kept (LRU) while served."""

    def __init__(self, handle: Any, keep_bytes: int = 64 << 20) -> None:
        self.handle, self.keep_bytes = handle, keep_bytes
        self._held: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._steps: dict[str, int] = {}

    def _block(self, name: str, chunk: int, step: int) -> np.ndarray:
        key = (name, chunk)
        block = self._held.get(key)
        if block is None:
            block = np.asarray(self.handle[name][chunk * step : (chunk + 1) * step])
            self._held[key] = block
            self._bytes += block.nbytes
            while self._bytes > self.keep_bytes and len(self._held) > 1:
                self._bytes -= self._held.popitem(last=False)[1].nbytes
        self._held.move_to_end(key)
        return block

    def step(self, name: str) -> int:
        """Return the rows of one chunk of the dataset ``name`` (looked up once per name)."""
        step = self._steps.get(name)
        if step is None:
            dataset = self.handle[name]
            step = int(dataset.chunks[0]) if dataset.chunks else max(1, int(dataset.shape[0]))
            self._steps[name] = step
        return step

    def rows(self, name: str, indices: np.ndarray) -> np.ndarray:
        """Return rows ``indices`` of the dataset ``name``."""
        step = self.step(name)
        idx = np.asarray(indices, dtype=np.int64)
        chunks = idx // step
        found: np.ndarray | None = None
        for chunk in np.unique(chunks).tolist():  # a batch's rows lie in a few chunks
            block = self._block(name, chunk, step)
            if found is None:
                found = np.empty((idx.size, *block.shape[1:]), dtype=block.dtype)
            here = chunks == chunk
            found[here] = block[idx[here] - chunk * step]
        return found if found is not None else np.zeros(0, dtype=np.int64)

    def spans(self, name: str, offsets: str, indices: np.ndarray) -> list[np.ndarray]:
        """Return each sample's rows (copies) of ``name``, a variable field with ``offsets``."""
        idx = np.asarray(indices, dtype=np.int64)
        bounds = self.rows(offsets, np.concatenate([idx, idx + 1])).tolist()
        step, found, at, held = self.step(name), [], -1, np.zeros(0)
        for start, stop in zip(bounds[: idx.size], bounds[idx.size :], strict=True):
            chunk = start // step
            if stop > (chunk + 1) * step:  # across chunks
                found.append(self.span(name, start, stop, step))
                continue
            if chunk != at:  # a batch's samples lie in a few chunks: each looked up once
                held, at = self._block(name, chunk, step), chunk
            found.append(held[start - chunk * step : stop - chunk * step].copy())
        return found

    def span(self, name: str, start: int, stop: int, step: int) -> np.ndarray:
        """Return a copy of rows ``start:stop`` of the dataset ``name`` (``step``: ``step()``)."""
        pieces = [
            self._block(name, chunk, step)[
                max(start - chunk * step, 0) : min(stop - chunk * step, step)
            ]
            for chunk in range(start // step, max(start, stop - 1) // step + 1)
        ]
        return pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces)


def blocks_of(source: Any) -> FieldBlocks:
    """Return ``source`` as ``FieldBlocks``: a reader's own, or new ones over a handle."""
    return source if isinstance(source, FieldBlocks) else FieldBlocks(source)
