"""FFCV and h5pack side by side, per image and per CPU-second (issue 19 item 1).

    python scripts/bench_ffcv.py --data bench-data/photos2000 --json ffcv.json   # ~10 min
    python scripts/bench_ffcv.py --quick                                          # smoke

FFCV is measured only when it is importable (``import ffcv``; the install recipe is in
BENCHMARKS.md, "FFCV side by side"); without it the script says so and measures h5pack alone.

Data: the 2,000 ImageNet-like JPEGs of ``scripts/bench_loaders.py`` (``prepare``: cut from
../shared/data/photos, ~500x375 with +-30% jitter, quality 90), as h5pack's encoded pack
and its raw 256x256 pack, and as FFCV ``.beton`` files: ``RGBImageField(write_mode="jpg",
jpeg_quality=90)`` of the decoded images (FFCV re-encodes them) and
``RGBImageField(write_mode="raw")`` of the same images resized to 256x256 (the pixels
h5pack's raw pack holds: ``ConvertOptions(size=(256, 256))``).

Every loader delivers uint8 (64, 3, 224, 224) batches of RandomResizedCrop(224) + horizontal
flip, shuffled, on the same 2 cores: FFCV's ``Loader(num_workers=2, order=RANDOM or
QUASI_RANDOM, drop_last=False)`` with ``RandomResizedCropRGBImageDecoder((224, 224))``,
``RandomHorizontalFlip()``, ``ToTensor()``, ``ToTorchImage()``; h5pack's
``make_loader(pack, 64, size=224, flip=True)`` with ``num_workers="auto"`` (2 workers: a
pack cut to a size gets one per core, encoded or raw) and in the main process with 2 threads
(``num_workers=0, reader=ReaderOptions(threads=2)``).
Two arms measure a step against what it replaced, in the same
rounds: "h5 jpeg in-process, whole decodes" (within ``jpegbox.disabled()``: no box decoded
alone) and "h5 raw auto, torch enlarges" (``resize.ENLARGE_WITH_OPENCV = False`` in
the process that forks its workers).

Measured: conversion (wall and CPU of the process tree); first epochs (a loader made in
the round; FFCV's includes its JIT compile, which happens for every Loader; "compile taken
out" counts the epoch from the end of its first batch, which holds the compile); later
epochs (loaders kept, one untimed epoch, then one timed epoch per round). Rounds
interleave every measurement; figures are medians over rounds, ratios medians of per-round
ratios, and "per CPU-s" counts the CPU time of the whole process tree (FFCV's threads,
h5pack's workers), steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loaders as bench_photos
from bench_loaders import SIZE, Rounds, Run, epoch, prepare, tree_cpu_s

from h5pack import make_loader
from h5pack.bench.system import machine_info, warm_page_cache
from h5pack.core import jpegbox
from h5pack.read.reader import ReaderOptions
from h5pack.training import resize

BATCH = 64


def ffcv_available() -> str | None:
    """None when FFCV imports, else why not."""
    try:
        import ffcv
        import ffcv.loader  # noqa: F401
    except Exception as err:  # any import-time failure: not installed, numba, libturbojpeg
        return f"{type(err).__name__}: {err}"
    return None


# -- conversion -------------------------------------------------------------------------------
class FolderImages:
    """The folder's images as (PIL image, label), for FFCV's DatasetWriter (optionally resized)."""

    def __init__(self, samples: list[tuple[str, int]], size: int | None = None) -> None:
        self.samples = samples
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, label = self.samples[index]
        with Image.open(path) as opened:
            image = opened.convert("RGB")
        if self.size is not None:
            image = image.resize((self.size, self.size), Image.Resampling.BILINEAR)
        return image, label


def folder_samples(folder: Path) -> list[tuple[str, int]]:
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return [
        (str(path), label)
        for label, name in enumerate(classes)
        for path in sorted((folder / name).glob("*.jpg"))
    ]


def write_beton(target: Path, samples: list[tuple[str, int]], mode: str) -> dict[str, float]:
    """Write an FFCV file of the folder (``jpg``, or ``raw`` at 256x256); return its cost."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    cpu, start = tree_cpu_s(), time.perf_counter()
    field = (
        RGBImageField(write_mode="jpg", jpeg_quality=90)
        if mode == "jpg"
        else RGBImageField(write_mode="raw")
    )
    writer = DatasetWriter(str(target), {"image": field, "label": IntField()}, num_workers=2)
    writer.from_indexed_dataset(FolderImages(samples, None if mode == "jpg" else 256))
    return {
        "wall_s": time.perf_counter() - start,
        "cpu_s": tree_cpu_s() - cpu,
        "bytes": target.stat().st_size,
    }


