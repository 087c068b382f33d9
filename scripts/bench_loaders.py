"""Loaders side by side: h5pack against what users pick instead, on the same photos.

    python scripts/bench_loaders.py --data bench-data/photos2000 --json loaders.json
    python scripts/bench_loaders.py --only pillow h5pack h5pack-raw --rounds 5
    python scripts/bench_loaders.py --size 256 --codecs none gzip lz4 zstd --only pillow \
        naive-h5py webdataset h5pack-raw h5pack-unchecked          # as stored, per codec
    python scripts/bench_loaders.py --quick                  # a smoke run (~1 min)
    python scripts/bench_loaders.py --images 500 --rounds 3 --only h5pack h5pack-coco

Data (``prepare``): ``--images`` ImageNet-like JPEGs (``h5pack.synthetic.make_image_folder``,
cut from ../shared/data/photos when present, 10 classes, around 500x375 with +-30% jitter,
quality 90), packed encoded (``h5pack convert``'s default for mixed sizes) and raw at 256x256.
``--data DIR`` keeps them between runs; ``scripts/bench_ffcv.py`` reads the same data.

Every arm (``--only``) delivers uint8 (B, 3, 224, 224) batches of RandomResizedCrop(224) and a
horizontal flip, and int64 labels; with ``--size N`` the JPEGs are exactly N x N and every arm
delivers them as stored, (B, 3, N, N), the raw packs storing the same pixels:

- ``pillow``: an ImageFolder-style Dataset as users write it (``Image.open().convert("RGB")``,
  torchvision's box, ``crop().resize((224, 224), BILINEAR)``, flip), ``--workers`` workers;
- ``pillow-manager``: the same with a ``multiprocessing.Manager().dict()`` of decoded images
  shared by the workers (the common recipe; later epochs only);
- ``naive-h5py``: one h5py read per sample of the encoded pack, then as ``pillow``;
- ``webdataset``: tar shards of the JPEGs with a shuffle buffer, then as ``pillow`` (when
  webdataset imports);
- ``h5pack``: ``make_loader(encoded, 64, size=224, crop="random-resized", flip=True)``;
- ``h5pack-inproc``: the same in the main process with ``--workers`` threads;
- ``h5pack-cached``: the same with ``cache="decoded"`` and a budget over the decoded images
  (its first epoch fills the cache);
- ``h5pack-coco``: the same images converted with a COCO instances file (1-8 rectangles and
  ellipses per image as polygons: boxes, category ids, iscrowd, instance masks), every
  field through the same crop and flip; printed beside ``h5pack``: the CPU per image ratio;
- ``h5pack-raw``: the raw 256x256 pack (with ``--codecs``: one pack per codec, 64 samples
  per chunk, each its own arm); ``h5pack-unchecked``: the same with
  ``reader=ReaderOptions(verify_checksums=False)`` (what checking every sample costs).

"first epoch": a loader made fresh each round (worker start-up included); "later epochs":
made once, one untimed epoch, then one timed epoch per round. Rounds interleave every arm,
rotated each round, so load from elsewhere hits all alike. Each figure is the median over
rounds of images/s and of CPU microseconds per image of the whole process tree (workers and
the Manager's server included, ``h5pack.bench.tree_cpu_s``); ratios are medians of per-round
ratios to ``pillow``.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from h5pack.bench.system import machine_info, tree_cpu_s, warm_page_cache
from h5pack.core import format as fmt
from h5pack.core.format import load_meta
from h5pack.core.layout import Compression
from h5pack.read.crop import DEFAULT_RATIO, DEFAULT_SCALE, random_resized_box
from h5pack.read.reader import ReaderOptions
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.cache import CacheSpec
from h5pack.training.loader import make_loader
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions
from h5pack.write.sources import sample_source

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None
SIZE = 224
FIRST, LATER = "first epoch", "later epochs"


# -- the peers: what users write today --------------------------------------------------------
def to_chw(hwc: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 array -> contiguous (3, H, W) uint8 tensor."""
    return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))


