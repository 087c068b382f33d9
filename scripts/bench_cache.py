"""Time DecodedCache against decoding the JPEG and against a Manager().dict() cache.

    python scripts/bench_cache.py                  # per-image microseconds, median of runs
    python scripts/bench_cache.py --loader 1000    # plus DataLoader epochs, 2 workers

The image is 500x375x3 (an ImageNet-sized photo: one of ../shared/data/photos when present,
else ``h5pack.synthetic.synthesize_photo``), JPEG quality 90. Each figure is the median over
``--runs`` runs of the mean over a loop of calls.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from h5pack.synthetic import synthesize_photo
from h5pack.training.cache import DecodedCache

HEIGHT, WIDTH = 375, 500

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"


def photo(seed: int) -> np.ndarray:
    """A 500x375 photograph: one of the shared photos, cropped, else a synthetic one."""
    files = sorted(SHARED_PHOTOS.glob("*.jpg")) if SHARED_PHOTOS.is_dir() else []
    if not files:
        return synthesize_photo(np.random.default_rng(seed), (HEIGHT, WIDTH))
    with Image.open(files[seed % len(files)]) as source:
        fitted = ImageOps.fit(source.convert("RGB"), (WIDTH, HEIGHT), centering=(0.5, 0.5))
    shift = np.random.default_rng(seed).integers(-20, 20)  # different bytes for each seed
    return np.clip(np.asarray(fitted, dtype=np.int16) + shift, 0, 255).astype(np.uint8)


def jpeg(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG", quality=90)
    return out.getvalue()


def decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def per_call_us(call: Callable[[], Any], loops: int, runs: int) -> float:
    """Median over ``runs`` of the mean time of one call, in microseconds."""
    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(loops):
            call()
        times.append((time.perf_counter() - start) / loops * 1e6)
    return statistics.median(times)


def micro(runs: int) -> None:
    array = photo(0)
    data = jpeg(array)
    rows: list[tuple[str, float]] = []
    rows.append(("decode JPEG (Pillow, RGB array)", per_call_us(lambda: decode(data), 50, runs)))
    with DecodedCache(4096, 1 << 30) as cache:
        cache.put(0, array)
        rows.append(
            (
                "DecodedCache.get, hit (read-only view)",
                per_call_us(lambda: cache.get(0), 20000, runs),
            )
        )
        rows.append(
            (
                "DecodedCache.get, hit, + .copy()",
                per_call_us(lambda: cache.get(0).copy(), 2000, runs),
            )
        )  # type: ignore[union-attr]
        rows.append(("DecodedCache.get, miss", per_call_us(lambda: cache.get(1), 20000, runs)))
        puts = iter(range(1, 4096))
        rows.append(
            (
                "DecodedCache.put, new entry",
                per_call_us(lambda: cache.put(next(puts), array), 100, min(runs, 30)),
            )
        )
    with multiprocessing.Manager() as manager:
        shared = manager.dict()
        shared[0] = array
        rows.append(
            ("Manager().dict()[i], hit (pickled copy)", per_call_us(lambda: shared[0], 200, runs))
        )
        rows.append(
            ("Manager().dict().get(i), miss", per_call_us(lambda: shared.get(1), 2000, runs))
        )
        keys = iter(range(1, 10**6))
        rows.append(
            (
                "Manager().dict()[i] = array",
                per_call_us(lambda: shared.__setitem__(next(keys), array), 50, runs),
            )
        )
    print(
        f"{platform.processor() or platform.machine()}, {multiprocessing.cpu_count()} CPUs,"
        f" image {HEIGHT}x{WIDTH}x3 ({array.nbytes} bytes, JPEG {len(data)} bytes),"
        f" median of {runs}"
    )
    print(f"| {'operation':<42} | {'us per image':>12} |")
    print(f"|{'-' * 44}|{'-' * 14}|")
    for name, us in rows:
        print(f"| {name:<42} | {us:>12.1f} |")


def loader_epochs(num: int, epochs: int, workers: int) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    blobs = [jpeg(photo(i)) for i in range(num)]

    class Jpegs(Dataset[torch.Tensor]):
        def __init__(self, cache: DecodedCache | None) -> None:
            self.cache = cache

        def __len__(self) -> int:
            return num

        def __getitem__(self, index: int) -> torch.Tensor:
            array = self.cache.get(index) if self.cache is not None else None
            if array is None:
                array = decode(blobs[index])
                if self.cache is not None:
                    self.cache.put(index, array)
            top = (index * 7) % (HEIGHT - 224)  # a crop, copied out of the cache's view
            return torch.from_numpy(np.ascontiguousarray(array[top : top + 224, :224]))

    for label, cache in (("no cache", None), ("DecodedCache", DecodedCache(num, 1 << 30))):
        loader = DataLoader(
            Jpegs(cache),
            batch_size=32,
            num_workers=workers,
            persistent_workers=True,
            multiprocessing_context="fork",
        )
        rates = []
        for _ in range(epochs):
            start = time.perf_counter()
            for _batch in loader:
                pass
            rates.append(num / (time.perf_counter() - start))
        shown = ", ".join(f"{r:.0f}" for r in rates)
        print(f"{label:>13}: images/s per epoch: {shown}")
        if cache is not None:
            print(f"{'':>13}  {cache.stats()}")
            cache.close()
        del loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--loader", type=int, default=0, help="images for the DataLoader epochs")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    micro(args.runs)
    if args.loader:
        loader_epochs(args.loader, args.epochs, args.workers)


if __name__ == "__main__":
    main()
