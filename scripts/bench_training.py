"""Training equivalence (issue 12): does the chunk-aware order train like a full shuffle?

A small real classification task: 32x32 crops of five photographs of the project's photo
folder (one class per photograph; training crops from the left 70% of each photo, test crops
from the right 30%, with random scale, grey-scale, contrast, brightness and noise, and a
random horizontal flip per (seed, epoch, crop)), packed with h5pack into gzip packs of
``--chunk-samples``-sample chunks: once shuffled at write time (``write_arrays``'s default,
the "mixed" pack) and once in class order (``shuffle_samples=False``, the "unmixed" pack).
A small CNN (three conv + batch-norm blocks) is trained on the CPU with SGD + momentum and a
one-cycle schedule, one thread per run, the runs spread over ``--processes`` processes.
Without the photo folder the five classes are ``h5pack.synthetic`` photographs.

Every seed trains every arm from the same initial weights on the same pixels and flips;
only the order of the samples differs. The comparison is paired: per seed, an arm's test
accuracy minus its reference's (a full shuffle with the same batch size). Arms:

- ``full``: ``torch.utils.data.RandomSampler`` over the pack's ``H5ImageDataset``, batched;
  ``full-b``: the same with another shuffle stream (the noise of a paired comparison).
- ``default``: the batches of ``make_loader(pack, batch_size, num_workers=0, seed=seed)``,
  i.e. the sampler's defaults on this pack.
- ``large-default``: the sampler's defaults as they are on a large pack, emulated by giving
  it the chunks with a large pack's chunk size (64 MiB: the bytes floor is 4 chunks, see
  the sampler's note "Shuffle window"), so the window is the pool floor,
  ``MIN_POOL_BATCHES`` batches; ``large-default-w8``: chunks of 8 MiB read by 8 workers
  (each worker's window is the pool floor, or its share of this small pack).
- ``large``: the old defaults on a large pack: ``ChunkBatchSampler(window_chunks=2)``, a
  pool of ``2 x chunk_samples / batch_size`` batches (4 here, as the issue measured);
  ``large-w8``: the same window per worker, the epoch planned for 8 DataLoader workers.
- ``tiny``: ``window_chunks=1``, a pool of 2 batches; ``tiny-x4``: batches 4x larger (and
  the learning rate 4x) against ``full-x4``, so a batch is two whole chunks: the pool of
  under one batch that the old defaults gave an ImageNet-style pack read by 8 workers.
- ``unmixed``: the class-ordered pack at the large pack's window (2 chunks).
- ``unmixed-default``: the class-ordered pack through ``sampler_for_labels`` (the defaults
  with the label-mixing check, which stratifies the chunk order and widens the window) as
  on a large pack (64 MiB chunks).
- ``mix-3to1``: the same crops as two packs, the first 3/4 and the last 1/4 (each shuffled
  at write time), read as ``make_loader([a, b], weights=[3, 1])``'s sampler (issue 18): a
  3:1 mix whose epoch holds every crop once, against the full shuffle of the same crops;
  ``mix-3to1-k2``: the same at the large pack's window (2 chunks).
- ``unmixed-k4``, ``-k8``, ``-k16``: the class-ordered pack at windows of 4, 8, 16 chunks;
  ``unmixed-s2`` ... ``-s16``: the same in the stratified chunk order: the calibration of
  ``mixing.MIXING_THRESHOLD`` (not run unless named in ``--arms``).

The pixels come from the pack (read once with ``PackReader``); the chunk-aware arms take
their batches from the sampler, and a check first makes sure that ``make_loader`` delivers
the labels its sampler's batches index.

Usage::

    python scripts/bench_training.py --seeds 8 --processes 2

Prints a markdown table: per arm, the window (chunks per worker, and the pool in batches),
the label mixing at that window, the accuracies and the paired differences.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import BatchSampler, RandomSampler

from h5pack import (
    ChunkBatchSampler,
    Compression,
    ConvertOptions,
    EpochSpec,
    H5ImageDataset,
    PackReader,
    load_meta,
    make_loader,
    write_arrays,
)
from h5pack.core.layout import ChunkMap, chunk_map_of
from h5pack.synthetic import synthesize_photo
from h5pack.training.mixing import chunk_strata, label_mixing
from h5pack.training.sampler import sampler_for_labels

# The project's real photographs, beside the checkout (see its README).
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
CLASSES = ("Dune", "Garden", "GreenMeadow", "Wood", "Storm")
TRAIN_REGION = (0.0, 0.7)  # the share of each photo's width the training crops come from
TEST_REGION = (0.7, 1.0)


@dataclass(frozen=True)
class Arm:
    """One way of ordering the training samples.

    ``order``: "full" (RandomSampler), "loader" (make_loader's sampler), "chunks"
    (ChunkBatchSampler with ``window_chunks``/``num_workers``), "labels"
    (sampler_for_labels) or "weighted" (a 3:1 mix of two packs). ``chunk_bytes``: the
    samplers see the pack's chunks as that large (``HeavyChunks``). ``stratified``: the
    chunk order stratified by the chunks' dominant labels (a mix: ``stratify``). ``scale``
    multiplies the batch size and the learning rate.
    """

    name: str
    order: str
    pack: str = "mixed"
    window_chunks: int | None = None
    num_workers: int = 0
    chunk_bytes: int | None = None
    stratified: bool = False
    scale: int = 1
    stream: int = 0
    reference: str = "full"


MIB = 2**20
ARMS = {
    arm.name: arm
    for arm in (
        Arm("full", "full"),
        Arm("full-b", "full", stream=1),
        Arm("default", "loader"),
        Arm("large-default", "chunks", chunk_bytes=64 * MIB),
        Arm("large-default-w8", "chunks", chunk_bytes=8 * MIB, num_workers=8),
        Arm("large", "chunks", window_chunks=2),
        Arm("large-w8", "chunks", window_chunks=2, num_workers=8),
        Arm("tiny", "chunks", window_chunks=1),
        Arm("full-x4", "full", scale=4, reference="full-x4"),
        Arm("tiny-x4", "chunks", window_chunks=1, scale=4, reference="full-x4"),
        Arm("unmixed", "chunks", pack="unmixed", window_chunks=2),
        Arm("mix-3to1", "weighted", pack="mix"),
        Arm("mix-3to1-k2", "weighted", pack="mix", window_chunks=2),
        Arm("unmixed-default", "labels", pack="unmixed", chunk_bytes=64 * MIB),
        Arm("unmixed-k4", "chunks", pack="unmixed", window_chunks=4),
        Arm("unmixed-k8", "chunks", pack="unmixed", window_chunks=8),
        Arm("unmixed-k16", "chunks", pack="unmixed", window_chunks=16),
        *(
            Arm(f"unmixed-s{k}", "chunks", pack="unmixed", window_chunks=k, stratified=True)
            for k in (2, 4, 8, 16)
        ),
    )
}
DEFAULT_ARMS = (
    "full",
    "full-b",
    "default",
    "large-default",
    "large-default-w8",
    "large",
    "large-w8",
    "tiny",
    "full-x4",
    "tiny-x4",
    "unmixed",
    "unmixed-default",
    "mix-3to1",
    "mix-3to1-k2",
)


@dataclass(frozen=True)
class HeavyChunks:
    """A pack's chunk map with another chunk size: the sampler's defaults for large chunks."""

    chunk_map: ChunkMap
    group_bytes: int


@dataclass(frozen=True)
class Settings:
    """What every run shares."""

    epochs: int
    batch_size: int
    lr: float
    packs: dict[str, str]
    num_train: int


# -- data ------------------------------------------------------------------------------
def load_photos(folder: Path | None, side: int = 640) -> list[np.ndarray]:
    """Return the class photographs, their longer side scaled to ``side``.

    Without the photo folder (None, or a class's photograph missing) the classes are
    ``h5pack.synthetic`` photographs, one seed per class.
    """
    if folder is None or not all((folder / f"{name}.jpg").is_file() for name in CLASSES):
        return [
            synthesize_photo(np.random.default_rng(c), (side * 5 // 8, side))
            for c in range(len(CLASSES))
        ]
    photos = []
    for name in CLASSES:
        with Image.open(folder / f"{name}.jpg") as image:
            rgb = image.convert("RGB")
            rgb.thumbnail((side, side))
            photos.append(np.asarray(rgb))
    return photos


def make_crops(
    photos: Sequence[np.ndarray], count: int, *, seed: int, region: tuple[float, float], size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``count`` augmented ``size``-pixel crops and their labels (classes at random)."""
    rng = np.random.default_rng(seed)
    images = np.empty((count, size, size, 3), dtype=np.uint8)
    labels = rng.integers(0, len(photos), count)
    for i, label in enumerate(labels.tolist()):
        photo = photos[label]
        height, width = photo.shape[:2]
        left, right = int(width * region[0]), int(width * region[1])
        side = int(rng.integers(40, min(height, right - left) // 2))
        x, y = int(rng.integers(left, right - side)), int(rng.integers(0, height - side))
        crop = Image.fromarray(photo[y : y + side, x : x + side]).resize(
            (size, size), Image.Resampling.BILINEAR
        )
        pixels = np.asarray(crop, dtype=np.float32)
        if rng.random() < 0.3:
            pixels = pixels.mean(axis=2, keepdims=True).repeat(3, axis=2)
        mean = pixels.mean()
        pixels = (pixels - mean) * rng.uniform(0.6, 1.4) + mean * rng.uniform(0.6, 1.4)
        pixels += rng.normal(0.0, 12.0, pixels.shape)
        images[i] = np.clip(pixels, 0, 255).astype(np.uint8)
    return images, labels


def write_packs(
    folder: Path, images: np.ndarray, labels: np.ndarray, *, chunk_samples: int
) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Write the "mixed" and the "unmixed" pack.

    Returns:
        The packs' paths, and for each pack which crop each pack index holds.
    """
    compression = Compression(codec="gzip")
    by_class = np.argsort(labels, kind="stable")
    given = {"mixed": np.arange(len(labels)), "unmixed": by_class}
    paths, crops = {}, {}
    for name, shuffle in (("mixed", True), ("unmixed", False)):
        path = folder / f"{name}.h5"
        options = ConvertOptions(
            chunk_samples=chunk_samples, compression=compression, shuffle_samples=shuffle
        )
        order = given[name]
        write_arrays(path, list(images[order]), labels[order], classes=CLASSES, options=options)
        paths[name] = str(path)
        crops[name] = order[load_meta(path).source_index]
    cut = 3 * len(labels) // 4  # the mix's sources: the first 3/4 and the last 1/4 of the crops
    for name, part in (("mix-a", np.arange(cut)), ("mix-b", np.arange(cut, len(labels)))):
        path = folder / f"{name}.h5"
        options = ConvertOptions(chunk_samples=chunk_samples, compression=compression)
        write_arrays(path, list(images[part]), labels[part], classes=CLASSES, options=options)
        paths[name] = str(path)
        crops[name] = part[load_meta(path).source_index]
    return paths, crops


def read_pack(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return a pack's images as normalised (N, 3, H, W) floats and its labels, pack order."""
    with PackReader(path) as reader:
        images = np.stack(reader.read_images(np.arange(len(reader))))
        labels = reader.meta.labels
    return to_inputs(images), torch.from_numpy(labels)


def to_inputs(images: np.ndarray) -> torch.Tensor:
    """Return uint8 NHWC images as normalised NCHW floats."""
    return (torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0 - 0.5) / 0.25


# -- orders ----------------------------------------------------------------------------
def chunk_sampler(arm: Arm, settings: Settings, *, seed: int) -> ChunkBatchSampler:
    """Return the chunk-aware sampler of ``arm``."""
    batch_size = settings.batch_size * arm.scale
    if arm.order == "weighted":
        mix = [settings.packs["mix-a"], settings.packs["mix-b"]]
        return ChunkBatchSampler(
            mix,
            batch_size,
            seed=seed,
            weights=(3, 1),
            window_chunks=arm.window_chunks,
        )
    path = settings.packs[arm.pack]
    if arm.order == "loader":
        return make_loader(path, batch_size, num_workers=0, seed=seed).chunk_sampler
    meta = load_meta(path)
    source: str | HeavyChunks = path
    if arm.chunk_bytes is not None:
        source = HeavyChunks(chunk_map_of(meta), arm.chunk_bytes)
    strata = None
    if arm.stratified:
        strata = tuple(int(c) for c in chunk_strata(meta.labels, chunk_map_of(meta)))
    spec = EpochSpec(
        batch_size=batch_size,
        seed=seed,
        window_chunks=arm.window_chunks,
        num_workers=arm.num_workers,
        chunk_strata=strata,
    )
    if arm.order == "labels":
        return sampler_for_labels(source, spec, meta)[0]
    return ChunkBatchSampler(source, spec)


def batches_of(arm: Arm, settings: Settings, *, seed: int, epoch: int) -> Iterator[list[int]]:
    """Yield the batches of sample indices of ``arm`` for one epoch."""
    if arm.order == "full":
        generator = torch.Generator().manual_seed((seed * 100_003 + epoch) * 2 + arm.stream)
        dataset = H5ImageDataset(settings.packs[arm.pack])
        sampler = RandomSampler(dataset, generator=generator)
        yield from BatchSampler(sampler, settings.batch_size * arm.scale, drop_last=False)
        return
    sampler = chunk_sampler(arm, settings, seed=seed)
    sampler.set_epoch(epoch)
    yield from sampler


def check_loader(settings: Settings, labels: torch.Tensor) -> None:
    """Check that ``make_loader`` delivers the labels its sampler's batches index.

    Raises:
        RuntimeError: it does not.
    """
    loader = make_loader(settings.packs["mixed"], settings.batch_size, num_workers=0, seed=0)
    loader.set_epoch(1)
    expected = [labels[batch] for batch in loader.chunk_sampler.plan(1)]
    delivered = [batch_labels for _, batch_labels in loader]
    if len(delivered) != len(expected) or not all(
        torch.equal(a, b) for a, b in zip(delivered, expected, strict=True)
    ):
        raise RuntimeError("make_loader's batches differ from its sampler's plan")


# -- training --------------------------------------------------------------------------
def make_model(num_classes: int) -> nn.Module:
    """Return the small CNN: three conv + batch norm + ReLU + max-pool blocks, linear head."""

    def block(inputs: int, outputs: int) -> list[nn.Module]:
        return [
            nn.Conv2d(inputs, outputs, 3, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]

    return nn.Sequential(
        *block(3, 16),
        *block(16, 32),
        *block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


# Set in each worker process by ``init_worker``: the tensors every run reads.
DATA: dict[str, torch.Tensor] = {}


def init_worker(data: dict[str, torch.Tensor]) -> None:
    """Keep the shared tensors in this process and use one thread."""
    torch.set_num_threads(1)
    DATA.update(data)


def train_one(arm: Arm, settings: Settings, seed: int) -> float:
    """Train from seed ``seed``'s initial weights in ``arm``'s order; return test accuracy."""
    images, labels, crops = (DATA[f"{arm.pack}-{part}"] for part in ("images", "labels", "crops"))
    torch.manual_seed(seed)
    model = make_model(len(CLASSES))
    batch_size, lr = settings.batch_size * arm.scale, settings.lr * arm.scale
    steps = settings.epochs * -(-settings.num_train // batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps)
    for epoch in range(settings.epochs):
        # the flips are a function of (seed, epoch, crop): the same in every arm
        flips = torch.from_numpy(np.random.default_rng((seed, epoch)).random(len(crops)) < 0.5)
        model.train()
        for batch in batches_of(arm, settings, seed=seed, epoch=epoch):
            index = torch.as_tensor(batch)
            inputs = images[index]
            inputs = torch.where(flips[crops[index]][:, None, None, None], inputs.flip(3), inputs)
            loss = nn.functional.cross_entropy(model(inputs), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        predicted = model(DATA["test-images"]).argmax(1)
    return float((predicted == DATA["test-labels"]).float().mean())


def run_job(job: tuple[Arm, Settings, int]) -> tuple[str, int, float]:
    """Run one (arm, seed); return (arm, seed, accuracy in %)."""
    arm, settings, seed = job
    return arm.name, seed, 100.0 * train_one(arm, settings, seed)


# -- report ----------------------------------------------------------------------------
def spread(values: Sequence[float], sign: str = "") -> str:
    """Return 'median (min..max)'."""
    form = f"{sign}.1f"
    return f"{statistics.median(values):{form}} ({min(values):{form}}..{max(values):{form}})"


def describe_window(arm: Arm, settings: Settings, chunk_samples: int) -> tuple[str, str]:
    """Return the arm's window (chunks, pool in batches) and its label mixing, as text."""
    if arm.order == "full":
        return "all", "-"
    sampler = chunk_sampler(arm, settings, seed=0)
    window = sampler.window_chunks
    pool = window * chunk_samples / (settings.batch_size * arm.scale)
    if arm.order == "weighted":
        return f"{window} ({pool:g})", "-"
    report = label_mixing(
        load_meta(settings.packs[arm.pack]),
        sampler.chunk_map,
        window_chunks=window,
        stratified=sampler.spec.chunk_strata is not None,
    )
    return f"{window} ({pool:g})", f"{report.window_figure:.2f}"


def build(
    folder: Path,
    *,
    photos: Path | None,
    num_train: int,
    num_test: int,
    size: int,
    chunk_samples: int,
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Make the crops, write both packs into ``folder`` and read them back.

    Returns:
        The packs' paths, and the tensors the runs share (``init_worker``'s ``data``).
    """
    pictures = load_photos(photos)
    train_images, train_labels = make_crops(
        pictures, num_train, seed=1, region=TRAIN_REGION, size=size
    )
    test_images, test_labels = make_crops(pictures, num_test, seed=2, region=TEST_REGION, size=size)
    packs, crops = write_packs(folder, train_images, train_labels, chunk_samples=chunk_samples)
    data = {"test-images": to_inputs(test_images), "test-labels": torch.from_numpy(test_labels)}
    for name, path in packs.items():
        data[f"{name}-images"], data[f"{name}-labels"] = read_pack(path)
        data[f"{name}-crops"] = torch.from_numpy(crops[name])
    for part in ("images", "labels", "crops"):  # the mix's global indices: a's, then b's
        data[f"mix-{part}"] = torch.cat([data.pop(f"mix-a-{part}"), data.pop(f"mix-b-{part}")])
    return packs, data


def run(
    names: Sequence[str],
    settings: Settings,
    data: dict[str, torch.Tensor],
    *,
    seeds: int,
    processes: int,
) -> dict[tuple[str, int], float]:
    """Train every arm of ``names`` with every seed; return the accuracies (%).

    ``processes`` <= 1 trains in this process (with one thread, restored afterwards).
    """
    jobs = [(ARMS[name], settings, seed) for seed in range(seeds) for name in names]
    if processes <= 1:
        threads = torch.get_num_threads()
        init_worker(data)
        try:
            results = [run_job(job) for job in jobs]
        finally:
            torch.set_num_threads(threads)
    else:
        with ProcessPoolExecutor(processes, initializer=init_worker, initargs=(data,)) as pool:
            results = list(pool.map(run_job, jobs))
    return {(name, seed): value for name, seed, value in results}


def main() -> None:
    """Run the benchmark and print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--photos", type=Path, default=SHARED_PHOTOS)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--train", type=int, default=2560, help="training crops")
    parser.add_argument("--test", type=int, default=2000, help="test crops")
    parser.add_argument("--size", type=int, default=32, help="crop side in pixels")
    parser.add_argument("--chunk-samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="peak of the one-cycle schedule")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=list(ARMS))
    args = parser.parse_args()
    names = list(dict.fromkeys(n for a in args.arms for n in (ARMS[a].reference, a)))

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="h5pack-bench-training-") as folder:
        packs, data = build(
            Path(folder),
            photos=args.photos if args.photos.is_dir() else None,
            num_train=args.train,
            num_test=args.test,
            size=args.size,
            chunk_samples=args.chunk_samples,
        )
        settings = Settings(
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            packs=packs,
            num_train=args.train,
        )
        check_loader(settings, data["mixed-labels"])
        windows = {n: describe_window(ARMS[n], settings, args.chunk_samples) for n in names}
        accuracy = run(names, settings, data, seeds=args.seeds, processes=args.processes)
    elapsed_s = time.perf_counter() - started

    source = "photos" if args.photos.is_dir() else "synthetic photos"
    print(f"# Training equivalence ({platform.node()}, {os.cpu_count()} cores, {elapsed_s:.0f} s)")
    print(
        f"{args.train} training / {args.test} test crops of {args.size}x{args.size} ({source}), "
        f"{len(CLASSES)} classes, {args.train // args.chunk_samples} chunks of "
        f"{args.chunk_samples}, batch {args.batch_size}, {args.epochs} epochs, "
        f"{args.seeds} seeds\n"
    )
    print(
        "| arm | pack | window: chunks (pool, batches) | label mixing | accuracy %: median "
        "(min..max) | paired difference, points | worst - reference's worst |"
    )
    print("|---|---|---|---|---|---|---|")
    seeds = range(args.seeds)
    for name in names:
        arm = ARMS[name]
        values = [accuracy[name, s] for s in seeds]
        reference = [accuracy[arm.reference, s] for s in seeds]
        diffs = [v - r for v, r in zip(values, reference, strict=True)]
        paired = "-" if name == arm.reference else spread(diffs, "+")
        worst = "-" if name == arm.reference else f"{min(values) - min(reference):+.1f}"
        window, mixing = windows[name]
        print(
            f"| {name} | {arm.pack} | {window} | {mixing} | {spread(values)} | {paired} | {worst} |"
        )
    print()
    for name in names:
        print(f"{name}: " + " ".join(f"{accuracy[name, s]:.1f}" for s in seeds))


if __name__ == "__main__":
    main()