class _Pipeline:
    """RandomResizedCrop(224) + flip with Pillow, a generator per process (or as stored)."""

    crop = True  # False: as stored (--size)
    _rng: np.random.Generator | None = None
    _pid = -1

    def rng(self) -> np.random.Generator:
        if self._rng is None or self._pid != os.getpid():
            self._rng, self._pid = np.random.default_rng(torch.initial_seed()), os.getpid()
        return self._rng

    def augment(self, image: Image.Image) -> torch.Tensor:
        if not self.crop:
            return to_chw(np.asarray(image))
        rng = self.rng()
        top, left, height, width = random_resized_box(
            image.height, image.width, DEFAULT_SCALE, DEFAULT_RATIO, rng
        )
        image = image.crop((left, top, left + width, top + height))
        image = image.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return to_chw(np.array(image))


def open_rgb(data: bytes | str) -> Image.Image:
    """Decode a JPEG file (a path) or its bytes to RGB."""
    with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as file:
        return file.convert("RGB")


class PillowPeer(_Pipeline, Dataset[tuple[torch.Tensor, int]]):
    """ImageFolder + RandomResizedCrop(224) + flip, with Pillow; optionally a shared dict cache."""

    def __init__(self, samples: list[tuple[str, int]], cache: Any = None) -> None:
        self.samples = samples
        self.cache = cache

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        cached = self.cache.get(index) if self.cache is not None else None
        if cached is None:
            image = open_rgb(path)
            if self.cache is not None:
                self.cache[index] = np.asarray(image)
        else:
            image = Image.fromarray(cached)
        return self.augment(image), label


class NaiveH5Peer(_Pipeline, Dataset[tuple[torch.Tensor, int]]):
    """One h5py read per sample (h5py's default cache), decoded (encoded) and as Pillow."""

    def __init__(self, path: Path) -> None:
        self.path = path
        meta = load_meta(path)
        self.labels = meta.labels
        self.slots = meta.blob_slots() if meta.mode == "encoded" else None
        self._handle: Any = None
        self._opened = -1

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._opened != os.getpid():
            self._handle, self._opened = h5py.File(self.path, "r"), os.getpid()
        images, label = self._handle[fmt.IMAGES], int(self.labels[index])
        if self.slots is None:  # raw pixels
            return self.augment(Image.fromarray(images[index])), label
        start = int(self.slots[0][index])
        data = images[start : start + int(self.slots[1][index])].tobytes()
        return self.augment(open_rgb(data)), label

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None, "_opened": -1}


