"""Loader throughput: h5pack's loader against naive h5py access, a Pillow pipeline and the limit.

Builds (once, cached in --workdir) a folder of natural-looking 256x256 JPEGs with
``h5pack.synthetic`` and one raw chunked pack per codec with ``h5pack.write.convert.convert``, then
measures images/s of:

- ``h5pack``: ``make_loader`` (ChunkBatchSampler + H5ImageDataset), 0 and 2 workers and
  ``"auto"``, a fresh loader per repeat, one whole epoch timed;
- (a) ``naive``: per-sample random access with h5py's default chunk cache, on a random
  subsample (it is slow on compressed packs: every sample decompresses a whole chunk);
- (b) ``pillow``: an ImageFolder-style pipeline over the source JPEGs producing the same
  (B, 3, 256, 256) uint8 batches, 0 and 2 workers, on a subsample;
- (c) ``sequential``: one read and decompression of the whole pack, chunk by chunk, in
  pack order: the limit of the storage and codec on one core.

and the shuffle quality (jump entropy, h5pack.training.shuffle_quality) of random, chunk-aware and
sequential orders. Prints a Markdown report; ``--json`` also writes the numbers.

    python scripts/bench_loader.py --images 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from h5pack.core import format as fmt
from h5pack.core.layout import ChunkMap, Compression
from h5pack.core.machine import available_cores
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.dataset import H5ImageDataset
from h5pack.training.loader import auto_workers, make_loader
from h5pack.training.sampler import EpochSpec, plan_epoch
from h5pack.training.shuffle_quality import jump_entropy
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None


CODECS = ("none", "gzip", "lzf", "lz4", "zstd", "blosc-lz4", "blosc-zstd")


def timed_rate(run: Callable[[], int]) -> float:
    """Return the images/s of one call of ``run`` (which returns the images it did)."""
    start = time.perf_counter()
    done = run()
    return done / (time.perf_counter() - start)


def rounds(measures: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run every measure once per round, ``repeats`` rounds after a warm-up round.

    Interleaving the measures round by round means that a burst of load from elsewhere
    hits all of them alike, and ratios are taken within a round.
    """
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for round_index in range(repeats + 1):
        for name, measure in measures.items():
            value = measure()
            if round_index:  # round 0 warms the page cache
                samples[name].append(value)
    return samples


def build(
    workdir: Path, num_images: int, size: int, chunk_samples: int, codecs: list[str]
) -> dict[str, Path]:
    folder = workdir / f"jpeg-{num_images}-{size}"
    if not (folder / ".done").exists():
        spec = SampleSpec(num_images=num_images, num_classes=10, size=(size, size), seed=0)
        make_image_folder(folder, spec, photos=PHOTOS, workers=available_cores(), overwrite=True)
        (folder / ".done").touch()
    packs = {}
    for codec in codecs:
        pack = workdir / f"pack-{num_images}-{size}-{chunk_samples}-{codec}.h5"
        if not pack.exists():
            options = ConvertOptions(
                mode="raw", chunk_samples=chunk_samples, compression=Compression(codec=codec)
            )
            convert(folder, pack, options)
        packs[codec] = pack
    packs["_folder"] = folder
    return packs


def epoch_rate(loader: Any) -> float:
    """Images/s of one whole epoch of a fresh loader, from ``iter()`` to the last batch.

    Everything is inside the clock: forking workers (cheap with fork) and every chunk's
    read and decompression, the first window's included. A fresh loader per epoch means
    that no window of decompressed chunks carries over from an earlier epoch.
    """
    start = time.perf_counter()
    done = sum(len(batch[1]) for batch in loader)
    return done / (time.perf_counter() - start)


def bench_h5pack(pack: Path, batch_size: int, workers: int | str, seed: int) -> float:
    """One epoch of a fresh ``make_loader`` loader.

    In the main process the pack is opened before the clock starts (a one-time cost of a
    training run, large next to a 0.1 s epoch); workers open it inside the clock.
    """
    loader = make_loader(pack, batch_size, num_workers=workers, seed=seed)  # type: ignore[arg-type]
    if loader.num_workers == 0:
        _ = loader.dataset.reader
    return epoch_rate(loader)


