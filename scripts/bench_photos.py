"""Training images from photo folders: h5pack's pipeline against what users run today (issue 8).

    python scripts/bench_photos.py                       # the full run (~4-5 minutes, 2 cores)
    python scripts/bench_photos.py --quick               # a smoke run (~25 s)
    python scripts/bench_photos.py --data bench-data/photos2000 --json photos.json

Data: ``--images`` ImageNet-like JPEGs (``h5pack.synthetic.make_image_folder``: cut from
../shared/data/photos when present, 10 classes, around 500x375 with +-30% jitter on each
side, quality 90), packed encoded (``h5pack convert``'s default for mixed sizes) and raw at
256x256 (``ConvertOptions(size=(256, 256))``). ``--data DIR`` keeps them between runs.

Every loader delivers uint8 (B, 3, 224, 224) batches of RandomResizedCrop(224) + horizontal
flip and int64 labels, through 2 DataLoader workers unless said otherwise:

- ``peer``: an ImageFolder-style Dataset as users write it: ``Image.open(path).convert("RGB")``,
  torchvision's RandomResizedCrop box (``h5pack.read.crop.random_resized_box``, the same
  algorithm), ``img.crop(box).resize((224, 224), BILINEAR)``, flip, ``np.array`` -> tensor,
  default collate;
- ``peer + Manager dict``: the same with a ``multiprocessing.Manager().dict()`` of decoded
  images shared by the workers (the common recipe);
- ``h5pack``: ``make_loader(pack, 64, size=224, crop="random-resized", flip=True, ...)``
  with ``num_workers="auto"`` (one worker per core: the packs are cut to a size) and, for
  the encoded pack, also in the main process with 2 threads
  (``num_workers=0, threads=2``); without cache, with ``cache="decoded"`` and a budget larger
  than the decoded images, and with a quarter of their size.

Each epoch's figures are images per second and images per CPU-second of the whole process
tree (main process, workers, the Manager's server; reaped workers included): on a shared
machine the second moves less with other programs' load. A first table gives each step's
CPU cost in one thread (decoders, resizers, flips, the cache's put and get).

"first epoch" loaders are made fresh in each round (worker start-up included, on both
sides); "later epochs" loaders are made once, run one untimed epoch (which fills the
caches), then one timed epoch per round. Rounds interleave every measurement, so load from
elsewhere hits all alike; tables give medians over rounds and medians of per-round ratios.

Memory: each cache budget runs again in a fresh process of its own (after the rounds), and
the proportional set size (PSS: shared pages divided among the processes mapping them) of
that process and its workers is sampled through two epochs, against the same loader
without cache: the difference is what the cache costs. The cache's own resident bytes are
the PSS of its ``memfd:h5pack-cache`` mappings. Shuffle quality: the jump entropy
(``h5pack.training.shuffle_quality``) of the epoch order with the pipeline on and off.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from h5pack.bench.system import machine_info, tree_cpu_s, warm_page_cache
from h5pack.core.decode import decode_image
from h5pack.core.format import load_meta
from h5pack.read.crop import (
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    CropSpec,
    decode_pixels,
    flip_in_place,
    opencv_resize_into,
    pillow_resize_into,
    plan_crop,
    random_resized_box,
)
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.cache import DecodedCache
from h5pack.training.fixed_size import torch_resize_into
from h5pack.training.loader import make_loader
from h5pack.training.shuffle_quality import jump_entropy
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions

# The project's real photographs, beside the checkout (see its README); synthetic without.
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"
PHOTOS = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None
SIZE = 224
CACHE_MAPPING = "memfd:h5pack-cache"


# -- the peers: what users write today --------------------------------------------------------
class PillowPeer(Dataset[tuple[torch.Tensor, int]]):
    """ImageFolder + RandomResizedCrop(224) + flip, with Pillow; optionally a shared dict cache."""

    def __init__(self, samples: list[tuple[str, int]], cache: Any = None) -> None:
        self.samples = samples
        self.cache = cache
        self._rng: np.random.Generator | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.samples)

    def rng(self) -> np.random.Generator:
        """This process's generator (DataLoader seeds torch differently in each worker)."""
        if self._rng is None or self._pid != os.getpid():
            self._rng, self._pid = np.random.default_rng(torch.initial_seed()), os.getpid()
        return self._rng

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        cached = self.cache.get(index) if self.cache is not None else None
        if cached is None:
            with Image.open(path) as file:
                image = file.convert("RGB")
            if self.cache is not None:
                self.cache[index] = np.asarray(image)
        else:
            image = Image.fromarray(cached)
        rng = self.rng()
        top, left, height, width = random_resized_box(
            image.height, image.width, DEFAULT_SCALE, DEFAULT_RATIO, rng
        )
        image = image.crop((left, top, left + width, top + height))
        image = image.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(image)).permute(2, 0, 1), label


