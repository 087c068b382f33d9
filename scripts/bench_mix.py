"""Mixing packs by weight (issue 18): exactness, stratification, and the cost of a mix.

Three parts, each printed as a markdown table:

- ``exact``: per-epoch samples of each source against ``round(share x epoch_samples)``, over
  ``--epochs`` epochs, for several weightings (one source 10x smaller than its share),
  planned for 2 ranks x 2 workers (the order alone: no files); also whether any sample of a
  source that does not repeat came twice in an epoch, and the epochs that covered every
  sample of a subsampled source.
- ``stratify``: the worst batch's deviation from the shares (samples).
- ``cost``: ``make_loader`` over a 3:1 mix of two packs against one pack of the same images
  (the same total size), read in this process (``num_workers=0``, the raw default), with
  the reader's threads and with one thread, and the mix as it was read before its sources
  shared one pool (each source's reader on its own threads): images/s, CPU seconds per
  image (process and children), chunks decompressed per sample, and the medians over
  rounds of each round's ratios to one pack.

Usage::

    python scripts/bench_mix.py                     # all three
    python scripts/bench_mix.py --parts cost --rounds 7
"""

from __future__ import annotations

import argparse
import itertools
import resource
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from h5pack import Compression, ConvertOptions, make_loader, write_arrays
from h5pack.core.layout import ChunkMap
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.sampler import ChunkBatchSampler, EpochSpec, MixedSources
from h5pack.training.weighted import WeightedMix, shares


