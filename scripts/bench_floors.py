"""The floors of a JPEG training sample: CPU per image of each kernel, one thread (issue 19).

    python scripts/bench_floors.py --folder bench-data/photos2000/images-2000 --count 300

For the folder's JPEGs, CPU microseconds per image (``time.thread_time``, median of 3
passes) of: Pillow's header (``Image.open`` + the EXIF orientation) against
``core.jpeg.read_jpeg_header``; a full decode by OpenCV (libjpeg-turbo, the pipeline's);
FFCV's way of decoding only a box (a lossless TurboJPEG crop of the file to the box's MCUs,
then decoding that), when ``libturbojpeg.so.0`` is there, with a check that the box's
pixels are the full decode's; the box resized to 224x224 with Pillow's filter (torch's
kernel, the pipeline's) and with OpenCV's INTER_AREA (FFCV's); the box and flip plan.
Boxes are RandomResizedCrop's for the image's size, seeded.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from h5pack.core.decode import exif_orientation, open_pillow
from h5pack.core.jpeg import read_jpeg_header
from h5pack.read.boxes import Box, CropSpec
from h5pack.read.cropplan import plan_crop
from h5pack.training.resize import torch_resize_into

_MCU = {0: (8, 8), 1: (16, 8), 2: (16, 16), 3: (8, 8), 4: (8, 16), 5: (32, 8)}


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _Transform(ctypes.Structure):
    _fields_ = [
        ("r", _Region),
        ("op", ctypes.c_int),
        ("options", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("customFilter", ctypes.c_void_p),
    ]


class TurboCrop:
    """Decode only a box's MCUs: TurboJPEG's lossless crop (TJXOPT_CROP), then a decode."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
        lib = ctypes.CDLL(name)
        lib.tjInitTransform.restype = ctypes.c_void_p
        lib.tjInitDecompress.restype = ctypes.c_void_p
        ubyte_p = ctypes.POINTER(ctypes.c_ubyte)
        lib.tjTransform.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_int,
            ctypes.POINTER(ubyte_p),
            ctypes.POINTER(ctypes.c_ulong),
            ctypes.POINTER(_Transform),
            ctypes.c_int,
        ]
        lib.tjDecompressHeader3.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_ulong,
            *[ctypes.POINTER(ctypes.c_int)] * 4,
        ]
        lib.tjDecompress2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong]
        lib.tjDecompress2.argtypes += [ctypes.c_void_p] + [ctypes.c_int] * 5
        lib.tjFree.argtypes = [ctypes.c_void_p]
        self.lib = lib
        self.transformer = lib.tjInitTransform()
        self.decompressor = lib.tjInitDecompress()

    def header(self, data: Any, size: int) -> tuple[int, int, int]:
        """Return the JPEG's (width, height, subsampling)."""
        values = [ctypes.c_int() for _ in range(4)]
        status = self.lib.tjDecompressHeader3(
            self.decompressor, data, size, *(ctypes.byref(v) for v in values)
        )
        if status != 0:
            raise OSError("tjDecompressHeader3 failed")
        return values[0].value, values[1].value, values[2].value

    def box(self, data: bytes, box: Box) -> np.ndarray:
        """Return the pixels of ``box``, decoding only its MCUs (and one MCU around)."""
        width, height, subsampling = self.header(data, len(data))
        mcu_w, mcu_h = _MCU[subsampling]
        # one MCU of margin: the chroma upsampling at the crop's edges stays outside the box
        x0 = max(0, (box.left // mcu_w - 1) * mcu_w)
        y0 = max(0, (box.top // mcu_h - 1) * mcu_h)
        x1 = min(width, (-(-(box.left + box.width) // mcu_w) + 1) * mcu_w)
        y1 = min(height, (-(-(box.top + box.height) // mcu_h) + 1) * mcu_h)
        transform = _Transform()
        transform.r = _Region(x0, y0, x1 - x0, y1 - y0)
        transform.options = 4  # TJXOPT_CROP
        buffer = ctypes.POINTER(ctypes.c_ubyte)()
        size = ctypes.c_ulong(0)
        lib = self.lib
        if lib.tjTransform(
            self.transformer,
            data,
            len(data),
            1,
            ctypes.byref(buffer),
            ctypes.byref(size),
            ctypes.byref(transform),
            0,
        ):
            raise OSError("tjTransform failed")
        try:
            crop_w, crop_h, _ = self.header(buffer, size.value)
            out = np.empty((crop_h, crop_w, 3), np.uint8)
            if lib.tjDecompress2(
                self.decompressor, buffer, size.value, out.ctypes.data, crop_w, 0, crop_h, 0, 0
            ):
                raise OSError("tjDecompress2 failed")
        finally:
            lib.tjFree(buffer)
        top, left = box.top - y0, box.left - x0
        return out[top : top + box.height, left : left + box.width]


def full_decode(data: bytes) -> np.ndarray:
    flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    return cv2.imdecode(np.frombuffer(data, np.uint8), flags)


def cpu_us(function: Callable[[int], object], count: int, passes: int = 3) -> float:
    """Median over ``passes`` of the CPU microseconds per call of ``function(i)``."""
    results = []
    for _ in range(passes):
        start = time.thread_time()
        for i in range(count):
            function(i)
        results.append(1e6 * (time.thread_time() - start) / count)
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    files = sorted(args.folder.rglob("*.jpg"))[: args.count]
    datas = [f.read_bytes() for f in files]
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    pixels = [full_decode(d) for d in datas]
    boxes = [
        plan_crop(spec, *p.shape[:2], seed=0, epoch=0, index=i)[0] for i, p in enumerate(pixels)
    ]
    views = [
        p[b.top : b.top + b.height, b.left : b.left + b.width]
        for p, b in zip(pixels, boxes, strict=True)
    ]
    out = np.empty((224, 224, 3), np.uint8)
    count = len(datas)

    def pillow_header(i: int) -> None:
        image = open_pillow(datas[i], "x", None)
        exif_orientation(image)
        image.close()

    table = {
        "Pillow header + EXIF orientation": cpu_us(pillow_header, count),
        "core.jpeg.read_jpeg_header": cpu_us(lambda i: read_jpeg_header(datas[i]), count),
        "full decode (OpenCV, libjpeg-turbo)": cpu_us(lambda i: full_decode(datas[i]), count),
        "plan the box and flip (plan_crop)": cpu_us(
            lambda i: plan_crop(spec, *pixels[i].shape[:2], seed=0, epoch=1, index=i), count
        ),
        "resize box to 224, Pillow's filter (torch kernel)": cpu_us(
            lambda i: torch_resize_into(views[i], out), count
        ),
        "resize box to 224, OpenCV INTER_AREA (FFCV's)": cpu_us(
            lambda i: cv2.resize(views[i], (224, 224), dst=out, interpolation=cv2.INTER_AREA),
            count,
        ),
    }
    try:
        turbo: TurboCrop | None = TurboCrop()
    except OSError as err:
        turbo = None
        table["box only (TurboJPEG crop + decode)"] = f"not measured: {err}"  # type: ignore[assignment]
    if turbo is not None:
        worst = max(
            int(np.abs(turbo.box(d, b).astype(int) - v).max())
            for d, b, v in zip(datas, boxes, views, strict=True)
        )
        table["box only (TurboJPEG crop + decode)"] = cpu_us(
            lambda i: turbo.box(datas[i], boxes[i]), count
        )
        table["box only: largest difference from the full decode"] = worst
    mean_box = statistics.mean(
        b.height * b.width / (p.shape[0] * p.shape[1]) for b, p in zip(boxes, pixels, strict=True)
    )
    table["mean box area / image area"] = mean_box
    for name, value in table.items():
        print(f"{name:55s} {value:10.2f}" if isinstance(value, float) else f"{name:55s} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