def convert_h5(target: Path, folder: Path, raw: bool) -> dict[str, float]:
    from h5pack import ConvertOptions, convert

    cpu, start = tree_cpu_s(), time.perf_counter()
    convert(folder, target, ConvertOptions(size=(256, 256)) if raw else ConvertOptions())
    return {
        "wall_s": time.perf_counter() - start,
        "cpu_s": tree_cpu_s() - cpu,
        "bytes": target.stat().st_size,
    }


# -- loaders ----------------------------------------------------------------------------------
def ffcv_loader(path: Path, order: str, seed: int = 0) -> Any:
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    return Loader(
        str(path),
        batch_size=BATCH,
        num_workers=2,
        order=getattr(OrderOption, order),
        seed=seed,
        drop_last=False,
        os_cache=True,
        pipelines={
            "image": [
                RandomResizedCropRGBImageDecoder((SIZE, SIZE)),
                RandomHorizontalFlip(),
                ToTensor(),
                ToTorchImage(),
            ],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        },
    )


def h5_loader(path: Path, **kwargs: Any) -> Any:
    return make_loader(path, BATCH, size=SIZE, crop="random-resized", flip=True, **kwargs)


def first_epoch(make: Callable[[], Any]) -> tuple[Run, Run]:
    """A loader made now, its first epoch: (all of it, from the end of its first batch)."""
    cpu0, start = tree_cpu_s(), time.perf_counter()
    loader = make()
    images = 0
    after: tuple[float, float, int] | None = None
    for batch, labels in loader:
        assert batch.shape[1:] == (3, SIZE, SIZE), batch.shape
        assert batch.dtype == torch.uint8, batch.dtype
        images += len(labels)
        if after is None:
            after = (time.perf_counter(), tree_cpu_s(), images)
    wall, cpu = time.perf_counter() - start, tree_cpu_s() - cpu0
    assert after is not None
    rest_wall = time.perf_counter() - after[0]
    rest_cpu = tree_cpu_s() - after[1]
    rest = images - after[2]
    if hasattr(loader, "close"):
        loader.close()
    del loader
    return Run(images / wall, images / cpu), Run(rest / rest_wall, rest / rest_cpu)


