"""First-epoch CPU per image of a remote pack, two checkouts of h5pack side by side.

Over ``rclone serve s3`` on 127.0.0.1 (``tests.s3local``), each epoch in a fresh
process with a fresh disk cache (every chunk downloaded, checked and cached): what the
download check costs (docs/decisions/0110-a-cache-that-heals.md). Packs: photo crops
64x64x3, 64 a chunk, zstd and lz4 (raw); 160x120 JPEG crops of the photos (encoded,
uncompressed chunks, decoded at ``size=96``).

    python scripts/bench_download_check.py --before /tmp/before [--rounds 5]

``--before`` is another checkout (its compiled extensions in place); this one is "after".
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
AFTER = Path(__file__).resolve().parents[1]


def crops(count: int, height: int, width: int) -> list[np.ndarray]:
    """Return ``count`` crops of the shared photos, resized to ``height x width``."""
    from PIL import Image

    photos = [Image.open(p).convert("RGB") for p in sorted(PHOTOS.glob("*.jpg"))]
    rng, out = np.random.default_rng(0), []
    for i in range(count):
        photo = photos[i % len(photos)]
        side = int(rng.integers(min(photo.size) // 4, min(photo.size) // 2))
        x, y = (int(rng.integers(0, s - side)) for s in photo.size)
        box = photo.crop((x, y, x + side, y + side)).resize((width, height))
        out.append(np.asarray(box))
    return out


def packs(work: Path) -> dict[str, Path]:
    from h5pack.core.layout import Compression
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    raw = crops(2048, 64, 64)
    found = {}
    for codec in ("zstd", "lz4"):
        found[codec] = work / f"{codec}.h5"
        options = ConvertOptions(chunk_samples=64, compression=Compression(codec=codec))
        write_arrays(found[codec], raw, [i % 4 for i in range(len(raw))], options=options)
    jpegs = []
    for image in crops(104, 120, 160):
        buffer = io.BytesIO()
        from PIL import Image

        Image.fromarray(image).save(buffer, "JPEG", quality=90)
        jpegs.append(buffer.getvalue())
    found["jpeg"] = work / "jpeg.h5"
    options = ConvertOptions(mode="encoded")
    write_arrays(found["jpeg"], jpegs, [i % 4 for i in range(len(jpegs))], options=options)
    return found


def child(url: str, storage: str, cache: str, size: int) -> None:
    from h5pack.read.reader import ReaderOptions
    from h5pack.training.loader import make_loader

    extra = {"size": size} if size else {}
    loader = make_loader(
        url,
        batch_size=64 if not size else 8,
        shuffle=False,
        num_workers=0,
        storage_options=json.loads(storage),
        reader=ReaderOptions(disk_cache_dir=cache),
        **extra,  # type: ignore[arg-type]
    )
    started, seen = time.process_time(), 0
    for images, _ in loader:
        seen += len(images)
    print(json.dumps({"cpu_us": (time.process_time() - started) / seen * 1e6, "n": seen}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.s3local import Bucket, FaultProxy, S3Server

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        made = packs(work)
        with S3Server(work / "s3") as server, FaultProxy(server.endpoint) as proxy:
            bucket = Bucket(server, proxy, "bench")
            urls = {name: bucket.put(path, f"{name}.h5") for name, path in made.items()}
            storage = json.dumps(bucket.storage_options)
            figures: dict[tuple[str, str], list[float]] = {}
            for round_ in range(args.rounds):
                for name, url in urls.items():
                    for side, root in (("before", args.before), ("after", AFTER)):
                        cache = work / f"cache-{side}-{name}-{round_}"
                        size = "96" if name == "jpeg" else "0"
                        said = subprocess.run(
                            [sys.executable, __file__, "--child", url, storage, str(cache), size],
                            env={**os.environ, "PYTHONPATH": str(root)},
                            capture_output=True,
                            text=True,
                            check=True,
                        ).stdout.splitlines()[-1]
                        figures.setdefault((name, side), []).append(json.loads(said)["cpu_us"])
    for name in urls:
        before = statistics.median(figures[name, "before"])
        after = statistics.median(figures[name, "after"])
        print(f"{name}: CPU us/image before {before:.1f}, after {after:.1f}, {before / after:.2f}x")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
