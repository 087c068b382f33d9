"""Loader throughput: h5pack's loader against naive h5py access, a Pillow pipeline and the limit.

Builds (once, cached in --workdir) a folder of natural-looking 256x256 JPEGs with
``h5pack.sample`` and one raw chunked pack per codec with ``h5pack.writer.convert``, then
measures images/s of:

- ``h5pack``: ``make_loader`` (ChunkBatchSampler + H5ImageDataset), 0 and 2 workers and
  ``"auto"``, a fresh loader per repeat, one whole epoch timed;
- (a) ``naive``: per-sample random access with h5py's default chunk cache, on a random
  subsample (it is slow on compressed packs: every sample decompresses a whole chunk);
- (b) ``pillow``: an ImageFolder-style pipeline over the source JPEGs producing the same
  (B, 3, 256, 256) uint8 batches, 0 and 2 workers, on a subsample;
- (c) ``sequential``: one read and decompression of the whole pack, chunk by chunk, in
  pack order: the limit of the storage and codec on one core.

and the shuffle quality (jump entropy, h5pack.quality) of random, chunk-aware and
sequential orders. Prints a Markdown report; ``--json`` also writes the numbers.

    python scripts/bench_loader.py --images 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from h5pack import format as fmt
from h5pack.layout import ChunkMap, Compression
from h5pack.loader import auto_workers, available_cores, make_loader
from h5pack.options import ConvertOptions
from h5pack.quality import jump_entropy
from h5pack.reader import PackReader
from h5pack.sample import SampleSpec, make_image_folder
from h5pack.sampler import plan_epoch
from h5pack.writer import convert

CODECS = ("none", "gzip", "lzf", "lz4", "zstd", "blosc-lz4", "blosc-zstd")


def median_rate(run: Callable[[], int], repeats: int) -> float:
    """Return the median images/s of ``repeats`` runs of ``run`` (which returns images done)."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = run()
        rates.append(done / (time.perf_counter() - start))
    return statistics.median(rates)


def build(
    workdir: Path, num_images: int, size: int, chunk_samples: int, codecs: list[str]
) -> dict[str, Path]:
    folder = workdir / f"jpeg-{num_images}-{size}"
    if not (folder / ".done").exists():
        spec = SampleSpec(num_images=num_images, num_classes=10, size=(size, size), seed=0)
        make_image_folder(folder, spec, workers=available_cores(), overwrite=True)
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


def bench_h5pack(pack: Path, batch_size: int, workers: int | str, repeats: int) -> float:
    """Median over ``repeats`` fresh loaders (the first, warming the page cache, is dropped)."""
    rates = [
        epoch_rate(make_loader(pack, batch_size, num_workers=workers, seed=r))  # type: ignore[arg-type]
        for r in range(repeats + 1)
    ]
    return statistics.median(rates[1:])


def bench_naive(pack: Path, samples: int, repeats: int, budget_s: float) -> float:
    """Per-sample random access, h5py's default chunk cache (1 MiB), one read per sample."""
    rng = np.random.default_rng(0)

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

    return median_rate(run, repeats)


def bench_sequential(pack: Path, repeats: int) -> float:
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

    return median_rate(run, repeats)


def bench_sequential_direct(pack: Path, repeats: int) -> float:
    """(c') The same through h5pack's direct chunk path, one thread."""

    def run() -> int:
        with PackReader(pack, window_chunks=1) as reader:
            cmap = reader.chunk_map
            for chunk in range(cmap.num_chunks):
                reader._groups(np.array([chunk]))
            return cmap.num_samples

    return median_rate(run, repeats)


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


def bench_pillow(folder: Path, samples: int, batch_size: int, workers: int, repeats: int) -> float:
    files = sorted(p for p in folder.rglob("*.jpg"))
    files = [files[i] for i in np.random.default_rng(0).permutation(len(files))[:samples]]
    rates = []
    for repeat in range(repeats + 1):
        loader = DataLoader(
            PillowFolder(files),
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(repeat),
        )
        rates.append(epoch_rate(loader))
    return statistics.median(rates[1:])


def shuffle_quality(
    num: int, chunk_samples: int, batch_size: int, window_chunks: int
) -> dict[str, float]:
    cmap = ChunkMap.regular(num, chunk_samples)
    chunk_aware = np.concatenate(plan_epoch(cmap, batch_size, epoch=0, window_chunks=window_chunks))
    return {
        "random": jump_entropy(np.random.default_rng(0).permutation(num)),
        f"chunk-aware (window {window_chunks} chunks)": jump_entropy(chunk_aware),
        "chunk-aware (window 1 chunk)": jump_entropy(
            np.concatenate(plan_epoch(cmap, batch_size, epoch=0, window_chunks=1))
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
    parser.add_argument("--pillow-samples", type=int, default=512)
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
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "codecs": {}}
    results["cores"] = available_cores()
    pillow = {
        w: bench_pillow(folder, args.pillow_samples, args.batch_size, w, args.repeats)
        for w in (0, 2)
    }
    results["pillow"] = pillow
    for codec, pack in packs.items():
        row: dict[str, Any] = {"file_mb": pack.stat().st_size / 2**20}
        from h5pack.dataset import H5ImageDataset

        row["auto"] = list(auto_workers(H5ImageDataset(pack)))
        for w in worker_settings:
            row[f"h5pack_{w}"] = bench_h5pack(pack, args.batch_size, w, args.repeats)
        row["naive"] = bench_naive(pack, args.naive_samples, args.repeats, args.naive_budget_s)
        row["sequential"] = bench_sequential(pack, args.repeats)
        row["sequential_direct"] = bench_sequential_direct(pack, args.repeats)
        results["codecs"][codec] = row
        print(f"{codec}: {json.dumps(row)}", file=sys.stderr, flush=True)
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
        + " | (a) naive | (c) sequential | (c) direct | best/(a) | best/(c) | best/(b) |"
    )
    print("|" + "---|" * (len(heads) + 9))
    best_pillow = max(pillow.values())
    for codec, row in results["codecs"].items():
        rates = [row[f"h5pack_{w}"] for w in worker_settings]
        best = max(rates)
        limit = row["sequential"]
        print(
            f"| {codec} | {row['file_mb']:.0f} | {tuple(row['auto'])} | "
            + " | ".join(f"{r:,.0f}" for r in rates)
            + f" | {row['naive']:,.0f} | {limit:,.0f} | {row['sequential_direct']:,.0f} | "
            f"{best / row['naive']:.0f}x | {best / limit:.0%} | {best / best_pillow:.0f}x |"
        )
    print(
        f"\n(b) Pillow ImageFolder pipeline: 0 workers {pillow[0]:,.0f}/s, "
        f"2 workers {pillow[2]:,.0f}/s\n"
    )
    print("| order | jump entropy (bits) |\n|---|---|")
    for name, value in results["quality"].items():
        print(f"| {name} | {value:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
