"""Decision 0055's figures: COCO masks' pack size, their codec, and who rasterises polygons.

    python scripts/measure_coco_masks.py [--photos DIR] [--images 72]
    python scripts/measure_coco_masks.py --images 300 --before OLD_CHECKOUT [--rounds 3]

Builds a COCO-shaped set (640 x 480 JPEG crops of the photos, 3-12 polygon objects per
image, some with two parts, a crowd RLE in every eighth image), converts it with and
without ``--annotations`` and prints: the pack sizes side by side; the instance masks'
bytes under each codec; the CPU per polygon of pycocotools' rasteriser and OpenCV's
``fillPoly``, and how many pixels ``fillPoly`` gets wrong against ``COCO.annToMask``; the
CPU per mask of decoding an RLE here and in pycocotools. With ``--before``: the
conversion's wall time and CPU per image of all its processes (``--workers 2``), this tree
against another checkout's, alternating, in child processes; medians of ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import cv2
import h5py
import hdf5plugin  # noqa: F401  (the masks' Zstandard)
import numpy as np
from PIL import Image
from pycocotools import mask as coco_mask

from h5pack import Compression, ConvertOptions, convert
from h5pack.write.sources import CocoSource
from h5pack.write.sources.coco import coco_masks

H, W = 480, 640


def _polygon(rng: np.random.Generator) -> list[float]:
    cx, cy = rng.uniform(40, W - 40), rng.uniform(40, H - 40)
    radius = rng.uniform(10, 120, size=int(rng.integers(8, 30)))
    angles = np.sort(rng.uniform(0, 2 * np.pi, radius.size))
    xs = np.clip(cx + radius * np.cos(angles), 0, W - 0.01)
    ys = np.clip(cy + radius * np.sin(angles), 0, H - 0.01)
    return np.round(np.stack([xs, ys], 1).reshape(-1), 2).tolist()


def make_set(root: Path, photos: Path, count: int) -> Path:
    rng = np.random.default_rng(0)
    sources = sorted(p for p in photos.iterdir() if p.suffix in (".jpg", ".png"))
    (root / "images").mkdir(parents=True)
    images, annotations = [], []
    for i in range(count):
        with Image.open(sources[i % len(sources)]) as photo:
            rgb = photo.convert("RGB")
            scale = max(W / rgb.width, H / rgb.height) * (1 + (i // len(sources)) * 0.15)
            rgb = rgb.resize((int(rgb.width * scale) + 1, int(rgb.height * scale) + 1))
            rgb.crop((0, 0, W, H)).save(root / "images" / f"{i:012d}.jpg", quality=90)
        images.append({"id": i + 1, "file_name": f"{i:012d}.jpg", "width": W, "height": H})
        for _ in range(int(rng.integers(3, 13))):
            parts = [_polygon(rng) for _ in range(1 + int(rng.random() < 0.2))]
            xs = [v for p in parts for v in p[0::2]]
            ys = [v for p in parts for v in p[1::2]]
            box = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
            annotations.append({"segmentation": parts, "bbox": box, "iscrowd": 0})
        if i % 8 == 0:
            crowd = np.zeros((H, W), np.uint8)
            crowd[200:320, 50:400] = 1
            runs = coco_mask.encode(np.asfortranarray(crowd))
            annotations.append(
                {"segmentation": {"size": [H, W], "counts": runs["counts"].decode()},
                 "bbox": [50, 200, 350, 120], "iscrowd": 1}
            )  # fmt: skip
        for k, ann in enumerate(annotations):
            ann.setdefault("image_id", i + 1)
            ann.setdefault("id", k + 1)
            ann.setdefault("category_id", int(rng.choice([1, 3, 18, 44, 90])))
    categories = [{"id": c, "name": f"c{c}"} for c in (1, 3, 18, 44, 90)]
    path = root / "instances.json"
    data = {"images": images, "annotations": annotations, "categories": categories}
    path.write_text(json.dumps(data))
    return path


def sizes(root: Path, annotations: Path) -> np.ndarray:
    for mode in ("raw", "encoded"):
        options = ConvertOptions(workers=2, mode=mode)
        cpu = time.process_time()
        plain = convert(root / "images", root / "plain.h5", options, overwrite=True)
        plain_cpu = time.process_time() - cpu
        cpu = time.process_time()
        coco = convert(CocoSource(root / "images", annotations), root / "coco.h5", options,
                       overwrite=True)  # fmt: skip
        cpu = time.process_time() - cpu
        with h5py.File(root / "coco.h5") as f:
            raw = f["fields/masks"].size
            stored = f["fields/masks"].id.get_storage_size()
            masks = f["fields/masks"][()]
        print(f"{mode}: images-only pack {plain.file_bytes / 1e6:.2f} MB, with boxes and "
              f"masks {coco.file_bytes / 1e6:.2f} MB ({coco.file_bytes / plain.file_bytes:.3f}x);"
              f" masks {raw / 1e6:.1f} MB raw, {stored / 1e6:.3f} MB stored (zstd 3); parent CPU "
              f"{plain_cpu:.2f} s images-only, {cpu:.2f} s with masks")  # fmt: skip
    return masks


def codecs(masks: np.ndarray, chunk: int) -> None:
    for name, kwargs in [
        ("none", {}),
        ("gzip 1", {"compression": "gzip", "compression_opts": 1}),
        ("gzip 4", {"compression": "gzip", "compression_opts": 4}),
        ("lzf", {"compression": "lzf"}),
        ("lz4", Compression(codec="lz4").h5py_kwargs()),
        ("zstd 3", Compression(codec="zstd").h5py_kwargs()),
        ("bitshuffle lz4", Compression(codec="lz4", shuffle="bit").h5py_kwargs()),
        ("bitshuffle zstd 3", Compression(codec="zstd", shuffle="bit").h5py_kwargs()),
    ]:
        with h5py.File("m.h5", "w", driver="core", backing_store=False) as f:
            cpu = time.process_time()
            dataset = f.create_dataset("m", data=masks, chunks=(chunk,), **kwargs)
            written = time.process_time() - cpu
            cpu = time.process_time()
            dataset[()]
            read = time.process_time() - cpu
            stored = dataset.id.get_storage_size()
        print(f"{name}: {stored / 1e6:.3f} MB, write {written * 1e3:.0f} ms CPU, "
              f"read {read * 1e3:.0f} ms CPU")  # fmt: skip


def rasterisers(annotations: Path) -> None:
    anns = json.loads(annotations.read_text())["annotations"]
    polygons = [a["segmentation"] for a in anns if isinstance(a["segmentation"], list)]
    crowds = [a["segmentation"] for a in anns if isinstance(a["segmentation"], dict)]
    cpu = time.process_time()
    reference = [coco_masks((H, W, (p,)))[0] for p in polygons]
    ours = time.process_time() - cpu
    cpu = time.process_time()
    drawn = []
    for parts in polygons:
        mask = np.zeros((H, W), np.uint8)
        points = [np.round(np.reshape(p, (-1, 2))).astype(np.int32) for p in parts]
        drawn.append(cv2.fillPoly(mask, points, 1))
    opencv = time.process_time() - cpu
    wrong = [int(np.count_nonzero(a != b)) for a, b in zip(reference, drawn, strict=True)]
    area = sum(int(m.sum()) for m in reference)
    print(f"{len(polygons)} polygons: pycocotools {ours / len(polygons) * 1e6:.0f} us each "
          f"(+ decode here), cv2.fillPoly {opencv / len(polygons) * 1e6:.0f} us; fillPoly "
          f"differs on {sum(wrong)} pixels of {area} ({sum(wrong) / area:.1%}), "
          f"{sum(w > 0 for w in wrong)} of {len(wrong)} masks")  # fmt: skip
    crowds = crowds * 50
    cpu = time.process_time()
    mine = [coco_masks((H, W, (c,)))[0] for c in crowds]
    here = time.process_time() - cpu
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cpu = time.process_time()
        theirs = [coco_mask.decode(c) for c in crowds]
        there = time.process_time() - cpu
    same = all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    print(f"{len(crowds)} RLE decodes: here {here / len(crowds) * 1e6:.0f} us each, "
          f"pycocotools {there / len(crowds) * 1e6:.0f} us; equal: {same}")  # fmt: skip


CHILD = """
import resource, sys, time
from h5pack import ConvertOptions, convert
from h5pack.write.sources import CocoSource
def cpu():
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime
images, annotations, target = sys.argv[1:]
start, (own, kids) = time.perf_counter(), cpu()
convert(CocoSource(images, annotations), target, ConvertOptions(workers=2), overwrite=True)
print(time.perf_counter() - start, cpu()[0] - own, cpu()[1] - kids)
"""


def timing(root: Path, annotations: Path, trees: dict[str, Path], rounds: int, count: int) -> None:
    found: dict[str, list[list[float]]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}  # run in root: not this tree
            args = [sys.executable, "-c", CHILD, str(root / "images"), str(annotations)]
            out = subprocess.run([*args, str(root / f"{name}.h5")], env=env, check=True,
                                 cwd=root, capture_output=True, text=True).stdout  # fmt: skip
            wall, parent, workers = map(float, out.split())
            found[name].append([wall, parent + workers, parent])
    median = {
        n: [statistics.median(r[k] for r in runs) for k in range(3)] for n, runs in found.items()
    }
    for name, (wall, cpu, parent) in median.items():
        print(f"{name}: {wall:.2f} s wall, {cpu / count * 1e3:.1f} ms CPU per image (all "
              f"processes), {parent / count * 1e3:.1f} ms of it in the parent")  # fmt: skip
    (wall_a, cpu_a, _), (wall_b, cpu_b, _) = median["before"], median["after"]
    with h5py.File(root / "before.h5") as a, h5py.File(root / "after.h5") as b:
        same = all(np.array_equal(a[f"fields/{k}"][()], b[f"fields/{k}"][()]) for k in a["fields"])
    print(f"after / before: wall {wall_b / wall_a:.2f}x, CPU {cpu_b / cpu_a:.2f}x; "
          f"fields equal: {same}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, default=Path("../shared/data/photos"))
    parser.add_argument("--images", type=int, default=72)
    parser.add_argument("--before", type=Path, help="a checkout to time this tree against")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        annotations = make_set(Path(tmp), args.photos, args.images)
        if args.before is not None:
            here = Path(__file__).resolve().parents[1]
            trees = {"before": args.before.resolve(), "after": here}
            timing(Path(tmp), annotations, trees, args.rounds, args.images)
            return
        masks = sizes(Path(tmp), annotations)
        with h5py.File(Path(tmp) / "coco.h5") as f:
            chunk = f["fields/masks"].chunks[0]
        codecs(masks, chunk)
        rasterisers(annotations)


if __name__ == "__main__":
    main()
