"""Fixed-size training images from any pack: crop, resize and flip, through the decoded cache.

The training image pipeline of ``H5ImageDataset(crop=...)``. Every sample's box and flip
are ``read.crop.plan_crop``'s, a pure function of (seed, epoch, sample) and of the image's
displayed size as the pack records it (``meta.shapes``), so the same epoch gives the same
images in any process, with or without the cache, and a resumed epoch continues
identically. See docs/ARCHITECTURE.md, "Training image pipeline", for why each kind of
pack takes the path it takes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from h5pack.core.decode import decode_image
from h5pack.read.crop import Box, CropSpec, crop_array, decode_crop, plan_crop
from h5pack.read.reader import PackReader
from h5pack.training.cache import DecodedCache, shrink


def scale_box(box: Box, size: tuple[int, int], to: tuple[int, int]) -> Box:
    """Return ``box``, planned on an image of ``size`` (H, W), on the same image resized to ``to``.

    The decoded cache may keep a shrunk image; the box is planned on the pack's recorded
    size, so that a cached image gives the same crop as a freshly decoded one.
    """
    if size == to:
        return box
    sy, sx = to[0] / size[0], to[1] / size[1]
    top = min(to[0] - 1, round(box.top * sy))
    left = min(to[1] - 1, round(box.left * sx))
    height = max(1, min(to[0] - top, round(box.height * sy)))
    width = max(1, min(to[1] - left, round(box.width * sx)))
    return Box(top, left, height, width)


class FixedSizeReader:
    """Fill a (B, H, W, C) batch with the cropped, resized, flipped samples of a pack.

    Args:
        reader: This process's reader (its thread pool does the per-sample work: the
            decoders and resizers release the GIL).
        spec: The crop, output size and flip.
        cache: Decoded images shared by every process, for encoded packs; None decodes
            every sample every epoch.
    """

    def __init__(self, reader: PackReader, spec: CropSpec, cache: DecodedCache | None) -> None:
        self.reader = reader
        self.spec = spec
        self.cache = cache if reader.meta.mode == "encoded" else None
        self.decodes = 0  # samples decoded by this process (a cache hit decodes nothing)

    def read_into(
        self, indices: np.ndarray, out: np.ndarray, *, seed: int, epoch: int
    ) -> None:
        """Fill ``out`` (len(indices), H, W, C) with samples ``indices`` of ``epoch``.

        Raises:
            IndexError: an index is out of range.
            DecodeError: an encoded sample does not decode.
            FormatError: the pack is damaged.
        """
        reader, meta = self.reader, self.reader.meta
        stored: Sequence[np.ndarray] = (
            list(self._read_array(indices))
            if meta.storage == "array"
            else reader.read_stored(indices)
        )

        def one(j: int) -> None:
            index = int(indices[j])
            out[j] = self._sample(index, stored[j], seed=seed, epoch=epoch)

        reader.map_threads(one, range(len(indices)))

    def _read_array(self, indices: np.ndarray) -> np.ndarray:
        batch = np.empty((len(indices), *self.reader.meta.images_shape[1:]), dtype=np.uint8)
        self.reader.read_into(indices, batch)
        return batch

    def _sample(self, index: int, stored: np.ndarray, *, seed: int, epoch: int) -> np.ndarray:
        spec, meta = self.spec, self.reader.meta
        height, width = (int(s) for s in meta.shapes[index][:2])
        if meta.mode == "raw":
            box, flip = plan_crop(spec, height, width, seed=seed, epoch=epoch, index=index)
            raw = stored if meta.storage == "array" else self.reader.decode(index, stored)
            return crop_array(raw, box, spec.size, flip=flip, backend=spec.backend)
        if self.cache is None:
            self.decodes += 1
            return decode_crop(
                stored.tobytes(),
                spec,
                seed=seed,
                epoch=epoch,
                index=index,
                name=self._name(index),
                channels=meta.channels,
            )
        pixels = self.cache.get(index)
        if pixels is None:
            self.decodes += 1
            pixels = decode_image(
                stored.tobytes(),
                name=self._name(index),
                backend=spec.backend,
                channels=meta.channels,
            )
            if self.cache.max_side is not None:
                # crop from the shrunk image the cache holds, as the next epochs will
                pixels = shrink(pixels, self.cache.max_side)
            self.cache.put(index, pixels)
        box, flip = plan_crop(spec, height, width, seed=seed, epoch=epoch, index=index)
        box = scale_box(box, (height, width), (pixels.shape[0], pixels.shape[1]))
        return crop_array(pixels, box, spec.size, flip=flip, backend=spec.backend)

    def _name(self, index: int) -> str:
        return f"{self.reader.path}[{index}] ({self.reader.paths[index]})"
