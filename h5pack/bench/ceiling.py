"""The loader's ceiling for ``bench --diagnose``: the pack's images held in memory.

See the note "Diagnosing a loader" in ``h5pack.bench.diagnose``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from h5pack.bench.loaders import PatternLoader, run_epoch
from h5pack.bench.timing import Count


class InMemoryImages:
    """The pack's first images held in memory, served like ``H5ImageDataset``: the loader ceiling.

    Batches come out exactly as the pack's dataset gives them (one preallocated
    ``(B, C, H, W)`` uint8 batch, in shared memory inside a worker, filled by ``threads``
    threads as the reader fills it; or per-sample tensors), so that the
    ceiling does the same loader work as reading the pack, minus the reading itself.

    Args:
        images: ``(H, W, C)`` uint8 arrays as the loader delivers them (cropped already).
        labels: Their labels.
        length: The dataset's length (indices wrap around the images held).
        threads: Threads filling a batch, as the pack's reader has them.
    """

    def __init__(
        self,
        images: list[np.ndarray],
        labels: np.ndarray,
        length: int,
        *,
        threads: int = 0,
    ) -> None:
        self.images = images
        shapes = {image.shape for image in images}
        self.stack = np.stack(images) if len(shapes) == 1 and images else None
        self.labels = labels
        self.length = length
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return self.length

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        return state

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def close(self) -> None:
        """Stop this process's filling threads (they restart on the next batch)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _fill(self, idx: np.ndarray, out: np.ndarray) -> None:
        stack = self.stack
        assert stack is not None  # the caller checked
        if self.threads < 2 or idx.size < 2:
            np.take(stack, idx, axis=0, out=out)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads)
        bounds = np.linspace(0, idx.size, self.threads + 1).astype(np.int64)

        def part(k: int) -> None:
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            np.take(stack, idx[lo:hi], axis=0, out=out[lo:hi])

        list(self._pool.map(part, range(self.threads)))

    def __getitems__(self, indices: list[int]) -> Any:
        import torch

        from h5pack.training.dataset import SampleBatch, empty_uint8

        idx = np.asarray(indices, dtype=np.int64) % max(1, len(self.images))
        labels = torch.from_numpy(self.labels[idx].copy())
        if self.stack is not None:
            buffer = empty_uint8((idx.size, *self.stack.shape[1:]))
            self._fill(idx, buffer.numpy())
            return SampleBatch(
                images=buffer.permute(0, 3, 1, 2), labels=labels, label_values=labels.tolist()
            )
        samples = []
        for j, i in enumerate(idx.tolist()):
            image = torch.from_numpy(np.ascontiguousarray(self.images[i].transpose(2, 0, 1)))
            samples.append((image, int(labels[j])))
        return SampleBatch(samples)


def held_images(dataset: Any, limit: int = 256) -> tuple[list[np.ndarray], np.ndarray]:
    """Return the first ``limit`` images of ``dataset`` as the loader delivers them (HWC)."""
    from h5pack.training.dataset import H5ImageDataset

    held = min(len(dataset), limit)
    twin = H5ImageDataset(dataset.source, output="hwc", reader=dataset.options, crop=dataset.crop)
    try:
        batch = twin.__getitems__(list(range(held))) if held else None
    finally:
        twin.close()
    if batch is None:
        return [], np.zeros(0, dtype=np.int64)
    if batch.images is not None:
        images = [np.ascontiguousarray(image) for image in batch.images]
    else:
        images = [np.ascontiguousarray(sample[0]) for sample in batch]
    return images, np.asarray(dataset.labels[:held], dtype=np.int64)


class CeilingRunner:
    """Epochs of in-memory batches with the warm loader's settings (see "Diagnosing a loader")."""

    def __init__(self, pattern: PatternLoader, memory: InMemoryImages) -> None:
        self.pattern = pattern
        self.memory = memory
        self.loader: Any = None
        self.epoch = 0

    def __call__(self) -> Count:
        """Run the next epoch of in-memory batches."""
        loader = self.loader
        if loader is None or self.pattern.fresh:  # alike: a fresh loader when the pack has one
            loader = self.pattern.dataloader(self.memory, persistent=not self.pattern.fresh)
            self.loader = None if self.pattern.fresh else loader
        loader.batch_sampler.set_epoch(self.epoch)
        self.epoch += 1
        return run_epoch(loader, max_batches=self.pattern.max_batches)

    def close(self) -> None:
        """Drop the loader and stop the filling threads."""
        self.loader = None
        self.memory.close()