def bench_naive(pack: Path, samples: int, budget_s: float, seed: int) -> float:
    """Per-sample random access, h5py's default chunk cache (1 MiB), one read per sample."""
    rng = np.random.default_rng(seed)

    def run() -> int:
        with h5py.File(pack, "r") as f:
            images = f[fmt.IMAGES]
            order = rng.permutation(images.shape[0])[:samples]
            start, done = time.perf_counter(), 0
            for i in order:
                _ = torch.from_numpy(images[int(i)]).permute(2, 0, 1)
                done += 1
                if time.perf_counter() - start > budget_s:
                    break
            return done

    return timed_rate(run)


def bench_sequential(pack: Path) -> float:
    """(c) Read and decompress every chunk once, in order, with h5py (no cache needed)."""

    def run() -> int:
        with h5py.File(pack, "r", rdcc_nbytes=0) as f:
            images = f[fmt.IMAGES]
            step = images.chunks[0]
            out = np.empty((step, *images.shape[1:]), dtype=np.uint8)
            n = images.shape[0]
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                images.read_direct(out, np.s_[lo:hi], np.s_[0 : hi - lo])
            return int(n)

    return timed_rate(run)


def bench_sequential_direct(pack: Path) -> float:
    """(c') The same through h5pack's direct chunk path, one thread."""

    def run() -> int:
        with PackReader(pack, ReaderOptions(window_chunks=1)) as reader:
            cmap = reader.chunk_map
            for chunk in range(cmap.num_chunks):
                reader._groups(np.array([chunk]))
            return cmap.num_samples

    return timed_rate(run)


