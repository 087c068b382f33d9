"""The worker hand-off and the raw read against memcpy, per CPU-second (issue 19 items 2-3).

    python scripts/bench_handoff.py --pack /tmp/ffbench/data/raw256.h5 --rounds 3

``handoff``: the raw 256 pack through ``make_loader(pack, 64, size=224,
crop="random-resized", flip=True)`` with ``num_workers=2`` and with ``num_workers=0,
threads=2``, one untimed epoch each, then interleaved rounds: CPU microseconds per image of
the whole process tree, and the median of per-round ratios (2 workers / main process).
``memcpy``: the same pack read without a crop (``num_workers=0, threads=2``) against copying
the same number of images per batch out of an in-memory array in a shuffled order (CPU of
this process, ``time.process_time``; 4 epochs of each per round).
``kernels``: one thread, ``time.thread_time``: a fresh shared-memory batch filled against a
reused one; ``preadv`` of one stored image against a copy out of an ``mmap`` of the pack;
torch's resize of a box copied contiguous against the strided box (pixels compared).
``floor``: the raw crop path and the raw copy against their kernels alone (``floor``'s
docstring).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loaders import tree_cpu_s

from h5pack import make_loader
from h5pack.read.reader import ReaderOptions

BATCH = 64


def per_cpu_s(loader: object, epoch: int) -> float:
    """Images per CPU-second of the process tree over one epoch of ``loader``."""
    loader.set_epoch(epoch)  # type: ignore[attr-defined]
    images, start = 0, tree_cpu_s()
    for _, labels in loader:  # type: ignore[attr-defined]
        images += len(labels)
    return images / (tree_cpu_s() - start)


def handoff(pack: Path, rounds: int) -> None:
    """2 worker processes against the main process with 2 threads."""

    def make(**kwargs: object) -> object:
        return make_loader(pack, BATCH, size=224, crop="random-resized", flip=True, **kwargs)

    loaders = {
        "2 workers": make(num_workers=2),
        "main, 2 threads": make(num_workers=0, reader=ReaderOptions(threads=2)),
    }
    for loader in loaders.values():
        per_cpu_s(loader, 0)
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for number in range(rounds):
        for name, loader in loaders.items():
            rates[name].append(per_cpu_s(loader, number + 1))
    for name, values in rates.items():
        print(f"{name}: us CPU per image {[round(1e6 / v) for v in values]}")
    pairs = zip(rates["2 workers"], rates["main, 2 threads"], strict=True)
    print(f"2 workers / main per CPU-s: {statistics.median(a / b for a, b in pairs):.2f}")


def memcpy(pack: Path, rounds: int, epochs: int = 4, batch: int = BATCH) -> None:
    """The raw pack read in-process against memcpy of the same images.

    Both in this process, so CPU is ``time.process_time`` (every thread, nanoseconds):
    ``tree_cpu_s`` counts 10 ms ticks, 11% of the ~90 ms one epoch of 2,000 images costs.
    Each round is ``epochs`` epochs of each arm, in an order that turns by one each round
    (the pack's 393 MB and the array's compete for the CPU's last-level cache, so the arm
    after another is colder): the loader, the copies, and the loader with the copy left out
    (what it costs per image besides the copy).
    """
    from h5pack.read import stored as stored_module

    loader = make_loader(pack, batch, num_workers=0, reader=ReaderOptions(threads=2))
    count = len(loader.dataset)
    shape = loader.dataset.meta.fixed_shape
    rng = np.random.default_rng(0)
    source = rng.integers(0, 255, (count, *shape), dtype=np.uint8)
    target = np.empty((batch, *shape), dtype=np.uint8)
    order = rng.permutation(count)
    epoch = [0]

    copy_mapped = stored_module.copy_mapped

    def reads(copy: bool = True) -> float:
        if not copy:  # the loader's own cost per batch: every step but the copy
            stored_module.copy_mapped = _nothing
        try:
            images, start = 0, time.process_time()
            for _ in range(epochs):
                loader.set_epoch(epoch[0])
                epoch[0] += 1
                for _, labels in loader:
                    images += len(labels)
            return images / (time.process_time() - start)
        finally:
            stored_module.copy_mapped = copy_mapped

    def copies() -> float:
        start = time.process_time()
        for _ in range(epochs):
            for first in range(0, count, batch):
                for j, i in enumerate(order[first : first + batch]):
                    target[j] = source[i]
        return epochs * count / (time.process_time() - start)

    arms: dict[str, Callable[[], float]] = {
        "memcpy": copies,
        "read": reads,
        "the loader with nothing copied": lambda: reads(copy=False),
    }
    found: dict[str, list[float]] = {name: [] for name in arms}
    for number in range(rounds + 1):  # the first round untimed
        names = list(arms)
        for name in names[number % len(names) :] + names[: number % len(names)]:
            value = arms[name]()
            if number:
                found[name].append(value)
    print(f"batch {batch}; us CPU per image, each round:")
    for name, values in found.items():
        print(f"  {name}: {[round(1e6 / v, 1) for v in values]}")
    for name, values in found.items():
        if name == "read":
            pairs = zip(values, found["memcpy"], strict=True)
            print(f"read / memcpy per CPU-s: {statistics.median(a / b for a, b in pairs):.2f}")


def kernels(pack: Path, repeats: int = 30) -> None:
    """The hand-off, read and resize kernels alone, microseconds of CPU per image."""
    import mmap
    import os

    import torch

    def per(run: object, count: int) -> float:
        start = time.thread_time()
        run()  # type: ignore[operator]
        return (time.thread_time() - start) / count * 1e6

    size = BATCH * 224 * 224 * 3
    filled = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    reused = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(size))

    def fresh() -> None:
        for _ in range(repeats):
            storage = torch.UntypedStorage._new_shared(size)
            torch.empty(0, dtype=torch.uint8).set_(storage).numpy()[:] = filled

    def again() -> None:
        for _ in range(repeats):
            reused.numpy()[:] = filled

    print(f"fresh shared batch filled: {per(fresh, repeats * BATCH):.0f} us per image")
    print(f"reused shared batch filled: {per(again, repeats * BATCH):.0f} us per image")

    image = 256 * 256 * 3
    fd = os.open(pack, os.O_RDONLY)
    length = os.fstat(fd).st_size
    offsets = np.random.default_rng(1).integers(0, length - image, 2000).tolist()
    buffer = np.empty(image, dtype=np.uint8)
    view = buffer.data.cast("B")
    mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    pixels = np.frombuffer(mapped, dtype=np.uint8)

    def pread() -> None:
        for offset in offsets:
            os.preadv(fd, [view], offset)

    def copy_mapped() -> None:
        for offset in offsets:
            np.copyto(buffer, pixels[offset : offset + image])

    copy_mapped()  # map the pages once
    print(f"preadv of a 256x256x3 image: {per(pread, len(offsets)):.0f} us")
    print(f"copy out of an mmap: {per(copy_mapped, len(offsets)):.0f} us")
    os.close(fd)  # the mapping stays until exit: numpy views it

    torch.set_num_threads(1)
    rng = np.random.default_rng(2)
    photo = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
    boxes = [
        (int(rng.integers(0, 100)), int(rng.integers(0, 150)),
         int(rng.integers(150, 275)), int(rng.integers(200, 350)))
        for _ in range(50)
    ]  # fmt: skip
    out = np.empty((224, 224, 3), dtype=np.uint8)
    resize = torch.ops.aten._upsample_bilinear2d_aa.out

    def resized(source: np.ndarray) -> np.ndarray:
        target = torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0)
        resize(torch.from_numpy(source).permute(2, 0, 1).unsqueeze(0), [224, 224], False,
               out=target)  # fmt: skip
        return out.copy()

    for top, left, height, width in boxes:
        box = photo[top : top + height, left : left + width]
        assert np.array_equal(resized(np.array(box, order="C")), resized(box))

    def contiguous() -> None:
        for _ in range(4):
            for t, lf, h, w in boxes:
                resized(np.array(photo[t : t + h, lf : lf + w], order="C"))

    def strided() -> None:
        for _ in range(4):
            for t, lf, h, w in boxes:
                resized(photo[t : t + h, lf : lf + w])

    print(f"resize to 224 of a copied box: {per(contiguous, 4 * len(boxes)):.0f} us")
    print(f"resize to 224 of the strided box (same pixels): {per(strided, 4 * len(boxes)):.0f} us")


def floor(pack: Path, rounds: int) -> None:
    """The raw paths against their kernels alone, side by side (issue 19's measured floors).

    Crop (raw 256, ``size=224, crop="random-resized", flip=True``): the loader's
    ``FixedSizeReader.read_into`` on every batch of a shuffled epoch, against a bare loop of
    its kernels on the same batches, planned beforehand (per sample: XXH3 of the mapped
    sample, the box copied contiguous, torch's resize into the batch, ``cv2.flip``), with 1
    and 2 threads; and the plan alone (``plan_crops`` and ``stored_views``). Copy: one
    thread, a cold XXH3 of each mapped sample, then its copy out of the cache, against a
    cold XXH3 of the same bytes in anonymous memory (2 MB pages) and a memcpy of them. CPU
    of this process per image, medians of rounds.
    """
    from concurrent.futures import ThreadPoolExecutor

    import cv2
    import torch

    from h5pack.core.integrity import contiguous_sample_digest
    from h5pack.read.cropplan import plan_crops

    digest = contiguous_sample_digest()
    assert digest is not None, "the floors need xxhash"
    datasets = {}
    for threads in (1, 2):
        loader = make_loader(
            pack,
            BATCH,
            size=224,
            crop="random-resized",
            flip=True,
            num_workers=0,
            reader=ReaderOptions(threads=threads),
        )
        for _ in loader:  # the reader opened, the file mapped, the pages touched once
            pass
        datasets[threads] = loader.dataset
    dataset = datasets[1]
    reader, fixed, meta = dataset.reader, dataset._fixed, dataset.meta
    count = len(dataset) // BATCH * BATCH
    order = np.random.default_rng(5).permutation(len(dataset))[:count]
    batches = [order[first : first + BATCH] for first in range(0, count, BATCH)]
    out = np.empty((BATCH, 224, 224, 3), dtype=np.uint8)
    pool = ThreadPoolExecutor(2)

    def planned(epoch: int) -> list[tuple[list[np.ndarray], list[tuple[object, bool]]]]:
        found = []
        for idx in batches:
            shapes = meta.shapes[idx]
            plans = plan_crops(fixed.spec, shapes[:, 0], shapes[:, 1], seed=0, epoch=epoch,
                               indices=idx)  # fmt: skip
            found.append((reader.stored_views(idx), plans))
        return found

    def cut(part: int, parts: int, views: list[np.ndarray], plans: list[object]) -> None:
        for k in range(part, len(views), parts):
            view = views[k]
            digest(view)
            (top, left, height, width), flip = plans[k]  # type: ignore[misc]
            box = np.array(view[top : top + height, left : left + width])
            target = out[k]
            torch.ops.aten._upsample_bilinear2d_aa.out(
                torch.from_numpy(box.transpose(2, 0, 1)[None]), [224, 224], False,
                out=torch.from_numpy(target.transpose(2, 0, 1)[None]),
            )  # fmt: skip
            if flip:
                cv2.flip(target, 1, dst=target)

    def kernels(parts: int, epoch: int) -> float:
        work = planned(epoch)
        start = time.process_time()
        for views, plans in work:
            if parts == 1:
                cut(0, 1, views, plans)
            else:
                list(pool.map(cut, range(parts), [parts] * parts, [views] * parts, [plans] * parts))
        return (time.process_time() - start) / count * 1e6

    def full(threads: int, epoch: int) -> float:
        cutter = datasets[threads]._fixed
        start = time.process_time()
        for idx in batches:
            cutter.read_into(idx, out, seed=0, epoch=epoch)
        return (time.process_time() - start) / count * 1e6

    def plan_only(epoch: int) -> float:
        start = time.process_time()
        planned(epoch)
        return (time.process_time() - start) / count * 1e6

    size = int(np.prod(meta.fixed_shape))
    mapped = reader.stored_views(np.arange(len(dataset)))
    assert mapped is not None, "the floors need a local uncompressed pack"
    anonymous = np.random.default_rng(0).integers(0, 255, (len(dataset), size), dtype=np.uint8)
    row = np.empty(size, dtype=np.uint8)

    def copy_kernels(kind: str) -> float:
        start = time.process_time()
        for i in order.tolist():
            if kind == "mapped":
                sample = mapped[i].reshape(-1).data
                digest(sample)
                row.data[:] = sample
            elif kind == "anonymous":
                digest(anonymous[i])
            elif kind == "mapped hash":
                digest(mapped[i])
            else:
                row.data[:] = anonymous[i].data
        return (time.process_time() - start) / count * 1e6

    cases: dict[str, Callable[[int], float]] = {
        "loader's cut, 1 thread": lambda e: full(1, e),
        "kernels alone, 1 thread": lambda e: kernels(1, e),
        "loader's cut, 2 threads": lambda e: full(2, e),
        "kernels alone, 2 threads": lambda e: kernels(2, e),
        "plan (plan_crops + stored_views)": plan_only,
        "copy: XXH3 of the mapped sample + copy out of the cache": lambda e: copy_kernels("mapped"),
        "copy: XXH3 of the mapped sample alone": lambda e: copy_kernels("mapped hash"),
        "copy: XXH3 of the same bytes in anonymous memory": lambda e: copy_kernels("anonymous"),
        "copy: memcpy out of anonymous memory": lambda e: copy_kernels("memcpy"),
    }
    found: dict[str, list[float]] = {name: [] for name in cases}
    for number in range(rounds + 1):  # the first round untimed
        names = list(cases)
        for name in names[number % len(names) :] + names[: number % len(names)]:
            value = cases[name](number)
            if number:
                found[name].append(value)
    for name, values in found.items():
        print(f"{name}: {statistics.median(values):.1f} us CPU per image "
              f"{[round(v, 1) for v in values]}")  # fmt: skip


def _nothing(*args: object, **kwargs: object) -> None:
    """The copy left out."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pack", type=Path, required=True, help="a raw pack (e.g. 256x256)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=BATCH, help="memcpy's batch size")
    parser.add_argument("--only", choices=("handoff", "memcpy", "kernels", "floor"), default=None)
    args = parser.parse_args(argv)
    if args.only in (None, "handoff"):
        handoff(args.pack, args.rounds)
    if args.only in (None, "memcpy"):
        memcpy(args.pack, args.rounds, batch=args.batch)
    if args.only in (None, "kernels"):
        kernels(args.pack)
    if args.only in (None, "floor"):
        floor(args.pack, args.rounds)


if __name__ == "__main__":
    main()
