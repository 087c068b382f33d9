"""Loaders as the benchmarks drive them: one epoch timed, batches counted, transforms.

torch is imported inside the functions, so that importing ``h5pack.bench`` stays light.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from h5pack.bench.timing import Count


def collate_any(batch: Sequence[Any]) -> Any:
    """Collate like ``h5pack.training.loader.collate_batch``; images of different sizes stay a list.

    Encoded packs of images of several sizes have no common batch shape; a training
    pipeline would resize them in a transform. The benchmark delivers them as decoded.
    """
    import torch

    from h5pack.training.dataset import SampleBatch
    from h5pack.training.loader import collate_batch as collate

    if isinstance(batch, SampleBatch) and batch.images is not None:
        return collate(batch)
    shapes = {tuple(getattr(sample[0], "shape", ())) for sample in batch}
    if len(shapes) <= 1:
        return collate(batch)
    labels = torch.as_tensor([int(sample[1]) for sample in batch], dtype=torch.int64)
    return [sample[0] for sample in batch], labels


def count_batch(batch: Any) -> Count:
    """Return the images in a collated batch and their bytes."""
    images = batch[0]
    if isinstance(images, list):
        return Count(len(images), sum(_nbytes(image) for image in images))
    return Count(int(images.shape[0]), _nbytes(images))


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return int(value.numel() * value.element_size())


def run_epoch(
    loader: Iterable[Any], *, max_batches: int | None = None, budget_s: float | None = None
) -> Count:
    """Iterate ``loader`` once and count what it delivered.

    Args:
        loader: Anything yielding collated batches.
        max_batches: Stop after this many batches.
        budget_s: Stop after the first batch that ends past this many seconds (a prefix
            of the epoch measures a steady rate).
    """
    images = nbytes = 0
    started = time.perf_counter()
    for number, batch in enumerate(loader):
        counted = count_batch(batch)
        images += counted.images
        nbytes += counted.nbytes
        if max_batches is not None and number + 1 >= max_batches:
            break
        if budget_s is not None and time.perf_counter() - started > budget_s:
            break
    return Count(images, nbytes)


class TrainTransform:
    """A typical training augmentation on a (C, H, W) uint8 tensor, for ``--transforms``.

    A random crop of 7/8 of each side, a random horizontal flip, then conversion to
    float32 normalised with the ImageNet mean and deviation: the per-sample work most
    image classifiers do, with torch only (no torchvision). Uses torch's RNG, which the
    loader seeds per worker.
    """

    MEAN = (0.485, 0.456, 0.406)
    STD = (0.229, 0.224, 0.225)

    def __call__(self, image: Any) -> Any:
        """Return the augmented, normalised (C, h, w) float32 tensor of ``image``."""
        import torch

        if isinstance(image, np.ndarray):  # (H, W, C) arrays from output="hwc"
            image = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
        channels, height, width = image.shape
        crop_h, crop_w = max(1, height * 7 // 8), max(1, width * 7 // 8)
        top = int(torch.randint(0, height - crop_h + 1, ()).item())
        left = int(torch.randint(0, width - crop_w + 1, ()).item())
        image = image[:, top : top + crop_h, left : left + crop_w]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        mean = torch.tensor(self.MEAN[:channels] if channels == 3 else self.MEAN[:1])
        std = torch.tensor(self.STD[:channels] if channels == 3 else self.STD[:1])
        return (image.float().div_(255.0) - mean[:, None, None]) / std[:, None, None]
