"""Decode-and-crop benchmark: images/s of the ways to turn stored files into 224x224 crops.

Compares, on the real photos folder (mixed sizes and formats) and on ~500x375 JPEGs cut
from it (quality 90), for RandomResizedCrop and a centre crop:

- ``full``: ``decode_image`` + ``crop_array`` (decode everything, cut, resize);
- ``draft+pillow``: ``decode_crop`` with the Pillow backend (JPEG DCT scaling, then one
  ``Image.resize(box=)`` call), with the default reducing gap (2) and with gap 1;
- ``draft+opencv``: ``decode_crop`` with the OpenCV backend (DCT scaling, then
  ``cv2.resize`` of the cut);
- ``full opencv``: ``decode_image`` + ``crop_array`` with the OpenCV backend;

in one thread and in a thread pool (to show the heavy work runs without the GIL).
Each cell is the median over ``--repeats`` passes over every image; the variants take turns
pass by pass. Besides images/s (wall clock) it reports the process's CPU time per image,
which load from other programs barely moves, and CPU time / wall time, which reaches the
number of threads only if the kernels run in parallel (i.e. release the GIL).
OpenCV may use threads of its own inside ``cv2.resize`` (``cv2.getNumThreads()``).

Usage::

    python scripts/bench_crop.py --repeats 5 --threads 1 2

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from h5pack.core.decode import decode_image
from h5pack.read.crop import Crop, CropSpec, crop_array, decode_crop, plan_crop
from h5pack.synthetic import PHOTO_SUFFIXES, SampleSpec, make_image_folder, photos_folder

# The project's real photographs, beside the checkout (see its README).
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"

Kernel = Callable[[bytes, int], np.ndarray]


def full_kernel(spec: CropSpec) -> Kernel:
    def run(data: bytes, index: int) -> np.ndarray:
        pixels = decode_image(data, backend=spec.backend)
        box, flip = plan_crop(spec, *pixels.shape[:2], seed=0, epoch=0, index=index)
        return crop_array(pixels, box, spec.size, flip=flip, backend=spec.backend)

    return run


def crop_kernel(spec: CropSpec) -> Kernel:
    def run(data: bytes, index: int) -> np.ndarray:
        return decode_crop(data, spec, seed=0, epoch=0, index=index)

    return run


def variants(crop: Crop, size: int) -> dict[str, Kernel]:
    def spec(**kwargs: object) -> CropSpec:
        return CropSpec.of(size, crop=crop, flip=True, **kwargs)  # type: ignore[arg-type]

    return {
        "full (decode_image + crop_array)": full_kernel(spec()),
        "draft+pillow resize(box=), gap 2 (default)": crop_kernel(spec()),
        "draft+pillow resize(box=), gap 1": crop_kernel(spec(reducing_gap=1.0)),
        "draft+cv2 resize, gap 2": crop_kernel(spec(backend="opencv")),
        "draft+cv2 resize, gap 1": crop_kernel(spec(backend="opencv", reducing_gap=1.0)),
        "full opencv (decode_image + crop_array)": full_kernel(spec(backend="opencv")),
    }


@dataclass(frozen=True)
class Cell:
    """One variant on one data set, crop and thread count: medians over the passes."""

    images_per_s: float
    cpu_ms_per_image: float  # CPU time of the whole process (every thread)
    cpu_per_wall: float  # ~1: one core busy; ~threads: the threads ran in parallel


def one_pass(
    kernel: Kernel, files: list[bytes], pool: ThreadPoolExecutor | None
) -> tuple[float, float]:
    """Run ``kernel`` over every file once; return (wall seconds, process CPU seconds)."""
    indices = range(len(files))
    wall, cpu = time.perf_counter(), time.process_time()
    if pool is None:
        for data, index in zip(files, indices, strict=True):
            kernel(data, index)
    else:
        list(pool.map(kernel, files, indices))
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(
    kernels: dict[str, Kernel], files: list[bytes], threads: int, repeats: int
) -> dict[str, Cell]:
    """Time every kernel, interleaved pass by pass so that load from elsewhere hits all alike."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in kernels}
    with ThreadPoolExecutor(threads) as executor:
        pool = executor if threads > 1 else None
        for kernel in kernels.values():
            one_pass(kernel, files, pool)  # warm-up: imports, caches, allocator
        for _ in range(repeats):
            for name, kernel in kernels.items():
                samples[name].append(one_pass(kernel, files, pool))
    cells = {}
    for name, runs in samples.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        cells[name] = Cell(len(files) / wall, 1000 * cpu / len(files), cpu / wall)
    return cells


def load_folder(folder: Path) -> list[bytes]:
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
    return [p.read_bytes() for p in paths]


def describe(files: list[bytes]) -> str:
    shapes = [decode_image(data).shape[:2] for data in files]
    megapixels = statistics.mean(h * w for h, w in shapes) / 1e6
    return f"{len(files)} files, mean {megapixels:.2f} MP"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--photos",
        type=Path,
        default=SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None,
        help=f"folder of photographs (default: {SHARED_PHOTOS}, if present)",
    )
    parser.add_argument("--small", type=int, default=64, help="number of ~500x375 JPEGs")
    parser.add_argument("--size", type=int, default=224, help="output side")
    parser.add_argument("--repeats", type=int, default=5, help="passes per cell (median)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)

    folder = photos_folder(args.photos)
    with tempfile.TemporaryDirectory() as tmp:
        spec = SampleSpec(num_images=args.small, size=(375, 500), quality=90, flat=True)
        make_image_folder(tmp, spec, photos=folder)
        datasets = {"375x500 JPEG q90": load_folder(Path(tmp))}
    if folder is not None:
        datasets = {f"photos ({folder.name})": load_folder(folder), **datasets}

    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(f"# load average at start: {os.getloadavg()[0]:.2f}")
    for label, files in datasets.items():
        for crop in ("random-resized", "center"):
            kernels = variants(crop, args.size)
            cells = {t: measure(kernels, files, t, args.repeats) for t in args.threads}
            print(
                f"\n## {label}: {describe(files)}; {crop} {args.size}; median of {args.repeats}\n"
            )
            header = ["variant", "1T CPU ms/img"]
            for t in args.threads:
                header += [f"{t}T img/s", f"{t}T CPU/wall"]
            print("| " + " | ".join(header) + " |")
            print("|---|" + "---:|" * (len(header) - 1))
            for name in kernels:
                row = [name, f"{cells[args.threads[0]][name].cpu_ms_per_image:.2f}"]
                for t in args.threads:
                    row += [
                        f"{cells[t][name].images_per_s:.0f}",
                        f"{cells[t][name].cpu_per_wall:.2f}",
                    ]
                print("| " + " | ".join(row) + " |")
    print(f"\n# load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
