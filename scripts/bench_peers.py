"""h5pack against its peers on the same images, side by side in one run.

    python scripts/bench_peers.py [--images 1000] [--size 256] [--workers 2]
                                  [--batch-size 64] [--repeats 3] [--json peers.json]

Every peer delivers the same thing: uint8 (B, 3, H, W) tensors of the same generated
photo-like images (JPEG files of exactly H x W, so nobody resizes) and int64 labels, in a
shuffled order, through a DataLoader with the same number of workers. Each peer runs one
warm-up epoch, then ``--repeats`` timed epochs; the table gives medians, the spread
(fastest - slowest over the median) and the ratio to h5pack. Data preparation (packing,
sharding) is not timed.

Peers: h5pack (``make_loader``, raw pack, default chunks), the same with
``num_workers="auto"``, an ImageFolder-style Pillow Dataset, naive h5py per-sample reads
of the same pack, WebDataset tar shards with a shuffle buffer, and LitData and MosaicML
Streaming when they import. Plain ``pip install litdata`` or ``mosaicml-streaming``
replaces torch (their torchvision requirement pulls a newer torch); see BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from h5pack.bench.loading import run_epoch
from h5pack.bench.system import machine_info, warm_page_cache
from h5pack.bench.timing import Timing, time_repeats
from h5pack.core import format as fmt
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.loader import make_loader
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None


def to_chw(hwc: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 array -> contiguous (3, H, W) uint8 tensor."""
    return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))


