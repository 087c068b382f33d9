"""Fixed-size training images from any pack: crop, resize and flip, through the decoded cache.

Boxes and flips are ``read.cropplan``'s, pure functions of (seed, epoch, sample) and the
recorded size: the same images in any process, with or without the cache (docs/decisions/0019).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from h5pack.read.boxes import Box, CropSpec, dct_reduction, scale_box
from h5pack.read.crop import (
    KeepDecoded,
    crop_decoded_into,
    crop_into,
    decode_crop_into,
    decode_jpeg,
    decode_jpeg_box,
    decode_pixels,
    upright_jpeg_header,
)
from h5pack.read.cropplan import plan_ahead, plan_crop, plan_crops
from h5pack.read.reader import PackReader
from h5pack.read.setreader import PackSetReader
from h5pack.training.cache import DecodedCache, shrink
from h5pack.training.resize import cut_batch, resize_kernel
from h5pack.training.stats import stage_times, timed_read


class FixedSizeReader:
    """Fill a (B, H, W, C) batch with the cropped, resized, flipped samples of a pack.

    ``reader``'s thread pool does the per-sample work; ``cache`` holds decoded images shared
    by every process (encoded packs; None decodes every sample every epoch).
    """

    # JPEGs a thread decodes before it cuts them, and the bytes that cut sooner
    # (NOTE [ The per-batch loop ] in training.resize)
    decode_phase = 4
    decode_phase_bytes = 4 << 20

    def __init__(
        self, reader: PackReader | PackSetReader, spec: CropSpec, cache: DecodedCache | None
    ) -> None:
        self.reader = reader
        self.spec = spec
        self.cache = cache if reader.meta.mode == "encoded" else None
        self._kernel = resize_kernel(spec.backend)
        self._local = threading.local()  # this thread's resize time within its sample
        self.decodes = 0  # samples decoded by this process (a cache hit decodes nothing)
        self._stored = np.empty(0, dtype=np.uint8)  # reused batch of stored raw images

    def resize(self, source: np.ndarray, out: np.ndarray) -> None:
        """The resizing kernel, timed as the stage "crop" (see the note "Stall report")."""
        times = stage_times()
        start = times.clock()
        self._kernel(source, out)
        spent = times.clock() - start
        times.add("crop", spent)
        self._local.resize_ns = getattr(self._local, "resize_ns", 0) + spent

    def read_into(self, indices: np.ndarray, out: np.ndarray, *, seed: int, epoch: int) -> None:
        """Fill ``out`` (len(indices), H, W, C) with samples ``indices`` of ``epoch``."""
        reader, meta = self.reader, self.reader.meta
        if meta.mode == "raw":  # one pass over the batch (NOTE [ The per-batch loop ])
            views = None
            if isinstance(reader, PackReader):
                views = timed_read(reader, lambda: reader.stored_views(indices))[0]
            shapes = meta.shapes[indices]
            plans = plan_crops(
                self.spec, shapes[:, 0], shapes[:, 1], seed=seed, epoch=epoch, indices=indices
            )
            if views is not None:  # each checked as it is cut (NOTE [ Checked as copied ])
                assert isinstance(reader, PackReader)  # only a PackReader maps
                where, checks = indices.tolist(), reader.sample_checks(indices)
                digest, recorded = checks or (None, [])
                # HWC: an array pack's views as they are, a blob's bytes reshaped
                as_image = None if meta.storage == "array" else reader.decode

                def image_of(k: int) -> np.ndarray:
                    view = views[k]
                    if digest is not None and digest(view) != recorded[k]:
                        reader.verify_sample(where[k], view)  # raises
                    return view if as_image is None else as_image(where[k], view)

            else:
                if meta.storage == "array":
                    images: list[np.ndarray] = list(
                        timed_read(reader, lambda: self._read_array(indices))[0]
                    )
                else:
                    stored = timed_read(reader, lambda: reader.read_stored(indices))[0]
                    images = [
                        reader.decode(int(i), s) for i, s in zip(indices, stored, strict=True)
                    ]

                def image_of(k: int) -> np.ndarray:
                    return images[k]

            cut_batch(self.reader, self._kernel, image_of, plans, out, range(len(indices)))
            return
        if self.cache is None:
            files = timed_read(reader, lambda: self._read_stored(indices))[0]
            rest = self._upright_jpegs(indices, files, out, seed, epoch)
            self._decode_each(indices, rest, [files[j] for j in rest], out, (seed, epoch))
            return
        # only the samples the cache lacks are read; then the hits needing a reduced decode
        unserved = self._through_cache(indices, out, seed, epoch)
        if unserved:
            again = timed_read(reader, lambda: reader.read_stored(indices[unserved]))[0]
            self._decode_each(indices, unserved, again, out, (seed, epoch))

    def _decode_each(
        self,
        indices: np.ndarray,
        positions: list[int],
        stored: Sequence[np.ndarray],
        out: np.ndarray,
        where: tuple[int, int],
    ) -> None:
        """Decode and cut the batch's samples ``positions`` one by one, ``stored[k]`` each."""
        if not positions:
            return
        seed, epoch = where
        self._prepare(indices[positions], seed, epoch)

        def one(k: int) -> None:
            j = positions[k]
            self._encoded(int(indices[j]), stored[k], out[j], seed, epoch)

        self._run(one, len(positions))

    def _read_stored(self, indices: np.ndarray) -> Sequence[np.ndarray]:
        """``read_stored``'s samples, checked; views of the mapped file where the pack allows."""
        reader = self.reader
        if not isinstance(reader, PackReader) or (views := reader.stored_views(indices)) is None:
            return reader.read_stored(indices)
        for index, view in zip(indices.tolist(), views, strict=True):
            reader.verify_sample(index, view)
        return views

    def _prepare(self, indices: np.ndarray, seed: int, epoch: int) -> None:
        """Plan at once the samples cut one by one (``read.cropplan.plan_ahead``)."""
        shapes = self.reader.meta.shapes[indices]
        plan_ahead(self.spec, shapes, seed=seed, epoch=epoch, indices=indices)

    def _upright_jpegs(
        self,
        indices: np.ndarray,
        stored: Sequence[np.ndarray],
        out: np.ndarray,
        seed: int,
        epoch: int,
    ) -> list[int]:
        """Decode and cut the batch's plain JPEGs together; return the positions of the rest.

        Plain: an upright JPEG of the output's channels whose box takes no reduced decode.
        """
        spec, count = self.spec, len(indices)
        if spec.reducing_gap is None:
            return list(range(count))
        datas = [s.tobytes() for s in stored]
        headers = [upright_jpeg_header(data, out.shape[3]) for data in datas]
        plain = [(j, header) for j, header in enumerate(headers) if header is not None]
        batched = [j for j, _ in plain]
        if not batched:
            return list(range(count))
        heights, widths = [h.height for _, h in plain], [h.width for _, h in plain]
        plans = plan_crops(spec, heights, widths, seed=seed, epoch=epoch, indices=indices[batched])
        (out_h, out_w), gap = spec.size, spec.reducing_gap
        keep = [k for k, (box, _) in enumerate(plans) if dct_reduction(box, out_h, out_w, gap) == 1]
        batched, plans = [batched[k] for k in keep], [plans[k] for k in keep]

        def image_of(k: int) -> np.ndarray:
            j = batched[k]
            header = headers[j]
            assert header is not None  # batched
            box, flip = plans[k]
            boxed = decode_jpeg_box(header, datas[j], box)  # NOTE [ Decoding only the box ]
            if boxed is None:
                return decode_jpeg(header, datas[j], name=self._name(int(indices[j])))
            plans[k] = (Box(0, 0, box.height, box.width), flip)  # cut(k) reads it next
            return boxed

        self.decodes += len(batched)
        phase = (self.decode_phase, self.decode_phase_bytes)
        cut_batch(self.reader, self._kernel, image_of, plans, out, batched, "decode", phase)
        done = set(batched)
        return [j for j in range(count) if j not in done]

    def _through_cache(
        self, indices: np.ndarray, out: np.ndarray, seed: int, epoch: int
    ) -> list[int]:
        """Fill ``out`` through the decoded cache; return the hits that need a reduced decode."""
        cache, reader = self.cache, self.reader
        assert cache is not None  # read_into's branch
        entries = [cache.entry(int(i)) for i in indices]
        batched = self._batchable(entries, out.shape[3]) if cache.max_side is None else []
        hits = [entry for j in batched if (entry := entries[j]) is not None]  # all of them
        plans: list[tuple[Box, bool]] = []
        if batched:
            heights, widths = [i.shape[0] for i, _ in hits], [i.shape[1] for i, _ in hits]
            plans = plan_crops(
                self.spec, heights, widths, seed=seed, epoch=epoch, indices=indices[batched]
            )
            gap, (out_h, out_w) = self.spec.reducing_gap, self.spec.size
            keep = [
                k
                for k, ((_, tag), (box, _)) in enumerate(zip(hits, plans, strict=True))
                if tag == 0 or dct_reduction(box, out_h, out_w, gap) == 1
            ]
            batched, plans = [batched[k] for k in keep], [plans[k] for k in keep]
            hits = [hits[k] for k in keep]
        rest = sorted(set(range(len(indices))) - set(batched))
        missing = [j for j in rest if entries[j] is None]
        read: dict[int, np.ndarray] = {}
        if missing:
            stored = timed_read(reader, lambda: reader.read_stored(indices[missing]))[0]
            read = dict(zip(missing, stored, strict=True))
        unserved: list[int] = []

        def one(k: int) -> None:
            j = rest[k]
            if not self._cached(int(indices[j]), entries[j], read.get(j), out[j], seed, epoch):
                unserved.append(j)  # list.append is atomic: safe from the threads

        if rest:
            self._prepare(indices[rest], seed, epoch)
            self._run(one, len(rest))
        if batched:
            images = [image for image, _ in hits]
            cut_batch(self.reader, self._kernel, images.__getitem__, plans, out, batched)
        return sorted(unserved)

    @staticmethod
    def _batchable(entries: Sequence[tuple[np.ndarray, int] | None], channels: int) -> list[int]:
        """The cache hits whose cut is the plain one: as decoded (tag 0) or JPEG upright (1)."""
        return [
            j
            for j, entry in enumerate(entries)
            if entry is not None and entry[1] in (0, 1) and entry[0].shape[2] == channels
        ]

    def _run(self, one: Callable[[int], None], count: int) -> None:
        """Call ``one(j)`` for j in 0..count-1 on the reader's threads, a slice per thread."""
        parts = max(1, min(self.reader.options.threads or 0, count))

        def run_part(part: int) -> None:
            for j in range(part, count, parts):
                one(j)

        self.reader.map_threads(run_part, range(parts))

    def _read_array(self, indices: np.ndarray) -> np.ndarray:
        """Read stored images into a buffer kept from batch to batch (no fresh mmap each)."""
        shape = (len(indices), *self.reader.meta.images_shape[1:])
        size = int(np.prod(shape))
        if self._stored.size < size:
            self._stored = np.empty(size, dtype=np.uint8)
        batch = self._stored[:size].reshape(shape)
        self.reader.read_into(indices, batch)
        return batch

    def _encoded(
        self,
        index: int,
        stored: np.ndarray,
        out: np.ndarray,
        seed: int,
        epoch: int,
        keep: KeepDecoded | None = None,
    ) -> None:
        """An encoded sample: decode (at a reduced scale if the box allows), cut, resize."""
        self.decodes += 1
        times = stage_times()
        start = times.clock()
        self._local.resize_ns = 0
        decode_crop_into(
            stored.tobytes(),
            self.spec,
            out,
            seed=seed,
            epoch=epoch,
            index=index,
            name=self._name(index),
            resize=self.resize,
            keep=keep,
        )
        times.add("decode", times.clock() - start - self._local.resize_ns)

    def _cached(
        self,
        index: int,
        entry: tuple[np.ndarray, int] | None,
        stored: np.ndarray | None,
        out: np.ndarray,
        seed: int,
        epoch: int,
    ) -> bool:
        """An encoded sample through the cache: the uncached path's pixels, whatever it holds.

        A miss is decoded and kept if there is room; returns False for a hit that cannot
        serve this epoch (a reduced decode): the caller decodes it from the pack.
        """
        cache = self.cache
        assert cache is not None  # read_into's branch
        if cache.max_side is not None:
            self._shrunk(index, entry, stored, out, (seed, epoch))
            return True
        if entry is not None:
            pixels, orientation = entry
            return crop_decoded_into(
                pixels,
                orientation,
                self.spec,
                out,
                seed=seed,
                epoch=epoch,
                index=index,
                resize=self.resize,
            )
        assert stored is not None  # read_into read every missing sample

        def keep(pixels: np.ndarray, orientation: int) -> None:
            if cache.has_room(pixels.size):
                cache.put(index, pixels, tag=orientation)

        self._encoded(index, stored, out, seed, epoch, keep)
        return True

    def _shrunk(
        self,
        index: int,
        entry: tuple[np.ndarray, int] | None,
        stored: np.ndarray | None,
        out: np.ndarray,
        where: tuple[int, int],
    ) -> None:
        """With ``cache_max_side``: every sample is cut from its shrunk image, cached or not."""
        cache = self.cache
        assert cache is not None
        assert cache.max_side is not None
        seed, epoch = where
        if entry is None:
            assert stored is not None
            self.decodes += 1
            times = stage_times()
            start = times.clock()
            pixels = decode_pixels(
                stored.tobytes(),
                name=self._name(index),
                backend=self.spec.backend,
                channels=self.reader.meta.channels,
            )
            pixels = shrink(pixels, cache.max_side)
            times.add("decode", times.clock() - start)
            if cache.has_room(pixels.size):
                cache.put(index, pixels)
        else:
            pixels = entry[0]
        height, width = self.reader.meta.shapes[index][:2].tolist()
        box, flip = plan_crop(self.spec, height, width, seed=seed, epoch=epoch, index=index)
        box = scale_box(box, (height, width), (pixels.shape[0], pixels.shape[1]))
        crop_into(pixels, box, out, flip=flip, resize=self.resize)

    def _name(self, index: int) -> str:
        return f"{self.reader.path}[{index}] ({self.reader.paths[index]})"