def image_samples(root: Path) -> list[tuple[str, int]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [
        (str(path), label)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
    ]


def peer_loader(
    samples: list[tuple[str, int]],
    args: argparse.Namespace,
    *,
    cache: Any = None,
    persistent: bool = False,
) -> DataLoader[Any]:
    return DataLoader(
        PillowPeer(samples, cache),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=persistent,
    )


def h5_loader(path: Path, args: argparse.Namespace, **kwargs: Any) -> Any:
    return make_loader(path, args.batch_size, size=SIZE, crop="random-resized", flip=True, **kwargs)


# -- measuring --------------------------------------------------------------------------------
def process_tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


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
    for batch, labels in loader:
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


def mapping_pss(pid: int, name: str) -> int:
    """Bytes of PSS of the mappings of ``pid`` whose path contains ``name``."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                head = line.split(maxsplit=1)[0]
                if not head.endswith(":"):  # a mapping's first line: address range, path
                    inside = name in line
                elif inside and head == "Pss:":
                    total += int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    return total


class MemoryProbe:
    """Sample the PSS of this process and its children (and the cache's share) in a thread."""

    def __init__(self, period_s: float = 0.05) -> None:
        self.period_s = period_s
        self.peak_pss = self.peak_cache = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        """Take one sample of the process tree's PSS and of the cache's share."""
        pss = cache = 0
        for process in process_tree():
            try:
                pss += process.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            cache += mapping_pss(process.pid, CACHE_MAPPING)
        self.peak_pss, self.peak_cache = max(self.peak_pss, pss), max(self.peak_cache, cache)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> MemoryProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def memory_child(pack: str, options: dict[str, Any], batch_size: int, queue: Any) -> None:
    """In a fresh process: two epochs of one loader under the probe; report PSS peaks."""
    args = argparse.Namespace(batch_size=batch_size)
    with MemoryProbe() as probe:
        loader = h5_loader(Path(pack), args, **options)
        runs = [epoch(loader, number) for number in range(2)]
        stats = loader.cache.stats() if loader.cache is not None else None
    queue.put(
        {
            "peak_pss": probe.peak_pss,
            "peak_cache_pss": probe.peak_cache,
            "images_per_s": [r.images_per_s for r in runs],
            "cache_used_bytes": stats.used_bytes if stats else 0,
            "cache_entries": stats.entries if stats else 0,
        }
    )
    loader.close()


def measure_memory(pack: Path, options: dict[str, Any], batch_size: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")  # a clean process: nothing inherited
    queue = context.Queue()
    child = context.Process(target=memory_child, args=(str(pack), options, batch_size, queue))
    child.start()
    while True:  # a child that died (killed, out of memory) must not hang the benchmark
        try:
            result: dict[str, Any] = queue.get(timeout=1.0)
            break
        except Empty:
            if not child.is_alive():
                raise RuntimeError(
                    f"the memory probe of {options} exited with {child.exitcode}"
                ) from None
    child.join()
    return result


def epoch_order(loader: Any, number: int) -> np.ndarray:
    loader.set_epoch(number)
    return np.concatenate([np.asarray(batch) for batch in loader.batch_sampler])


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


# -- kernels, one thread ----------------------------------------------------------------------
def kernel_table(samples: list[tuple[str, int]], count: int) -> dict[str, float]:
    """CPU microseconds per image of each step, one thread, median of 3 passes over ``count``."""
    import cv2

    files = [Path(path).read_bytes() for path, _ in samples[:count]]
    images = [decode_image(data) for data in files]
    spec = CropSpec.of(SIZE, crop="random-resized", flip=True)
    boxes = [
        plan_crop(spec, *a.shape[:2], seed=0, epoch=0, index=i)[0] for i, a in enumerate(images)
    ]
    cuts = [
        a[b.top : b.top + b.height, b.left : b.left + b.width]
        for a, b in zip(images, boxes, strict=True)
    ]
    out = np.empty((SIZE, SIZE, 3), dtype=np.uint8)

    def peer_resize(i: int) -> None:
        top, left, height, width = boxes[i]
        pil = Image.fromarray(images[i]).crop((left, top, left + width, top + height))
        np.array(pil.resize((SIZE, SIZE), Image.Resampling.BILINEAR))

    def numpy_flip(_: int) -> None:
        out[...] = out[:, ::-1]

    def peer_decode(i: int) -> None:
        with Image.open(io.BytesIO(files[i])) as file:
            np.asarray(file.convert("RGB"))

    steps: dict[str, Callable[[int], object]] = {
        "decode JPEG: Pillow, Image.open().convert('RGB') + np.asarray (the peer)": peer_decode,
        "decode JPEG: h5pack decode_image (Pillow)": lambda i: decode_image(files[i]),
        "decode JPEG: h5pack decode_pixels (OpenCV's libjpeg-turbo)": lambda i: decode_pixels(
            files[i]
        ),
        "plan the box and flip (plan_crop)": lambda i: plan_crop(
            spec, *images[i].shape[:2], seed=0, epoch=0, index=i
        ),
        "resize box to 224: Pillow crop().resize() + np.array (the peer)": peer_resize,
        "resize box to 224: pillow_resize_into": lambda i: pillow_resize_into(cuts[i], out),
        "resize box to 224: opencv_resize_into (INTER_AREA shrinking)": lambda i: (
            opencv_resize_into(cuts[i], out)
        ),
        "resize box to 224: cv2 INTER_LINEAR, no antialiasing": lambda i: cv2.resize(
            cuts[i], (SIZE, SIZE), dst=out, interpolation=cv2.INTER_LINEAR
        ),
        "resize box to 224: torch_resize_into (Pillow's filter)": lambda i: torch_resize_into(
            cuts[i], out
        ),
        "flip 224x224: numpy out[...] = out[:, ::-1]": numpy_flip,
        "flip 224x224: flip_in_place (cv2.flip)": lambda i: flip_in_place(out),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: what each worker, or each reader thread, costs
    table = {}
    try:
        for name, step in steps.items():
            passes = []
            for _ in range(3):
                start = time.process_time()
                for i in range(len(files)):
                    step(i)
                passes.append((time.process_time() - start) / len(files) * 1e6)
            table[name] = statistics.median(passes)
        with DecodedCache(len(files), 2 * sum(a.nbytes for a in images) + (1 << 20)) as cache:
            start = time.process_time()
            for i, array in enumerate(images):
                cache.put(i, array)
            table["DecodedCache.put (pwrite into the memfd)"] = (
                (time.process_time() - start) / len(files) * 1e6
            )
            start = time.process_time()
            for _ in range(3):
                for i in range(len(files)):
                    cache.get(i)
            table["DecodedCache.get (a view)"] = (
                (time.process_time() - start) / 3 / len(files) * 1e6
            )
    finally:
        torch.set_num_threads(threads)
    print(
        f"\n## kernels: CPU us per image, one thread, median of 3 passes over {len(files)} images\n"
    )
    print("| step | us |")
    print("|---|---:|")
    for name, micros in table.items():
        print(f"| {name} | {micros:,.0f} |")
    return table


# -- the experiment -----------------------------------------------------------------------------
PEER, MANAGER = "peer", "peer + Manager dict"
NO_CACHE, BIG, QUARTER, RAW = "no cache", "cache, large budget", "cache, 1/4 budget", "raw 256x256"
AUTO, INPROC = "workers=auto (2)", "in-process (threads=2)"


def loaders_of(
    args: argparse.Namespace,
    samples: list[tuple[str, int]],
    encoded: Path,
    raw: Path,
    budgets: dict[str, int],
    manager: Any,
) -> tuple[dict[tuple[str, str], Callable[[], Any]], dict[tuple[str, str], Any]]:
    """Return the loaders made fresh each round (first epochs) and those kept (later epochs)."""
    modes = {AUTO: {}, INPROC: {"num_workers": 0, "threads": args.workers}}

    def h5(mode: str, budget: str | None = None) -> Callable[[], Any]:
        cache = {} if budget is None else {"cache": "decoded", "cache_bytes": budgets[budget]}
        return lambda: h5_loader(encoded, args, **modes[mode], **cache)

    fresh: dict[tuple[str, str], Callable[[], Any]] = {
        (PEER, "first epoch"): lambda: peer_loader(samples, args)
    }
    kept: dict[tuple[str, str], Any] = {
        (PEER, "later epochs"): peer_loader(samples, args, persistent=True),
        (MANAGER, "later epochs"): peer_loader(
            samples, args, cache=manager.dict(), persistent=True
        ),
    }
    for mode in modes:
        fresh[(f"h5pack {NO_CACHE}, {mode}", "first epoch")] = h5(mode)
        fresh[(f"h5pack {BIG}, {mode}", "first epoch")] = h5(mode, BIG)
        kept[(f"h5pack {NO_CACHE}, {mode}", "later epochs")] = h5(mode)()
        for budget in (BIG, QUARTER):
            kept[(f"h5pack {budget}, {mode}", "later epochs")] = h5(mode, budget)()
    kept[(f"h5pack {RAW}, {AUTO.replace('(2)', '(in-process, 2 threads)')}", "every epoch")] = (
        h5_loader(raw, args)
    )
    return fresh, kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="the peers' DataLoader workers")
    parser.add_argument("--data", type=Path, help="keep the images and packs here (reused)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="120 images, 1 round, fewer probes: a smoke run"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory probes")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.rounds = min(args.images, 120), 1
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp)
        data.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        folder, encoded, raw = prepare(data, args.images)
        prepared_s = time.perf_counter() - start
        for path in (*folder.rglob("*.jpg"), encoded, raw):
            warm_page_cache(path)
        run(args, folder, encoded, raw, prepared_s)


def run(
    args: argparse.Namespace, folder: Path, encoded: Path, raw: Path, prepared_s: float
) -> None:
    meta = load_meta(encoded)
    decoded_bytes = int(sum(int(h) * int(w) * 3 for h, w in meta.shapes[:, :2]))
    overhead = 64 * meta.num_samples + 8 * meta.num_samples + 4096  # records, index, header
    budgets = {BIG: decoded_bytes + overhead + (1 << 20), QUARTER: decoded_bytes // 4}
    samples = image_samples(folder)
    machine = machine_info(encoded)
    load_start = os.getloadavg()[0]
    jpeg_mb = sum(Path(p).stat().st_size for p, _ in samples) / 1e6
    print(f"# {machine.describe()}, torch {torch.__version__}")
    print(
        f"# {len(samples)} JPEGs ({jpeg_mb:.1f} MB,"
        f" mean {decoded_bytes / 3 / len(samples) / 1e3:.0f}"
        f" kpixels; made and packed in {prepared_s:.0f} s); decoded {decoded_bytes / 2**20:.0f}"
        f" MiB; budgets {budgets[BIG] / 2**20:.0f} and {budgets[QUARTER] / 2**20:.0f} MiB;"
        f" load average {load_start:.2f}"
    )
    kernels = kernel_table(samples, 30 if args.quick else 200)
    manager = multiprocessing.Manager()
    fresh, kept = loaders_of(args, samples, encoded, raw, budgets, manager)
    workers = {key: getattr(loader, "num_workers", 0) for key, loader in kept.items()}
    for number, loader in enumerate(kept.values()):  # fills the caches; starts the workers
        epoch(loader, number)

    rounds = Rounds()
    for number in range(args.rounds):
        for key, make in fresh.items():
            rounds.add(" / ".join(key), fresh_epoch(make))
        for key, loader in kept.items():
            # raw epochs take a fraction of a second: three per round, against the noise
            for repeat in range(3 if RAW in key[0] else 1):
                rounds.add(" / ".join(key), epoch(loader, 1 + 3 * number + repeat))
        print(f"# round {number + 1}/{args.rounds} done", file=sys.stderr)
    stats = {
        budget: kept[(f"h5pack {budget}, {AUTO}", "later epochs")].cache.stats()
        for budget in (BIG, QUARTER)
    }
    for loader in kept.values():
        if hasattr(loader, "close"):
            loader.close()
    del kept
    manager.shutdown()
    figures: dict[str, Any] = {
        "kernels_us": kernels,
        "images_per_s": {k: rounds.values(k) for k in rounds.runs},
        "images_per_cpu_s": {k: rounds.values(k, cpu=True) for k in rounds.runs},
    }
    report_rates(args, rounds, workers)
    figures["ratios"] = report_ratios(rounds)
    print(f"\ncache stats after the rounds (workers=auto): {stats}")
    figures["shuffle"] = report_shuffle(args, encoded, raw)
    if not args.no_memory:
        figures["memory"] = report_memory(args, encoded, budgets)
    print(f"\n# load average: {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    if args.json:
        args.json.write_text(json.dumps({"machine": asdict(machine), **figures}, indent=1))


def report_rates(args: argparse.Namespace, rounds: Rounds, workers: dict[Any, int]) -> None:
    print(
        f"\n## images/s and images per CPU-second, medians of {args.rounds} rounds"
        " (3 epochs per round for the raw pack)\n"
    )
    print("| loader | epoch | images/s | images per CPU-s | images/s each round |")
    print("|---|---|---:|---:|---|")
    for name in rounds.runs:
        loader, which = name.rsplit(" / ", 1)
        shown = ", ".join(f"{r:,.0f}" for r in rounds.values(name))
        print(
            f"| {loader} | {which} | {rounds.median(name):,.0f} |"
            f" {rounds.median(name, cpu=True):,.0f} | {shown} |"
        )


def report_ratios(rounds: Rounds) -> dict[str, list[float]]:
    later, first = "later epochs", "first epoch"
    rows = [("encoded, no cache", NO_CACHE, first, PEER, first, 1.5)]
    rows.append(("encoded, cache (first epoch fills it)", BIG, first, PEER, first, None))
    rows.append(("encoded, no cache", NO_CACHE, later, PEER, later, None))
    rows.append(("cache, large budget", BIG, later, PEER, later, 4.0))
    rows.append(("cache, large budget", BIG, later, MANAGER, later, 5.0))
    rows.append(("cache, 1/4 budget", QUARTER, later, f"h5pack {NO_CACHE}", later, 1.0))
    print("\n## ratios: medians of per-round ratios (images/s; images per CPU-s)\n")
    print(f"| h5pack | against | {AUTO} | {INPROC} | target |")
    print("|---|---|---:|---:|---|")
    figures = {}
    for label, ours, our_epoch, theirs, their_epoch, target in rows:
        cells = []
        for mode in (AUTO, INPROC):
            top = f"h5pack {ours}, {mode} / {our_epoch}"
            bottom = (
                f"{theirs}, {mode} / {their_epoch}"
                if theirs.startswith("h5pack")
                else (f"{theirs} / {their_epoch}")
            )
            wall, cpu = rounds.ratio(top, bottom), rounds.ratio(top, bottom, cpu=True)
            figures[f"{label} {our_epoch} vs {theirs} {their_epoch}, {mode}"] = [wall, cpu]
            cells.append(f"{wall:.2f}x; {cpu:.2f}x")
        goal = "" if target is None else f">= {target:g}x"
        print(
            f"| {label}, {our_epoch} | {theirs}, {their_epoch} | {cells[0]} | {cells[1]} | {goal} |"
        )
    raw = next(name for name in rounds.runs if RAW in name)
    print(
        f"| raw 256x256, RRC(224)+flip | images/s; per CPU-s | {rounds.median(raw):,.0f};"
        f" {rounds.median(raw, cpu=True):,.0f} | | >= 3,600 images/s |"
    )
    return figures


def report_shuffle(args: argparse.Namespace, encoded: Path, raw: Path) -> dict[str, Any]:
    print("\n## shuffle quality: jump entropy (bits) of the epoch order, mean of 3 epochs\n")
    print("| pack | today (no size=) | pipeline on (size=224) | same order | random permutation |")
    print("|---|---:|---:|---|---:|")
    figures = {}
    for label, pack, today, workers in (
        ("encoded", encoded, {"collate": "list"}, {"num_workers": 2}),
        ("raw 256x256", raw, {}, {}),
    ):
        before = make_loader(pack, args.batch_size, **today, **workers)
        after = h5_loader(pack, args, **workers)
        orders = [(epoch_order(before, e), epoch_order(after, e)) for e in range(3)]
        same = all(np.array_equal(a, b) for a, b in orders)
        entropy_before = statistics.mean(jump_entropy(a) for a, _ in orders)
        entropy_after = statistics.mean(jump_entropy(b) for _, b in orders)
        reference = jump_entropy(np.random.default_rng(0).permutation(len(orders[0][0])))
        figures[label] = [entropy_before, entropy_after, same, reference]
        print(
            f"| {label} | {entropy_before:.2f} | {entropy_after:.2f} | {same} | {reference:.2f} |"
        )
    return figures


def report_memory(
    args: argparse.Namespace, encoded: Path, budgets: dict[str, int]
) -> dict[str, Any]:
    print("\n## memory: peak PSS of the training process and its workers over two epochs\n")
    print(
        "| loader | budget MiB | cache resident MiB | total PSS MiB | over no cache MiB"
        " | within budget + 10% | images/s, epochs 1 and 2 |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    figures = {}
    modes: list[tuple[str, dict[str, Any]]] = [(INPROC, {"num_workers": 0, "threads": 2})]
    cases = [(NO_CACHE, 0), (QUARTER, budgets[QUARTER])]
    if not args.quick:
        modes.insert(0, (AUTO, {}))
        cases.append((BIG, budgets[BIG]))
    for mode, options in modes:
        baseline = measure_memory(encoded, options, args.batch_size)
        figures[f"{NO_CACHE}, {mode}"] = baseline
        for label, budget in cases:
            cache = {"cache": "decoded", "cache_bytes": budget} if budget else {}
            probe = (
                baseline
                if not budget
                else measure_memory(encoded, {**options, **cache}, args.batch_size)
            )
            figures[f"{label}, {mode}"] = probe
            extra = probe["peak_pss"] - baseline["peak_pss"]
            within = (
                str(extra <= 1.1 * budget and probe["peak_cache_pss"] <= budget) if budget else ""
            )
            shown = ", ".join(f"{r:,.0f}" for r in probe["images_per_s"])
            print(
                f"| {label}, {mode} | {budget / 2**20:,.0f}"
                f" | {probe['peak_cache_pss'] / 2**20:,.0f} | {probe['peak_pss'] / 2**20:,.0f}"
                f" | {extra / 2**20:,.0f} | {within} | {shown} |"
            )
    return figures


if __name__ == "__main__":
    main()