class PillowFolder(Dataset[tuple[torch.Tensor, int]]):
    """ImageFolder-style: open, decode, convert to RGB, CHW uint8 tensor."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[index]) as image:
            array = np.array(image.convert("RGB"))
        return torch.from_numpy(array).permute(2, 0, 1), index % 10


def bench_pillow(files: list[Path], batch_size: int, workers: int, seed: int) -> float:
    """One epoch of an ImageFolder-style Pillow pipeline over ``files``."""
    loader = DataLoader(
        PillowFolder(files),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
    )
    return epoch_rate(loader)


def shuffle_quality(
    num: int, chunk_samples: int, batch_size: int, window_chunks: int
) -> dict[str, float]:
    cmap = ChunkMap.regular(num, chunk_samples)
    spec = EpochSpec(batch_size=batch_size, window_chunks=window_chunks)
    chunk_aware = np.concatenate(plan_epoch(cmap, spec, epoch=0))
    return {
        "random": jump_entropy(np.random.default_rng(0).permutation(num)),
        f"chunk-aware (window {window_chunks} chunks)": jump_entropy(chunk_aware),
        "chunk-aware (window 1 chunk)": jump_entropy(
            np.concatenate(plan_epoch(cmap, replace(spec, window_chunks=1), epoch=0))
        ),
        "sequential": jump_entropy(np.arange(num)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--chunk-samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--workers", default="0,2,auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-samples", type=int, default=128)
    parser.add_argument("--naive-budget-s", type=float, default=4.0)
    parser.add_argument("--pillow-samples", type=int, default=256)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/h5pack-bench"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    codecs = [c for c in args.codecs.split(",") if c]
    worker_settings: list[int | str] = [
        w if w == "auto" else int(w) for w in args.workers.split(",") if w
    ]
    packs = build(args.workdir, args.images, args.size, args.chunk_samples, codecs)
    folder = packs.pop("_folder")
    files = sorted(folder.rglob("*.jpg"))
    files = [files[i] for i in np.random.default_rng(0).permutation(len(files))]
    files = files[: args.pillow_samples]
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "codecs": {}}
    results["cores"] = available_cores()
    results["load_before"] = os.getloadavg()
    seeds = itertools.count()
    for codec, pack in packs.items():
        measures: dict[str, Callable[[], float]] = {
            f"h5pack_{w}": functools.partial(
                lambda pack, w: bench_h5pack(pack, args.batch_size, w, next(seeds)), pack, w
            )
            for w in worker_settings
        }
        measures["naive"] = functools.partial(
            lambda pack: bench_naive(pack, args.naive_samples, args.naive_budget_s, next(seeds)),
            pack,
        )
        measures["sequential"] = functools.partial(bench_sequential, pack)
        measures["sequential_direct"] = functools.partial(bench_sequential_direct, pack)
        for w in (0, 2):
            measures[f"pillow_{w}"] = functools.partial(
                lambda w: bench_pillow(files, args.batch_size, w, next(seeds)), w
            )
        samples = rounds(measures, args.repeats)
        best = [
            max(v) for v in zip(*(samples[f"h5pack_{w}"] for w in worker_settings), strict=True)
        ]
        pillow = [max(a, b) for a, b in zip(samples["pillow_0"], samples["pillow_2"], strict=True)]
        row: dict[str, Any] = {
            "file_mb": pack.stat().st_size / 2**20,
            "auto": list(auto_workers(H5ImageDataset(pack))),
            "samples": samples,
            **{name: statistics.median(values) for name, values in samples.items()},
            "best_over_naive": statistics.median(
                b / n for b, n in zip(best, samples["naive"], strict=True)
            ),
            "best_over_sequential": statistics.median(
                b / q for b, q in zip(best, samples["sequential"], strict=True)
            ),
            "best_over_pillow": statistics.median(b / p for b, p in zip(best, pillow, strict=True)),
        }
        results["codecs"][codec] = row
        brief = {
            k: round(v) if isinstance(v, float) else v for k, v in row.items() if k != "samples"
        }
        print(f"{codec}: {json.dumps(brief)}", file=sys.stderr, flush=True)
    results["load_after"] = os.getloadavg()
    window = max(1, (256 * 2**20) // (args.chunk_samples * args.size * args.size * 3))
    results["quality"] = shuffle_quality(args.images, args.chunk_samples, args.batch_size, window)

    print(
        f"# Loader benchmark ({args.images} images {args.size}x{args.size}, "
        f"{args.chunk_samples} samples/chunk, batch {args.batch_size}, "
        f"{results['cores']} cores, medians of {args.repeats})\n"
    )
    heads = [f"h5pack w={w}" for w in worker_settings]
    print(
        "| codec | MiB | auto (workers, threads) | "
        + " | ".join(heads)
        + " | (a) naive | (c) sequential | (c) direct | (b) Pillow w=0 | (b) Pillow w=2"
        + " | best/(a) | best/(c) | best/(b) |"
    )
    print("|" + "---|" * (len(heads) + 11))
    for codec, row in results["codecs"].items():
        print(
            f"| {codec} | {row['file_mb']:.0f} | {tuple(row['auto'])} | "
            + " | ".join(f"{row[f'h5pack_{w}']:,.0f}" for w in worker_settings)
            + f" | {row['naive']:,.0f} | {row['sequential']:,.0f} | "
            f"{row['sequential_direct']:,.0f} | {row['pillow_0']:,.0f} | {row['pillow_2']:,.0f} | "
            f"{row['best_over_naive']:.0f}x | {row['best_over_sequential']:.0%} | "
            f"{row['best_over_pillow']:.1f}x |"
        )
    print(
        "\nRates are medians of the rounds; ratios are medians of per-round ratios of the best "
        "h5pack setting. Load average before/after: "
        f"{results['load_before'][0]:.1f} / {results['load_after'][0]:.1f}\n"
    )
    print("| order | jump entropy (bits) |\n|---|---|")
    for name, value in results["quality"].items():
        print(f"| {name} | {value:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