def exactness(epochs: int) -> list[str]:
    """Per-epoch counts against the target, several weightings, 2 ranks x 2 workers."""
    cases = [
        ("3:1, sizes 6000/2000", (6000, 2000), (3, 1), None),
        ("1:1, sizes 10000/500 (B's share 10x B)", (10000, 500), (1, 1), 10000),
        ("1:10, sizes 20000/1000, E=11000", (20000, 1000), (1, 10), 11000),
        ("5:3:2, sizes 4000/3000/800", (4000, 3000, 800), (5, 3, 2), None),
    ]
    rows = [
        "| weights, sizes | epoch | target per source | worst miss over epochs | "
        "passes per epoch | repeats in a non-repeating source | epochs covering each subsampled |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, sizes, weights, epoch_samples in cases:
        maps = tuple(ChunkMap.regular(n, 64) for n in sizes)
        mix = WeightedMix(maps, tuple(float(w) for w in weights), epoch_samples)
        target = shares(weights, mix.num_samples)
        offsets = mix.offsets
        worst, repeats = 0, 0
        seen: dict[int, set[int]] = {s: set() for s in range(len(sizes))}
        covered: dict[int, int | None] = dict.fromkeys(range(len(sizes)))
        for epoch in range(epochs):
            served: list[int] = []
            for rank in range(2):
                sampler = ChunkBatchSampler(
                    MixedSources(maps),
                    256,
                    seed=11,
                    num_replicas=2,
                    rank=rank,
                    num_workers=2,
                    weights=weights,
                    epoch_samples=epoch_samples,
                )
                sampler.set_epoch(epoch)
                served += [i for b in sampler for i in b]
            source = np.searchsorted(offsets, served, side="right") - 1
            counts = np.bincount(source, minlength=len(sizes))
            assert len(served) == mix.num_samples  # even epochs: 2 ranks pad nothing
            worst = max(worst, int(np.abs(counts - target).max()))
            for s, n in enumerate(sizes):
                mine = [i for i, k in zip(served, source, strict=True) if k == s]
                if target[s] <= n:
                    repeats += sum(v - 1 for v in Counter(mine).values())
                    seen[s].update(mine)
                    if covered[s] is None and len(seen[s]) == n:
                        covered[s] = epoch + 1
        passes = ", ".join(f"{t / n:.2f}" for t, n in zip(target, sizes, strict=True))
        cover = ", ".join(f"{covered[s]}" for s in range(len(sizes)) if target[s] < sizes[s]) or "-"
        rows.append(
            f"| {label} | {mix.num_samples} | {', '.join(map(str, target))} | {worst} | "
            f"{passes} | {repeats} | {cover} |"
        )
    return rows


def stratification() -> list[str]:
    """The worst batch's deviation from the shares (every mix is laid out balanced)."""
    rows = [
        "| weights | batch | workers | worst batch deviation (samples) | mean abs deviation |",
        "|---|---|---|---|---|",
    ]
    for weights, sizes in (((3, 1), (30000, 10000)), ((5, 3, 2), (20000, 12000, 8000))):
        maps = tuple(ChunkMap.regular(n, 64) for n in sizes)
        share = np.asarray(weights, dtype=float) / sum(weights)
        for workers in (0, 4):
            sampler = ChunkBatchSampler(
                MixedSources(maps), 256, seed=3, num_workers=workers, weights=weights
            )
            offsets = WeightedMix(maps, tuple(map(float, weights))).offsets
            devs = []
            for batch in sampler:
                if len(batch) < 256:
                    continue
                source = np.searchsorted(offsets, batch, side="right") - 1
                counts = np.bincount(source, minlength=len(sizes))
                devs.append(np.abs(counts - 256 * share).max())
            rows.append(
                f"| {':'.join(map(str, weights))} | 256 | {workers} | "
                f"{max(devs):.2f} | {statistics.mean(devs):.2f} |"
            )
    return rows


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def per_source_pools(loader: Any) -> Any:
    """The mix as before the shared pool: each source's reader on its own threads."""
    loader.dataset.pool = None
    for part in loader.dataset.parts:
        part.pool = None
    return loader


def cost_packs(folder: Path, side: int = 64) -> tuple[Path, Path, Path]:
    """Write the cost parts' packs: 6,000 + 2,000 samples, and the same 8,000 in one pack."""
    rng = np.random.default_rng(0)
    num_a, num_b = 6000, 2000
    images = rng.integers(0, 256, (num_a + num_b, side, side, 3), dtype=np.uint8)
    images[:, ::2] //= 3  # compressible, like photographs (zstd ~2:1)
    labels = rng.integers(0, 10, num_a + num_b)
    options = ConvertOptions(chunk_samples=64, compression=Compression(codec="zstd"))
    classes = [f"c{i}" for i in range(10)]
    a, b, one = folder / "a.h5", folder / "b.h5", folder / "one.h5"
    write_arrays(a, list(images[:num_a]), labels[:num_a], options=options, classes=classes)
    write_arrays(b, list(images[num_a:]), labels[num_a:], options=options, classes=classes)
    write_arrays(one, list(images), labels, options=options, classes=classes)
    return a, b, one


def floor(rounds: int, folder: Path) -> list[str]:
    """Where a batch's time goes, one pack against the 3:1 mix (reader's threads, in turn).

    Batches are told apart by the chunks they decompress (a window of 8 chunks serves two
    batches: the first decompresses all 8, the second none). The main thread's CPU per
    batch (``time.thread_time``: what the batch thread itself does, which the other users
    of the machine slow down little) against the batch's wall time: the mix's extra main
    thread time is serial work that no pool thread can take, hence the floor of its rate.
    """
    a, b, one = cost_packs(folder)
    settings: dict[str, Any] = {"num_workers": 0, "seed": 1}
    batch = EpochSpec(batch_size=256, window_chunks=8)
    loaders = {
        "one pack": make_loader(one, batch, **settings),
        "3:1 mix of two packs": make_loader([a, b], batch, weights=[3, 1], **settings),
    }
    wall: dict[tuple[str, str], list[float]] = {}
    main: dict[tuple[str, str], list[float]] = {}
    for epoch in range(rounds + 1):  # the first round warms up
        for name in loaders if epoch % 2 else reversed(list(loaders)):
            loader = loaders[name]
            loader.set_epoch(epoch)
            parts = getattr(loader.dataset, "parts", [loader.dataset])
            batches = iter(loader)
            while True:
                loads = sum(p.reader.loads for p in parts) if epoch else 0
                started, clock = time.perf_counter(), time.thread_time()
                if next(batches, None) is None:
                    break
                spent, used = time.perf_counter() - started, time.thread_time() - clock
                if epoch:
                    kind = "decompresses >= 5 chunks"
                    if sum(p.reader.loads for p in parts) - loads < 5:
                        kind = "decompresses < 5 chunks"
                    wall.setdefault((name, kind), []).append(spent)
                    main.setdefault((name, kind), []).append(used)
    rows = [
        "| loader | batches | count | wall us, median | main thread CPU us, median |",
        "|---|---|---|---|---|",
    ]
    for (name, kind), values in sorted(wall.items(), key=lambda item: item[0][::-1]):
        rows.append(
            f"| {name} | {kind} | {len(values)} | {1e6 * statistics.median(values):,.0f} | "
            f"{1e6 * statistics.median(main[(name, kind)]):,.0f} |"
        )
    rows += ["", "| step, on the batch thread | one pack | 3:1 mix |", "|---|---|---|"]
    plans = []
    for loader in loaders.values():  # the epoch's plan, which the sampler makes per epoch
        clock = time.thread_time()
        for epoch in range(rounds):
            loader.batch_sampler.set_epoch(epoch)
            loader.batch_sampler.plan()
        plans.append(1e3 * (time.thread_time() - clock) / rounds)
    rows.append(f"| an epoch's plan, ms | {plans[0]:.2f} | {plans[1]:.2f} |")
    rows.append(f"| gathering 256 samples of 8 windowed chunks, us | {gathers(a, b, one)} |")
    return rows


def gathers(a: Path, b: Path, one: Path) -> str:
    """One reader gathering 8 chunks' samples, against two gathering 6 + 2 (us, median)."""
    rng = np.random.default_rng(0)
    options = ReaderOptions(threads=2, window_chunks=8)
    readers = {path: PackReader(path, options) for path in (a, b, one)}

    def picks(chunks: int) -> np.ndarray:
        idx = np.concatenate([c * 64 + rng.choice(64, 32, replace=False) for c in range(chunks)])
        rng.shuffle(idx)
        return idx

    out = np.empty((256, 64, 64, 3), dtype=np.uint8)
    whole, first, second = picks(8), picks(6), picks(2)
    steps = {
        "one": lambda: readers[one].read_into(whole, out),
        "two": lambda: (
            readers[a].read_into(first, out[:192]),
            readers[b].read_into(second, out[192:]),
        ),
    }
    spent: dict[str, list[float]] = {"one": [], "two": []}
    for _ in range(300):  # the first reads load the chunks; then every read gathers
        for name, step in steps.items():
            clock = time.thread_time()
            step()
            spent[name].append(time.thread_time() - clock)
    for reader in readers.values():
        reader.close()
    return " | ".join(f"{1e6 * statistics.median(v[10:]):.0f}" for v in spent.values())


def cost(rounds: int, folder: Path, block: int, side: int = 64) -> list[str]:
    """A 3:1 mix of two packs against one pack of the same images, in this process.

    Every round reads one epoch of every loader, ``block`` batches of each in turn (0: the
    whole epoch), the order reversed at every turn, so that all of them meet about the same
    load from the other users of the machine; a ratio is the mix's figure over the one
    pack's of the same round and thread count, and the table gives the median over rounds
    of those ratios.
    """
    num_a, num_b = 6000, 2000
    a, b, one = cost_packs(folder, side)
    loaders: dict[str, Any] = {}
    base: dict[str, str] = {}  # each loader's one-pack reference
    for threads in (None, 1):
        suffix = "" if threads is None else ", 1 thread"
        settings: dict[str, Any] = {
            "num_workers": 0,
            "seed": 1,
            "reader": ReaderOptions(threads=threads),
        }
        batch = EpochSpec(batch_size=256, window_chunks=8)
        loaders["one pack" + suffix] = make_loader(one, batch, **settings)
        mixed = {"weights": [3, 1], **settings}
        loaders["3:1 mix of two packs" + suffix] = make_loader([a, b], batch, **mixed)
        if threads is None:
            loaders["3:1 mix, a pool per source (before)"] = per_source_pools(
                make_loader([a, b], batch, **mixed)
            )
        for name in loaders:
            base.setdefault(name, "one pack" + suffix)
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    cpu: dict[str, list[float]] = {k: [] for k in loaders}
    for epoch in range(rounds + 1):  # the first round warms up
        wall, spent, count = dict.fromkeys(loaders, 0.0), dict.fromkeys(loaders, 0.0), {}
        running = {}
        for name, loader in loaders.items():
            loader.set_epoch(epoch)
            running[name] = iter(loader)
            count[name] = 0
        turn = 0
        while running:  # ``block`` batches of each loader in turn
            names = list(running) if turn % 2 else list(reversed(running))
            turn += 1
            for name in names:
                started, clock = time.perf_counter(), cpu_seconds()
                taken = 0
                for _, labels in itertools.islice(running[name], block or None):
                    taken += len(labels)
                wall[name] += time.perf_counter() - started
                spent[name] += cpu_seconds() - clock
                count[name] += taken
                if taken == 0:
                    del running[name]
        if epoch:
            for name in loaders:
                rates[name].append(count[name] / wall[name])
                cpu[name].append(spent[name] / count[name])
    rows = [
        "| loader | images/s, median (min..max) | CPU us/image, median | "
        "chunks decompressed per sample | images/s ratio to one pack, median (min..max) "
        "of rounds | CPU ratio, median of rounds |",
        "|---|---|---|---|---|---|",
    ]
    for name, loader in loaders.items():
        ref = base[name]
        rate_ratios = [m / o for m, o in zip(rates[name], rates[ref], strict=True)]
        cpu_ratios = [m / o for m, o in zip(cpu[name], cpu[ref], strict=True)]
        dataset = loader.dataset
        parts = getattr(dataset, "parts", [dataset])
        loads = sum(p.reader.loads for p in parts) / ((rounds + 1) * (num_a + num_b))
        rows.append(
            f"| {name} | {statistics.median(rates[name]):,.0f} ({min(rates[name]):,.0f}.."
            f"{max(rates[name]):,.0f}) | {1e6 * statistics.median(cpu[name]):.1f} | "
            f"{loads:.4f} | {statistics.median(rate_ratios):.3f} ({min(rate_ratios):.3f}.."
            f"{max(rate_ratios):.3f}) | {statistics.median(cpu_ratios):.3f} |"
        )
    return rows


def main() -> None:
    """Run the parts asked for and print their tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["exact", "stratify", "cost"])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--block", type=int, default=0, help="cost: batches of each loader in turn (0: epochs)"
    )
    parser.add_argument(
        "--side", type=int, default=64, help="cost: the images' side in pixels (square, raw)"
    )
    args = parser.parse_args()
    if "exact" in args.parts:
        print(f"## Exactness over {args.epochs} epochs (2 ranks x 2 workers, batch 256)\n")
        print("\n".join(exactness(args.epochs)), "\n")
    if "stratify" in args.parts:
        print("## Per-batch shares\n")
        print("\n".join(stratification()), "\n")
    if "cost" in args.parts:
        with tempfile.TemporaryDirectory() as folder:
            side = args.side
            print(f"## Cost of a mix (8,000 {side}x{side} raw zstd samples, 64 per chunk)\n")
            print("\n".join(cost(args.rounds, Path(folder), args.block, side)))
    if "floor" in args.parts:
        with tempfile.TemporaryDirectory() as folder:
            print("\n## Where a batch's time goes (the floor of the mix's rate)\n")
            print("\n".join(floor(args.rounds, Path(folder))))


if __name__ == "__main__":
    main()