@contextlib.contextmanager
def _arm_switches(name: str) -> Iterator[None]:
    """Switch an arm's comparison on (in this process, and in the workers forked meanwhile).

    "..., whole decodes" decodes no box alone; "..., torch enlarges" sends enlarging boxes
    to torch's kernel too.
    """
    with jpegbox.disabled() if name.endswith("whole decodes") else contextlib.nullcontext():
        if not name.endswith("torch enlarges"):
            yield
            return
        before = resize.ENLARGE_WITH_OPENCV
        resize.ENLARGE_WITH_OPENCV = False
        try:
            yield
        finally:
            resize.ENLARGE_WITH_OPENCV = before


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="keep the data here")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of later epochs")
    parser.add_argument("--first-rounds", type=int, default=3, help="rounds of first epochs")
    parser.add_argument("--quick", action="store_true", help="300 images, 2 rounds")
    parser.add_argument("--no-first", action="store_true", help="skip first epochs")
    parser.add_argument(
        "--no-convert",
        action="store_true",
        help="skip the conversion timings; reuse the .beton files in --data when present",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--photos", type=Path, default=None, help="photos to cut from (default ../shared/...)"
    )
    args = parser.parse_args(argv)
    if args.photos is not None:
        bench_photos.PHOTOS = args.photos
    if args.quick:
        args.images, args.rounds, args.first_rounds = 300, 2, 1
    missing = ffcv_available()
    if missing is not None:
        print(f"FFCV is not importable ({missing}): measuring h5pack alone")
    with tempfile.TemporaryDirectory(prefix="bench-ffcv-") as scratch:
        data = args.data or Path(scratch)
        data.mkdir(parents=True, exist_ok=True)
        result = run(args, data, ffcv=missing is None)
    print(json.dumps(result["ratios"], indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


def run(args: argparse.Namespace, data: Path, *, ffcv: bool) -> dict[str, Any]:
    started = asdict(machine_info())
    folder, encoded, raw = prepare(data, args.images)
    samples = folder_samples(folder)
    conversion: dict[str, Any] = {}
    scratch = data / "conversion"
    scratch.mkdir(exist_ok=True)
    for name, is_raw in (("h5pack encoded", False), ("h5pack raw 256", True)):
        if args.no_convert:
            break
        target = scratch / f"{name.replace(' ', '-')}.h5"
        target.unlink(missing_ok=True)
        conversion[name] = convert_h5(target, folder, is_raw)
        target.unlink()
    betons = {"jpg": data / "ffcv-jpg.beton", "raw": data / "ffcv-raw256.beton"}
    if ffcv:
        for mode, target in betons.items():
            if args.no_convert and target.exists():
                continue
            target.unlink(missing_ok=True)
            conversion[f"ffcv {mode}"] = write_beton(target, samples, mode)
    for path in (encoded, raw, *(betons.values() if ffcv else ())):
        warm_page_cache(path)

    makers: dict[str, Callable[[], Any]] = {
        "h5 jpeg auto": lambda: h5_loader(encoded),
        "h5 jpeg in-process": lambda: h5_loader(
            encoded, num_workers=0, reader=ReaderOptions(threads=2)
        ),
        # the same with every JPEG decoded whole (NOTE [ Decoding only the box ])
        "h5 jpeg in-process, whole decodes": lambda: h5_loader(
            encoded, num_workers=0, reader=ReaderOptions(threads=2)
        ),
        "h5 jpeg cache": lambda: h5_loader(
            encoded, num_workers=0, reader=ReaderOptions(threads=2), cache="decoded"
        ),
        "h5 raw auto": lambda: h5_loader(raw),
        # the same with enlarging boxes resized by torch (NOTE [ Pillow's filter, computed
        # by torch ]): its workers fork inside the arm's switch, and keep it
        "h5 raw auto, torch enlarges": lambda: h5_loader(raw),
        "h5 raw in-process": lambda: h5_loader(raw, num_workers=0, reader=ReaderOptions(threads=2)),
    }
    if ffcv:
        for order in ("RANDOM", "QUASI_RANDOM"):
            makers[f"ffcv jpeg {order}"] = lambda o=order: ffcv_loader(betons["jpg"], o)
            makers[f"ffcv raw {order}"] = lambda o=order: ffcv_loader(betons["raw"], o)

    first = Rounds()
    first_rest = Rounds()
    if not args.no_first:
        firsts = [n for n in makers if "cache" not in n]
        for number in range(args.first_rounds):
            for name in firsts[number % len(firsts) :] + firsts[: number % len(firsts)]:
                with _arm_switches(name):
                    whole, rest = first_epoch(makers[name])
                first.add(name, whole)
                first_rest.add(name, rest)
                print(f"first {number} {name}: {whole} / after its first batch {rest}")

    kept = {name: make() for name, make in makers.items()}
    for name, loader in kept.items():  # the untimed epoch: compile, caches, page cache
        with _arm_switches(name):
            epoch(loader, 0)
    later = Rounds()
    for number in range(args.rounds):
        names = list(kept)
        for name in names[number % len(names) :] + names[: number % len(names)]:
            with _arm_switches(name):
                run_ = epoch(kept[name], number + 1)
            later.add(name, run_)
            print(f"later {number} {name}: {run_}")
    for loader in kept.values():
        if hasattr(loader, "close"):
            loader.close()

    ratios: dict[str, Any] = {}
    if ffcv:
        pairs = {
            "jpeg later": ("h5 jpeg auto", "ffcv jpeg RANDOM", later),
            "jpeg later, h5pack in-process": ("h5 jpeg in-process", "ffcv jpeg RANDOM", later),
            "jpeg later vs QUASI_RANDOM": ("h5 jpeg auto", "ffcv jpeg QUASI_RANDOM", later),
            "jpeg cache later": ("h5 jpeg cache", "ffcv jpeg RANDOM", later),
            "jpeg later, h5pack in-process, whole decodes": (
                "h5 jpeg in-process, whole decodes",
                "ffcv jpeg RANDOM",
                later,
            ),
            "raw later": ("h5 raw auto", "ffcv raw RANDOM", later),
            "raw later, h5pack in-process": ("h5 raw in-process", "ffcv raw RANDOM", later),
        }
        if not args.no_first:
            pairs |= {
                "jpeg first (FFCV compile in)": ("h5 jpeg auto", "ffcv jpeg RANDOM", first),
                "raw first (FFCV compile in)": ("h5 raw auto", "ffcv raw RANDOM", first),
            }
        for label, (top, bottom, rounds) in pairs.items():
            if top not in rounds.runs or bottom not in rounds.runs:
                continue
            ratios[label] = {
                "per_cpu_s": rounds.ratio(top, bottom, cpu=True),
                "per_s": rounds.ratio(top, bottom),
            }
        if not args.no_first:
            for kind in ("jpeg", "raw"):
                # h5pack's whole first epoch against FFCV's from the end of its first batch
                tops = first.values(f"h5 {kind} auto", cpu=True)
                bottoms = first_rest.values(f"ffcv {kind} RANDOM", cpu=True)
                ratios[f"{kind} first, FFCV compile taken out"] = {
                    "per_cpu_s": statistics.median(
                        a / b for a, b in zip(tops, bottoms, strict=True)
                    ),
                    "per_s": statistics.median(
                        a / b
                        for a, b in zip(
                            first.values(f"h5 {kind} auto"),
                            first_rest.values(f"ffcv {kind} RANDOM"),
                            strict=True,
                        )
                    ),
                }

    def ratio(top: str, bottom: str) -> dict[str, float]:
        return {"per_cpu_s": later.ratio(top, bottom, cpu=True), "per_s": later.ratio(top, bottom)}

    if "h5 raw auto, torch enlarges" in later.runs:
        ratios["raw later, OpenCV enlarging / torch only"] = ratio(
            "h5 raw auto", "h5 raw auto, torch enlarges"
        )
        if ffcv:
            ratios["raw later, torch enlarges (before)"] = ratio(
                "h5 raw auto, torch enlarges", "ffcv raw RANDOM"
            )
    if "h5 jpeg in-process, whole decodes" in later.runs:
        ratios["jpeg later, box decodes / whole decodes (h5pack in-process)"] = ratio(
            "h5 jpeg in-process", "h5 jpeg in-process, whole decodes"
        )

    def table(rounds: Rounds) -> dict[str, Any]:
        return {
            name: {
                "images_per_s": rounds.median(name),
                "images_per_cpu_s": rounds.median(name, cpu=True),
                "us_cpu_per_image": 1e6 / rounds.median(name, cpu=True),
                "rounds": len(rounds.runs[name]),
            }
            for name in rounds.runs
        }

    return {
        "machine_start": started,
        "machine_end": asdict(machine_info()),
        "photos": str(bench_photos.PHOTOS),
        "images": args.images,
        "conversion": conversion,
        "first": table(first) if first.runs else {},
        "first_after_first_batch": table(first_rest) if first_rest.runs else {},
        "later": table(later),
        "ratios": ratios,
        "numpy": np.__version__,
    }


if __name__ == "__main__":
    main()