def decode_jpeg(data: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as image:
        return to_chw(np.asarray(image.convert("RGB")))


class ImageFolderDataset(Dataset[tuple[torch.Tensor, int]]):
    """torchvision's ImageFolder pattern without torchvision: one file per sample."""

    def __init__(self, root: Path) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [
            (path, label)
            for label, name in enumerate(classes)
            for path in sorted((root / name).iterdir())
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as image:
            return to_chw(np.asarray(image.convert("RGB"))), label


class NaiveH5Dataset(Dataset[tuple[torch.Tensor, int]]):
    """One h5py read per sample, h5py's default chunk cache, file opened per worker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with h5py.File(path, "r") as handle:
            self.labels = handle[fmt.LABELS][()]
        self._handle: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._pid != os.getpid():
            import hdf5plugin  # noqa: F401

            self._handle, self._pid = h5py.File(self.path, "r"), os.getpid()
        return to_chw(self._handle[fmt.IMAGES][index]), int(self.labels[index])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None, "_pid": -1}


def jpeg_samples(root: Path) -> list[tuple[bytes, int]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [
        (path.read_bytes(), label)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
    ]


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


def wds_tuple(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    return decode_jpeg(sample["jpg"]), int(sample["cls"])


def stack(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([b[0] for b in batch])
    return images, torch.as_tensor([b[1] for b in batch], dtype=torch.int64)


def litdata_item(index: int, samples: list[tuple[bytes, int]]) -> dict[str, Any]:
    data, label = samples[index]
    return {"jpg": data, "cls": label}


class LitDecode:
    """LitData transform: the stored item -> (uint8 CHW tensor, label)."""

    def __call__(self, item: dict[str, Any]) -> tuple[torch.Tensor, int]:
        """Decode one item."""
        return decode_jpeg(item["jpg"]), int(item["cls"])


def peers(
    args: argparse.Namespace, work: Path, folder: Path, pack: Path
) -> dict[str, Callable[[], Iterable[Any] | str]]:
    """Return a factory per peer: a loader over one epoch's worth, or why it is skipped."""
    workers, batch = args.workers, args.batch_size
    persistent = {"persistent_workers": True} if workers else {}
    found: dict[str, Callable[[], Iterable[Any] | str]] = {}
    found[f"h5pack (workers={workers})"] = lambda: make_loader(
        pack, batch, shuffle=True, num_workers=workers, seed=0
    )
    found["h5pack (workers=auto)"] = lambda: make_loader(pack, batch, shuffle=True, seed=0)
    found["ImageFolder + Pillow"] = lambda: DataLoader(
        ImageFolderDataset(folder), batch, shuffle=True, num_workers=workers, **persistent
    )
    found["h5py per-sample (naive)"] = lambda: DataLoader(
        NaiveH5Dataset(pack), batch, shuffle=True, num_workers=workers, **persistent
    )
    samples = jpeg_samples(folder)

    def webdataset() -> Iterable[Any] | str:
        try:
            import webdataset as wds
        except ImportError as err:
            return f"skipped: webdataset does not import ({err}); pip install webdataset"
        urls = write_shards(samples, work / "wds", per_shard=max(1, len(samples) // 8))
        dataset = (
            wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
            .shuffle(args.shuffle_buffer)
            .map(wds_tuple)
            .batched(batch, collation_fn=stack, partial=True)
        )
        return wds.WebLoader(dataset, batch_size=None, num_workers=workers, **persistent)

    def litdata() -> Iterable[Any] | str:
        try:
            import litdata as ld
        except Exception as err:  # an ImportError, or a broken torchvision it pulls in
            return f"skipped: litdata does not import here ({type(err).__name__}: {err})"
        from functools import partial

        out = work / "litdata"
        ld.optimize(
            fn=partial(litdata_item, samples=samples),
            inputs=list(range(len(samples))),
            output_dir=str(out),
            chunk_bytes="8MB",
            num_workers=1,
        )
        dataset = ld.StreamingDataset(str(out), shuffle=True, transform=LitDecode())
        return ld.StreamingDataLoader(
            dataset, batch_size=batch, num_workers=workers, collate_fn=stack, **persistent
        )

    def mosaic() -> Iterable[Any] | str:
        try:
            from streaming import MDSWriter, StreamingDataset
        except Exception as err:
            return f"skipped: mosaicml-streaming does not import here ({type(err).__name__}: {err})"
        out = work / "mds"
        with MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"}) as writer:
            for data, label in samples:
                writer.write({"jpg": data, "cls": label})

        class Decoded(StreamingDataset):  # type: ignore[misc]
            def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
                item = super().__getitem__(index)
                return decode_jpeg(item["jpg"]), int(item["cls"])

        dataset = Decoded(local=str(out), shuffle=True, batch_size=batch)
        return DataLoader(dataset, batch, num_workers=workers, collate_fn=stack, **persistent)

    found["WebDataset (tar shards, shuffle buffer)"] = webdataset
    found["LitData"] = litdata
    found["MosaicML Streaming"] = mosaic
    return found


def check_batch(loader: Iterable[Any], size: int) -> str | None:
    images, labels = next(iter(loader))[:2]
    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, size, size):
        return f"delivers {tuple(images.shape)} {images.dtype}, not uint8 (B, 3, {size}, {size})"
    if labels.dtype != torch.int64:
        return f"labels are {labels.dtype}, not int64"
    return None


def measure(loader: Iterable[Any], repeats: int) -> Timing:
    return time_repeats(lambda: run_epoch(loader), repeats=repeats, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shuffle-buffer", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=None, help="Keep the data here.")
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    args = parser.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="h5pack-peers-"))
    folder, pack = work / "images", work / "h5pack.h5"
    if not folder.exists():
        spec = SampleSpec(num_images=args.images, num_classes=10, size=(args.size, args.size))
        make_image_folder(folder, spec, photos=PHOTOS, workers=os.cpu_count() or 1)
    if not pack.exists():
        convert(folder, pack, ConvertOptions(mode="raw", size=(args.size, args.size)))
    print(f"data: {args.images} JPEGs of {args.size}x{args.size} in {folder}", file=sys.stderr)
    print(f"machine: {machine_info(work).describe()}", file=sys.stderr)

    rows: list[dict[str, Any]] = []
    for name, make in peers(args, work, folder, pack).items():
        print(f"running {name}", file=sys.stderr)
        loader = make()
        if isinstance(loader, str):
            rows.append({"peer": name, "note": loader})
            continue
        problem = check_batch(loader, args.size)
        if problem:
            rows.append({"peer": name, "note": f"skipped: {problem}"})
            continue
        warm_page_cache(pack)
        timing = measure(loader, args.repeats)
        rows.append({"peer": name, "timing": timing, "images": max(timing.images)})
        del loader

    reference = next(r["timing"].images_per_s for r in rows if "timing" in r)
    print(f"\n{'peer':40s} {'images/s':>10s} {'spread':>7s} {'MB/s':>7s} {'x h5pack':>9s}")
    for row in rows:
        if "timing" not in row:
            print(f"{row['peer']:40s} {row['note']}")
            continue
        timing = row["timing"]
        print(
            f"{row['peer']:40s} {timing.images_per_s:10,.0f} {50 * timing.spread:6.0f}% "
            f"{timing.mb_per_s:7,.0f} {timing.images_per_s / reference:9.2f}"
        )
    if args.json:
        data = [
            {
                "peer": r["peer"],
                "note": r.get("note"),
                "images_per_s": r["timing"].images_per_s if "timing" in r else None,
                "spread": r["timing"].spread if "timing" in r else None,
                "ratio_to_h5pack": r["timing"].images_per_s / reference if "timing" in r else None,
                "elapsed_s": list(r["timing"].elapsed_s) if "timing" in r else None,
            }
            for r in rows
        ]
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"work": str(work), "json": str(args.json)}, "results": data},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