def image_samples(root: Path) -> list[tuple[str, int]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [
        (str(path), label)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
    ]


def jpeg_samples(root: Path) -> list[tuple[bytes, int]]:
    return [(Path(path).read_bytes(), label) for path, label in image_samples(root)]


def write_shards(samples: list[tuple[bytes, int]], folder: Path, per_shard: int) -> list[str]:
    """WebDataset tar shards: ``<key>.jpg`` and ``<key>.cls`` per sample."""
    folder.mkdir(parents=True, exist_ok=True)
    urls = []
    for shard, start in enumerate(range(0, len(samples), per_shard)):
        path = folder / f"shard-{shard:05d}.tar"
        with tarfile.open(path, "w") as tar:
            for index in range(start, min(start + per_shard, len(samples))):
                data, label = samples[index]
                for suffix, payload in (("jpg", data), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{index:08d}.{suffix}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        urls.append(str(path))
    return urls


class WdsDecode(_Pipeline):
    """A WebDataset sample -> (the augmented uint8 CHW tensor, label)."""

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        """Decode and augment one sample."""
        return self.augment(open_rgb(sample["jpg"])), int(sample["cls"])


def wds_tuple(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """A WebDataset sample -> (the decoded uint8 CHW tensor as stored, label)."""
    return to_chw(np.asarray(open_rgb(sample["jpg"]))), int(sample["cls"])


def stack(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([b[0] for b in batch])
    return images, torch.as_tensor([b[1] for b in batch], dtype=torch.int64)


def check_batch(loader: Iterable[Any], size: int) -> str | None:
    """Return why the first batch is not (B, 3, size, size) uint8 with int64 labels, or None."""
    images, labels = next(iter(loader))[:2]
    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, size, size):
        return f"images {tuple(images.shape)} {images.dtype}"
    return None if labels.dtype == torch.int64 else f"labels {labels.dtype}"


# -- measuring --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One timed epoch: images per second, and images per CPU-second of the process tree."""

    images_per_s: float
    images_per_cpu_s: float


def epoch(loader: Any, number: int = 0, *, build_s: float = 0.0, build_cpu_s: float = 0.0) -> Run:
    """Iterate ``loader`` once (``build_s`` of building it counted in); return the rates."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(number)
    images, cpu, start = 0, tree_cpu_s(), time.perf_counter()
    for found in loader:
        batch, labels = (found["image"], found["label"]) if isinstance(found, dict) else found
        assert batch.shape[1:] == (3, SIZE, SIZE), batch.shape
        assert batch.dtype == torch.uint8, batch.dtype
        images += len(labels)
    elapsed = time.perf_counter() - start + build_s
    # a worker that exited at the end of the epoch took its CPU time with it: count the
    # tree before the workers go (persistent workers, or the iterator still referenced)
    used = tree_cpu_s() - cpu + build_cpu_s
    return Run(images / elapsed, images / used if used > 0 else float("inf"))


def fresh_epoch(make: Callable[[], Any]) -> Run:
    """Build a loader and run its first epoch, the building (and worker start) included."""
    cpu, start = tree_cpu_s(), time.perf_counter()
    loader = make()
    run = epoch(loader, build_s=time.perf_counter() - start, build_cpu_s=tree_cpu_s() - cpu)
    if hasattr(loader, "close"):
        loader.close()
    del loader
    return run


@dataclass
class Rounds:
    """The runs of each measurement, one per round."""

    runs: dict[str, list[Run]] = field(default_factory=dict)

    def add(self, name: str, run: Run) -> None:
        """Record one round's run of ``name``."""
        self.runs.setdefault(name, []).append(run)

    def median(self, name: str, *, cpu: bool = False) -> float:
        """Median images/s (or per CPU-second) of ``name`` over the rounds."""
        return statistics.median(self.values(name, cpu=cpu))

    def values(self, name: str, *, cpu: bool = False) -> list[float]:
        """Images/s (or per CPU-second) of ``name``, one per round."""
        return [r.images_per_cpu_s if cpu else r.images_per_s for r in self.runs[name]]

    def ratio(self, top: str, bottom: str, *, cpu: bool = False) -> float:
        """Median over the rounds of ``top`` / ``bottom`` within each round."""
        pairs = zip(self.values(top, cpu=cpu), self.values(bottom, cpu=cpu), strict=True)
        return statistics.median(a / b for a, b in pairs)


# -- data ---------------------------------------------------------------------------------------
def prepare(data: Path, images: int) -> tuple[Path, Path, Path]:
    """Make (or reuse) the image folder, the encoded pack and the raw 256x256 pack."""
    folder, encoded, raw = data / f"images-{images}", data / "encoded.h5", data / "raw256.h5"
    if not (folder.is_dir() and len(list(folder.rglob("*.jpg"))) == images):
        spec = SampleSpec(
            num_images=images, num_classes=10, size=(375, 500), size_jitter=0.3, quality=90
        )
        make_image_folder(folder, spec, photos=PHOTOS, workers=2, overwrite=True)
        encoded.unlink(missing_ok=True)
        raw.unlink(missing_ok=True)
    if not encoded.exists():
        convert(folder, encoded)
    if not raw.exists():
        convert(folder, raw, ConvertOptions(size=(256, 256)))
    return folder, encoded, raw


def prepare_stored(data: Path, images: int, size: int) -> tuple[Path, Path]:
    """Make (or reuse) JPEGs of exactly ``size`` x ``size`` and their encoded pack."""
    folder, encoded = data / f"images-{images}-{size}", data / f"encoded-{size}.h5"
    if not folder.is_dir():
        spec = SampleSpec(num_images=images, num_classes=10, size=(size, size), quality=90)
        make_image_folder(folder, spec, photos=PHOTOS, workers=2)
    if not encoded.exists():
        convert(folder, encoded)
    return folder, encoded


def coco_pack(data: Path, folder: Path, seed: int = 0) -> Path:
    """Make (or reuse) the COCO pack of ``folder``: 1-8 rectangles and ellipses per image."""
    pack, annotations = data / f"{folder.name}-coco.h5", data / f"{folder.name}-coco.json"
    if pack.exists():
        return pack
    rng = np.random.default_rng(seed)
    images, objects = [], []
    for image_id, path in enumerate(sorted(folder.rglob("*.jpg")), start=1):
        width, height = Image.open(path).size
        name = path.relative_to(folder).as_posix()
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
        for _ in range(int(rng.integers(1, 9))):
            w, h = rng.uniform(0.08, 0.5) * width, rng.uniform(0.08, 0.5) * height
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            angles = np.linspace(0, 2 * np.pi, 24, endpoint=False)
            round_ = [x + w / 2 * (1 + np.cos(angles)), y + h / 2 * (1 + np.sin(angles))]
            xs, ys = round_ if rng.random() < 0.5 else ([x, x + w, x + w, x], [y, y, y + h, y + h])
            polygon = np.stack([xs, ys], axis=1).reshape(-1).round(2).tolist()
            objects.append({
                "id": len(objects) + 1, "image_id": image_id, "iscrowd": 0,
                "category_id": int(rng.integers(1, 11)), "bbox": [x, y, w, h],
                "area": w * h, "segmentation": [polygon],
            })  # fmt: skip
    categories = [{"id": i, "name": f"class{i}"} for i in range(1, 11)]
    document = {"images": images, "annotations": objects, "categories": categories}
    annotations.write_text(json.dumps(document))
    convert(sample_source(folder, annotations=annotations), pack)
    return pack


def raw_packs(folder: Path, codecs: list[str], size: tuple[int, int] | None) -> dict[str, Path]:
    """Make (or reuse) a raw pack of ``folder`` per codec, 64 samples per chunk."""
    raws = {}
    for codec in codecs:
        raws[codec] = folder.parent / f"{folder.name}-raw-{codec}.h5"
        if not raws[codec].exists():
            compression = Compression(codec=codec)
            options = ConvertOptions(size=size, chunk_samples=64, compression=compression)
            convert(folder, raws[codec], options)
    return raws


ARMS = (
    "pillow",
    "pillow-manager",
    "naive-h5py",
    "webdataset",
    "h5pack",
    "h5pack-inproc",
    "h5pack-cached",
    "h5pack-coco",
    "h5pack-raw",
    "h5pack-unchecked",
)


def arms_of(
    args: argparse.Namespace,
    data: Path,
    folder: Path,
    encoded: Path,
    raws: dict[str, Path],
    manager: Any,
) -> dict[str, tuple[Callable[[], Any], bool]]:
    """Return each chosen arm's loader factory, and whether its first epoch is timed too."""
    samples = image_samples(folder)
    workers, batch = args.workers, args.batch_size
    keep = {"persistent_workers": True} if workers else {}

    def peer(dataset: Any) -> Callable[[], Any]:
        return lambda: DataLoader(
            dataset, batch_size=batch, shuffle=True, num_workers=workers, **keep
        )

    def h5(pack: Path, **options: Any) -> Callable[[], Any]:
        if _Pipeline.crop:
            options = {"size": SIZE, "crop": "random-resized", "flip": True, **options}
        return lambda: make_loader(pack, batch, **options)

    meta = load_meta(encoded)
    decoded = int(sum(int(h) * int(w) * 3 for h, w in meta.shapes[:, :2]))
    arms: dict[str, tuple[Callable[[], Any], bool]] = {
        "pillow": (peer(PillowPeer(samples)), True),
        "pillow-manager": (lambda: peer(PillowPeer(samples, manager.dict()))(), False),
        "naive-h5py": (peer(NaiveH5Peer(encoded)), True),
        "h5pack": (h5(encoded), True),
        "h5pack-inproc": (h5(encoded, num_workers=0, reader=ReaderOptions(threads=workers)), True),
        "h5pack-cached": (h5(encoded, cache=CacheSpec(cache_bytes=2 * decoded + 2**24)), True),
    }
    if "h5pack-coco" in args.only:
        arms["h5pack-coco"] = (h5(coco_pack(data, folder)), True)
    for codec, raw in raws.items():
        named = "" if len(raws) == 1 else f"-{codec}"
        arms[f"h5pack-raw{named}"] = (h5(raw), True)
        arms[f"h5pack-unchecked{named}"] = (
            h5(raw, reader=ReaderOptions(verify_checksums=False)),
            False,
        )
    if "webdataset" in args.only:
        try:
            import webdataset as wds
        except ImportError as err:
            print(f"# webdataset left out: {err}", file=sys.stderr)
        else:
            urls = write_shards(jpeg_samples(folder), data / "wds", per_shard=256)

            def webdataset() -> Any:
                pipeline = (
                    wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
                    .shuffle(1000)
                    .map(WdsDecode())
                    .batched(batch, collation_fn=stack)
                )
                return wds.WebLoader(pipeline, batch_size=None, num_workers=workers, **keep)

            arms["webdataset"] = (webdataset, True)
    return {
        n: arm for n, arm in arms.items() if (n if n in ARMS else n.rsplit("-", 1)[0]) in args.only
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="the peers' DataLoader workers")
    parser.add_argument("--only", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--size", type=int, help="JPEGs of exactly N x N, read as stored")
    parser.add_argument("--codecs", nargs="+", help="a raw pack per codec (default: one)")
    parser.add_argument("--data", type=Path, help="keep the images and packs here (reused)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument("--quick", action="store_true", help="120 images, 1 round: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.rounds = min(args.images, 120), 1
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp)
        data.mkdir(parents=True, exist_ok=True)
        if args.size:
            global SIZE  # every arm delivers the images as stored
            SIZE, _Pipeline.crop = args.size, False
            folder, encoded = prepare_stored(data, args.images, args.size)
            raws = raw_packs(folder, args.codecs or ["none"], None)
        else:
            folder, encoded, raw = prepare(data, args.images)
            raws = raw_packs(folder, args.codecs, (256, 256)) if args.codecs else {"": raw}
        for path in (*folder.rglob("*.jpg"), encoded, *raws.values()):
            warm_page_cache(path)
        manager = multiprocessing.Manager()
        try:
            figures = run(args, arms_of(args, data, folder, encoded, raws, manager))
        finally:
            manager.shutdown()
    if args.json:
        args.json.write_text(json.dumps({"machine": asdict(machine_info()), **figures}, indent=1))


def run(
    args: argparse.Namespace, arms: dict[str, tuple[Callable[[], Any], bool]]
) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    print(f"# {machine_info().describe()}, torch {torch.__version__}; load {load_start:.2f}")
    kept = {name: make() for name, (make, _) in arms.items()}
    for loader in kept.values():  # the untimed epoch: workers, caches, page cache
        epoch(loader, 0)
    rounds = Rounds()
    for number in range(args.rounds):
        names = list(arms)
        for name in names[number % len(names) :] + names[: number % len(names)]:
            make, first = arms[name]
            if first:
                rounds.add(f"{name} / {FIRST}", fresh_epoch(make))
            rounds.add(f"{name} / {LATER}", epoch(kept[name], number + 1))
        print(f"# round {number + 1}/{args.rounds} done", file=sys.stderr)
    for loader in kept.values():
        if hasattr(loader, "close"):
            loader.close()
    print(f"\n## medians of {args.rounds} rounds; ratios: medians of per-round ratios\n")
    print("| loader | epoch | images/s | CPU us/image | x pillow (images/s) | each round |")
    print("|---|---|---:|---:|---:|---|")
    figures: dict[str, Any] = {}
    for name in rounds.runs:
        which = name.rsplit(" / ", 1)[1]
        peer = f"pillow / {which}"
        ratio = rounds.ratio(name, peer) if peer in rounds.runs else None
        figures[name] = {
            "images_per_s": rounds.median(name),
            "cpu_us_per_image": 1e6 / rounds.median(name, cpu=True),
            "vs_pillow": ratio,
            "rounds": rounds.values(name),
        }
        shown = ", ".join(f"{r:,.0f}" for r in rounds.values(name))
        print(
            f"| {name.replace(' / ', ' | ')} | {rounds.median(name):,.0f} |"
            f" {figures[name]['cpu_us_per_image']:,.0f} |"
            f" {'' if ratio is None else f'{ratio:.2f}x'} | {shown} |"
        )
    for which in (FIRST, LATER):
        coco, plain = f"h5pack-coco / {which}", f"h5pack / {which}"
        if coco in rounds.runs and plain in rounds.runs:
            ratio = 1 / rounds.ratio(coco, plain, cpu=True)  # images per CPU-second, inverted
            figures[f"coco CPU per image / {which}"] = ratio
            print(f"\nh5pack-coco / h5pack, CPU per image, {which}: {ratio:.2f}x")
    print(f"\n# load average: {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    return figures


if __name__ == "__main__":
    main()
