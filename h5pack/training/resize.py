"""The training pipeline's resize: Pillow's antialiased bilinear filter, computed by torch."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from h5pack.core.decode import Backend
from h5pack.read.boxes import Box
from h5pack.read.crop import ResizeInto, crop_into, opencv_resize_into, pillow_resize_into
from h5pack.read.reader import PackReader
from h5pack.read.setreader import PackSetReader
from h5pack.training.stats import stage_times

# NOTE [ Pillow's filter, computed by torch ]
# Pillow's antialiased BILINEAR resize costs several times torch's uint8 kernel for the same
# filter (within one grey level). The kernel is called through its ATen op's ``out=``
# variant, torch.ops.aten._upsample_bilinear2d_aa.out, on a channels-last view of the batch
# slot, so it writes in place (docs/decisions/0004); where the op is missing the public
# F.interpolate and a copy take its place (resize_route() says which). Its input is copied
# contiguous with numpy first (torch's own copy wakes its intra-op threads). Enlarging boxes
# go to cv2.resize(INTER_LINEAR), the same filter within one grey level for less CPU
# (docs/decisions/0019); ENLARGE_WITH_OPENCV = False sends every box to torch.
_AA_SIZES = ((8, 10, 3), (3, 4, 3))  # the probe: shrink an 8x10 image to 3x4
ENLARGE_WITH_OPENCV = True


def torch_resize_into(source: np.ndarray, out: np.ndarray) -> None:
    """Resize with Pillow's antialiased ``BILINEAR`` filter, computed by torch (NOTE above).

    1-channel images go to Pillow.
    """
    if source.shape[:2] == out.shape[:2]:
        out[...] = source
        return
    if source.shape[2] != 3:
        pillow_resize_into(source, out)
        return
    resize_rgb_into(source, out)


def resize_rgb_into(box: np.ndarray, out: np.ndarray) -> None:
    """Resize the RGB ``box`` to ``out``'s other size: ``torch_resize_into``'s filter."""
    import cv2  # here, as in read.crop: importing the training layer stays lighter

    height, width = out.shape[:2]
    if ENLARGE_WITH_OPENCV and box.shape[0] <= height and box.shape[1] <= width:
        cv2.resize(box, (width, height), dst=out, interpolation=cv2.INTER_LINEAR)
        return
    if not (box.flags.c_contiguous and box.flags.writeable):
        box = np.array(box)
    _AA_OUT(
        torch.from_numpy(box.transpose(2, 0, 1)[None]),
        [height, width],
        False,
        out=torch.from_numpy(out.transpose(2, 0, 1)[None]),
    )


def _interpolate_into(
    box: torch.Tensor, size: list[int], align_corners: bool, *, out: torch.Tensor
) -> torch.Tensor:
    """The ATen op's work through the public API: a new tensor, then a copy into ``out``."""
    result = torch.nn.functional.interpolate(
        box, size=size, mode="bilinear", antialias=True, align_corners=align_corners
    )
    return out.copy_(result)


def _aten_op() -> Callable[..., torch.Tensor] | None:
    """The in-place antialiased bilinear op of this torch, or None where it lacks it."""
    packet = getattr(torch.ops.aten, "_upsample_bilinear2d_aa", None)
    return getattr(packet, "out", None) if packet is not None else None


_AA_OUT: Callable[..., torch.Tensor] = _aten_op() or _interpolate_into


def resize_route() -> str:
    """Which kernel resizes RGB boxes with Pillow's filter in this process (for reports)."""
    if not _torch_resizes_like_pillow():
        return "Pillow (torch has no uint8 antialiased kernel)"
    if _AA_OUT is _interpolate_into:
        return "torch, public interpolate + copy (the in-place op is missing)"
    return "torch, in-place ATen op"


@functools.cache
def _torch_resizes_like_pillow() -> bool:
    """Whether this torch has the uint8 kernel and it agrees with Pillow (once per process)."""
    source = np.arange(np.prod(_AA_SIZES[0]), dtype=np.uint8).reshape(_AA_SIZES[0])
    got = np.empty(_AA_SIZES[1], dtype=np.uint8)
    want = np.empty(_AA_SIZES[1], dtype=np.uint8)
    try:
        torch_resize_into(source, got)
    except (AttributeError, RuntimeError, NotImplementedError):  # older torch: no such kernel
        return False
    pillow_resize_into(source, want)
    return bool(np.abs(got.astype(np.int16) - want).max() <= 1)


