"""The GPU check: run on a CUDA machine, in one go, within a few minutes.

1. The `gpu` tests (pinned batches reach the device, the side-stream prefetcher).
2. A pack of generated photos at 224x224 read by `make_loader` (pinned memory) through
   `DevicePrefetcher` into a small convolutional network for a few hundred steps:
   images/s reaching the GPU with and without the prefetcher, and that the batches that
   arrive on the device equal the ones read on the CPU.
3. The training image pipeline on a folder of mixed sizes (the common case): an encoded
   pack read with `size=224`, random-resized crops, flips and the decoded cache, uint8
   batches normalised on the device (`DevicePrefetcher(normalize=...)`): the normalised
   device batches equal the CPU's normalisation of the same uint8 batches, and images/s of
   the first epoch and of a cached one.
4. The stall report (issue 19 item 4) on the device: the same encoded pack, uncached, through
   ``DevicePrefetcher`` into a step that is compute-bound (the GPU spins ~0.2 s per batch,
   ``torch.cuda._sleep``; ``time.sleep`` on the CPU dry run) and into one that is
   loader-bound (read in the main process, the step nothing but a copy):
   ``prefetcher.stats()`` must say ~0% waiting and "compute" for the first and most of the
   step waiting with a loader bottleneck for the second, and time the copies to the device
   from CUDA events (the "transfer" stage).

Usage::

    python scripts/gpu_check.py --out gpu-report.json            # on a CUDA machine
    python scripts/gpu_check.py --device cpu --images 128        # a dry run anywhere

Writes the figures as JSON (and prints them); exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from h5pack import make_loader
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.prefetch import DevicePrefetcher
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None


def small_net(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def train_epoch(loader: Any, device: torch.device, model: nn.Module, *, prefetch: bool) -> float:
    """Train one epoch; return images/s reaching the model."""
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = DevicePrefetcher(loader, device) if prefetch else loader
    seen = 0
    start = time.perf_counter()
    for images, labels in batches:
        if not prefetch:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        x = images.float().div_(255)
        loss = nn.functional.cross_entropy(model(x), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        seen += images.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


IMAGENET_NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def mixed_sizes(
    args: argparse.Namespace,
    device: torch.device,
    report: dict[str, Any],
    failures: list[str],
    tmp: Path,
) -> None:
    """Section 3: mixed-size photos through the training image pipeline to the device."""
    folder = tmp / "mixed"
    spec = SampleSpec(num_images=args.images, num_classes=10, size=(375, 500), size_jitter=0.3)
    make_image_folder(folder, spec, photos=PHOTOS, workers=2)
    pack = tmp / "mixed.h5"
    convert(folder, pack, ConvertOptions())  # auto: encoded, the sizes differ
    args.mixed_pack = pack  # section 4 reads it too
    with make_loader(pack, args.batch_size, size=224, flip=True, cache="decoded", seed=0) as loader:
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in IMAGENET_NORMALIZE)
        loader.set_epoch(0)
        cpu = [x.clone() for x, _ in loader]
        loader.set_epoch(0)
        prefetcher = DevicePrefetcher(loader, device, normalize=IMAGENET_NORMALIZE)
        for x_cpu, (x_dev, _) in zip(cpu, prefetcher, strict=True):
            want = (x_cpu.float() / 255 - mean) / std
            if x_dev.dtype != torch.float32 or not torch.allclose(x_dev.cpu(), want, atol=1e-5):
                failures.append("a normalised device batch differs from the CPU's")
                break
        rates = []
        for epoch in (1, 2):  # epoch 0 filled the cache; 1 and 2 read from it
            loader.set_epoch(epoch)
            start = time.perf_counter()
            seen = sum(x.shape[0] for x, _ in DevicePrefetcher(loader, device))
            if device.type == "cuda":
                torch.cuda.synchronize()
            rates.append(round(seen / (time.perf_counter() - start), 1))
        stats = loader.cache.stats() if loader.cache is not None else None
        report["mixed_sizes"] = {
            "images": args.images,
            "cached_epochs_images_per_s": rates,
            "cache_entries": stats.entries if stats else 0,
            "cache_hits": stats.hits if stats else 0,
        }


def stall_report(
    args: argparse.Namespace, device: torch.device, report: dict[str, Any], failures: list[str]
) -> None:
    """Section 4: ``DevicePrefetcher.stats()`` on a compute-bound and a loader-bound step."""
    pack = args.mixed_pack
    batches = max(3, min(12, args.images // args.batch_size))
    found: dict[str, Any] = {}
    for kind in ("compute-bound", "loader-bound"):
        # loader-bound: read in the main process, so that no worker has batches ready
        workers: Any = "auto" if kind == "compute-bound" else 0
        with make_loader(
            pack, args.batch_size, size=224, flip=True, seed=0, num_workers=workers
        ) as loader:
            prefetcher = DevicePrefetcher(loader, device)
            lines: list[str] = []
            prefetcher.report_every(max(1, batches // 2), lines.append)
            for step, (images, _) in enumerate(prefetcher):
                if kind == "compute-bound":
                    if device.type == "cuda":
                        torch.cuda._sleep(400_000_000)  # type: ignore[attr-defined]
                        torch.cuda.synchronize()
                    else:
                        time.sleep(0.5)
                else:
                    del images  # nothing but the copy to the device
                if step == 1:  # from the third batch: the workers have started
                    prefetcher.reset_stats()
                if step + 1 >= batches:
                    break
            stats = prefetcher.stats()
        found[kind] = {
            "wait_share": round(stats.wait_share, 3),
            "bottleneck": stats.bottleneck,
            "dominant": stats.dominant,
            "stage_ms_per_image": {
                k: round(1e3 * v / max(1, stats.images), 3) for k, v in stats.stage_s.items()
            },
            "loader_images_per_s": round(stats.loader_images_per_s, 1),
            "line": stats.line(),
            "logged": lines,
        }
    report["stall_report"] = found
    if found["compute-bound"]["bottleneck"] != "compute":
        failures.append("the stall report missed a compute-bound step")
    bound = found["loader-bound"]
    if bound["wait_share"] < 0.5 or bound["bottleneck"] == "compute":
        failures.append("the stall report missed a loader-bound step")
    if device.type == "cuda" and found["loader-bound"]["stage_ms_per_image"]["transfer"] <= 0:
        failures.append("no transfer time was read from the CUDA events")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: run with --device cpu for a dry run", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    failures: list[str] = []

    if not args.skip_tests and device.type == "cuda":
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests"], check=False
        )
        report["gpu_tests_rc"] = tests.returncode
        if tests.returncode != 0:
            failures.append("gpu tests failed")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "images"
        make_image_folder(
            folder,
            SampleSpec(num_images=args.images, num_classes=10, size=(224, 224)),
            photos=PHOTOS,
            workers=2,
        )
        pack = Path(tmp) / "train.h5"
        convert(folder, pack, ConvertOptions())
        loader = make_loader(pack, args.batch_size, seed=0)
        report["pin_memory"] = loader.pin_memory

        # The batches that arrive on the device are the ones read on the CPU.
        loader.set_epoch(0)
        cpu_batches = [(x.clone(), y.clone()) for x, y in loader]
        loader.set_epoch(0)
        for (x_cpu, y_cpu), (x_dev, y_dev) in zip(
            cpu_batches, DevicePrefetcher(loader, device), strict=True
        ):
            if x_dev.device.type != device.type or not torch.equal(x_dev.cpu(), x_cpu):
                failures.append("a prefetched batch differs from the CPU batch")
                break
            if not torch.equal(y_dev.cpu(), y_cpu):
                failures.append("prefetched labels differ")
                break

        torch.manual_seed(0)
        model = small_net(10).to(device)
        for epoch, prefetch in enumerate((False, True, False, True)):
            loader.set_epoch(epoch)
            rate = train_epoch(loader, device, model, prefetch=prefetch)
            report.setdefault("train_images_per_s", []).append(
                {"prefetch": prefetch, "images_per_s": round(rate, 1)}
            )
        mixed_sizes(args, device, report, failures, Path(tmp))
        stall_report(args, device, report, failures)
    report["failures"] = failures
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
