"""Where the CPU of one image goes, and the floors under it (issue 19 items 2-3, percore).

    python scripts/bench_percore.py --data /tmp/ffbench/data --only profile   # raw, jpeg, cache
    python scripts/bench_percore.py --data /tmp/ffbench/data --only decode
    python scripts/bench_percore.py --data /tmp/ffbench/data --only mapcopy

``profile``: one epoch of ``make_loader(pack, 64, size=224, crop="random-resized",
flip=True, num_workers=0, threads=1)`` (torch one thread) under cProfile with
``time.thread_time`` (CPU, not wall), after one untimed epoch, for the raw 256 pack, the
encoded pack and the encoded pack with ``cache="decoded"``: the top calls by own time,
in us per image. ``decode``: the encoded pack's 2,000 JPEGs decoded in a row (OpenCV, as
the pipeline does), then each followed by a resize of a box (torch's kernel): the decode's
own CPU time in both, which shows what the resize costs the decode on the same core.
``mapcopy``: 4,000 copies of a 196 KB image at random places out of a read-only mapping of
the raw pack into a reused buffer, against the same out of anonymous memory; and out of
the mapping into batches of 64 images, a fresh ``torch.empty`` per batch against one
reused (one thread).
"""

from __future__ import annotations

import argparse
import cProfile
import mmap
import os
import pstats
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from h5pack import make_loader
from h5pack.read.reader import PackReader
from h5pack.training.fixed_size import torch_resize_into

BATCH = 64


def profile(data: Path, top: int) -> None:
    """The top calls by own CPU time of each path, us per image."""
    torch.set_num_threads(1)
    paths = {
        "raw 256": (data / "raw256.h5", {}),
        "jpeg": (data / "encoded.h5", {}),
        "jpeg cache": (data / "encoded.h5", {"cache": "decoded"}),
    }
    for name, (pack, extra) in paths.items():
        loader = make_loader(
            pack,
            BATCH,
            size=224,
            crop="random-resized",
            flip=True,
            num_workers=0,
            threads=1,
            **extra,
        )
        images = 0
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            profiler = cProfile.Profile(time.thread_time)
            if epoch == 1:
                profiler.enable()
            for _, labels in loader:
                images += len(labels) if epoch == 1 else 0
            profiler.disable()
        stats = pstats.Stats(profiler)
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])  # type: ignore[attr-defined]
        total = sum(row[1][2] for row in rows)
        print(f"## {name}: {total / images * 1e6:.0f} us CPU per image under the profiler")
        for (file, line, function), (_, calls, own, _, _) in rows[:top]:
            where = function if file == "~" else f"{Path(file).name}:{line}({function})"
            print(f"{own / images * 1e6:8.1f} us  {calls / images:6.2f} calls  {where}")


def decode(data: Path) -> None:
    """Decodes in a row against decodes each followed by a resize."""
    torch.set_num_threads(1)
    with PackReader(data / "encoded.h5") as reader:
        files = [s.tobytes() for s in reader.read_stored(np.arange(reader.meta.num_samples))]
    flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    out = np.empty((224, 224, 3), dtype=np.uint8)

    def run(resize: bool) -> tuple[float, float]:
        decoding, start = 0.0, time.thread_time()
        for data_ in files:
            began = time.thread_time()
            pixels = cv2.imdecode(np.frombuffer(data_, np.uint8), flags)
            decoding += time.thread_time() - began
            if resize:
                torch_resize_into(pixels[10:300, 20:330], out)
        whole = time.thread_time() - start
        return decoding / len(files) * 1e6, whole / len(files) * 1e6

    for _ in range(2):
        alone, with_resize = run(False), run(True)
        print(
            f"decode alone {alone[0]:.0f} us; decode followed by a resize: the decode "
            f"{with_resize[0]:.0f}, both {with_resize[1]:.0f}"
        )


def mapcopy(data: Path) -> None:
    """Copies out of the file's mapping against copies out of anonymous memory."""
    size_bytes = 256 * 256 * 3
    fd = os.open(data / "raw256.h5", os.O_RDONLY)
    try:
        file_size = os.fstat(fd).st_size
        mapped = np.frombuffer(mmap.mmap(fd, file_size, prot=mmap.PROT_READ), dtype=np.uint8)
    finally:
        os.close(fd)
    anonymous = np.random.default_rng(0).integers(0, 255, file_size, dtype=np.uint8)
    out = np.empty(size_bytes, dtype=np.uint8)
    rng = np.random.default_rng(1)
    starts = (rng.integers(0, (file_size - size_bytes) // 4096, 4000) * 4096).tolist()

    def run(source: np.ndarray) -> float:
        for start in starts[:1000]:  # map the pages first
            np.copyto(out, source[start : start + size_bytes])
        began = time.thread_time()
        for start in starts:
            np.copyto(out, source[start : start + size_bytes])
        return (time.thread_time() - began) / len(starts) * 1e6

    def batches(fresh: bool) -> float:
        """Copies out of the mapping into batches of 64: a fresh tensor each, or one reused."""
        reused = torch.empty((BATCH, size_bytes), dtype=torch.uint8).numpy()
        began = time.thread_time()
        for first in range(0, len(starts) - BATCH + 1, BATCH):
            out = torch.empty((BATCH, size_bytes), dtype=torch.uint8).numpy() if fresh else reused
            for j, start in enumerate(starts[first : first + BATCH]):
                np.copyto(out[j], mapped[start : start + size_bytes])
        return (time.thread_time() - began) / len(starts) * 1e6

    for _ in range(2):
        print(
            f"copy 196 KB: from the mapping {run(mapped):.1f} us, anonymous {run(anonymous):.1f}; "
            f"into batches of 64, fresh {batches(True):.1f}, one reused {batches(False):.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="bench_ffcv.py's --data")
    parser.add_argument("--only", choices=("profile", "decode", "mapcopy"), default=None)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    if args.only in (None, "profile"):
        profile(args.data, args.top)
    if args.only in (None, "decode"):
        decode(args.data)
    if args.only in (None, "mapcopy"):
        mapcopy(args.data)


if __name__ == "__main__":
    main()