def resize_kernel(backend: Backend) -> ResizeInto:
    """Return the fastest kernel computing ``backend``'s filter (torch's for Pillow's)."""
    if backend == "opencv":
        return opencv_resize_into
    return torch_resize_into if _torch_resizes_like_pillow() else pillow_resize_into


# NOTE [ The per-batch loop ]
# A batch is planned at once (read.cropplan.plan_crops) and each thread cuts its share in one
# loop (cut_batch): per sample one slice, one contiguous copy of the box, the kernel writing
# into the output's slot, cv2.flip in place; the stage "crop" is timed once per thread.
# Per-sample calls cost more than the kernels on raw packs (GIL hand-offs). Raw packs and the
# decoded cache's plain hits (tag 0, or an upright JPEG needing no reduced decode) take it;
# the rest goes sample by sample, with the same pixels. JPEGs are phased within a thread's
# share: up to decode_phase decodes (fewer past decode_phase_bytes), then their cuts, so few
# decoded images are alive per thread. Measurements: BENCHMARKS.md.


def cut_batch(
    reader: PackReader | PackSetReader,
    kernel: ResizeInto,
    image_of: Callable[[int], np.ndarray],
    plans: Sequence[tuple[Box, bool]],
    out: np.ndarray,
    slots: Sequence[int],
    stage: str = "storage",
    phase: tuple[int, int] = (1, 0),
) -> None:
    """Resize ``plans[k]``'s box of ``image_of(k)`` into ``out[slots[k]]``, flipped if planned.

    ``kernel`` resizes and ``reader``'s threads share the batch, each timed once:
    ``image_of`` as ``stage``, the rest as "crop". ``phase``: up to ``phase[0]`` images (fewer
    past ``phase[1]`` bytes) got before they are cut.
    """
    import cv2  # here, as in read.crop: importing the training layer stays lighter

    count = len(slots)
    size = [out.shape[1], out.shape[2]]
    lean = kernel is torch_resize_into and out.shape[3] == 3
    parts = max(1, min(reader.options.threads or 0, count))

    def cut(k: int, image: np.ndarray) -> None:
        (top, left, box_h, box_w), flip = plans[k]
        target = out[slots[k]]
        image_h, image_w, channels = image.shape
        inside = top >= 0 and left >= 0 and top + box_h <= image_h and left + box_w <= image_w
        if not (lean and inside and channels == 3):  # crop_into raises what is wrong
            crop_into(image, Box(top, left, box_h, box_w), target, flip=flip, resize=kernel)
            return
        if box_h == size[0] and box_w == size[1]:
            target[...] = image[top : top + box_h, left : left + box_w]
        else:  # a box decoded alone is already contiguous: not copied again
            resize_rgb_into(image[top : top + box_h, left : left + box_w], target)
        if flip:
            cv2.flip(target, 1, dst=target)  # in place (read.crop.flip_in_place)

    def run_part(part: int) -> None:
        times = stage_times()
        start = times.clock()
        getting = 0
        most, most_bytes = phase
        if most <= 1:
            for k in range(part, count, parts):
                began = times.clock()
                image = image_of(k)
                getting += times.clock() - began
                cut(k, image)
        else:  # up to `most` images got, then cut (NOTE [ The per-batch loop ])
            mine, at = range(part, count, parts), 0
            while at < len(mine):
                began = times.clock()
                group: list[tuple[int, np.ndarray]] = []
                held = 0
                while at < len(mine) and len(group) < most and held < most_bytes:
                    image = image_of(mine[at])
                    group.append((mine[at], image))
                    held += image.nbytes
                    at += 1
                getting += times.clock() - began
                for k, image in group:
                    cut(k, image)
                del group, image  # freed before the next group is decoded
        times.add(stage, getting)
        times.add("crop", times.clock() - start - getting)

    reader.map_threads(run_part, range(parts))
