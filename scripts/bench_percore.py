"""Where the CPU of one image goes, and the floors under it (issue 19 items 2-3, percore).

    python scripts/bench_percore.py --data /tmp/ffbench/data --only profile   # raw, jpeg, cache
    python scripts/bench_percore.py --data /tmp/ffbench/data --only decode
    python scripts/bench_percore.py --data /tmp/ffbench/data --only mapcopy
    python scripts/bench_percore.py --data /tmp/ffbench/data --only phase --rounds 5
    python scripts/bench_percore.py --data /tmp/ffbench/data --only box --rounds 5
    python scripts/bench_percore.py --data /tmp/ffbench/data --only photos --rounds 5
    python scripts/bench_percore.py --data /tmp/ffbench/data --only enlarge --rounds 3

``profile``: one epoch of ``make_loader(pack, 64, size=224, crop="random-resized",
flip=True, num_workers=0, threads=1)`` (torch one thread) under cProfile with
``time.thread_time`` (CPU, not wall), after one untimed epoch, for the raw 256 pack, the
encoded pack and the encoded pack with ``cache="decoded"``: the top calls by own time,
in us per image. ``decode``: the encoded pack's 2,000 JPEGs decoded in a row (OpenCV, as
the pipeline does), then each followed by a resize of a box (torch's kernel): the decode's
own CPU time in both, which shows what the resize costs the decode on the same core.
``mapcopy``: 4,000 copies of a 196 KB image at random places out of a read-only mapping of
the raw pack into a reused buffer, against the same out of anonymous memory; and out of
the mapping into batches of 64 images, a fresh ``torch.empty`` per batch against one
reused (one thread).

``phase``: the JPEG path's decode and resize phased within a thread's share (decode k
images, then cut those k; k = 1 is one after the other), for each k in interleaved rounds,
medians: (a) the kernels on one thread, the pack's upright JPEGs with ``plan_crops``'s
boxes, ``time.thread_time`` of each decode and of each cut (box copy, torch's kernel,
flip), and decodes alone in a row for reference; (b) the loop:
``FixedSizeReader.read_into`` of the encoded pack (``--threads`` reader threads, 2 by
default; RandomResizedCrop(224) + flip), every batch of 64 of a shuffled epoch cut with
each k in turn (the order rotated per batch) under ``FixedSizeReader.decode_phase = k``,
CPU of the process per image for each k.

``box``: the encoded pack's JPEGs, one thread, each decoded three ways in turn (the order
rotated per image): whole (``cv2.imdecode``, as the pipeline did), its RandomResizedCrop
box alone (``h5pack.core.jpegbox.decode_box``, ``plan_crops``'s boxes of a new epoch each
round) and, to show the floor, only the last row of the image (the entropy decoding of the
whole file, which no box avoids); ``time.thread_time`` of each, medians of rounds, and the
box / whole ratio per round.

``photos``: the real photographs at full size (``--photos``, default ../shared/data/photos:
mixed sizes, EXIF, large files), each cut to RandomResizedCrop(224) + flip by
``decode_crop_into`` (Pillow's filter, as ``make_loader``'s default), with box decodes and
with whole decodes in turn (``jpegbox.disabled()``), a new epoch's boxes each round (most
take a reduced decode, NOTE [ JPEG DCT scaling ]); process CPU per sample, medians, the
ratio per round, and whether every output was the same.

``enlarge``: 400 enlarging boxes (72-223 pixels a side) of a 256x256 synthetic photo
resized to 224x224 on one thread, by torch's kernel and by OpenCV's bilinear resize in
turn (``resize.ENLARGE_WITH_OPENCV``), ``time.thread_time`` per output, medians of
rounds, and the largest difference from Pillow's own resize.
"""

from __future__ import annotations

import argparse
import cProfile
import mmap
import os
import pstats
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from h5pack import make_loader
from h5pack.read.boxes import CropSpec
from h5pack.read.crop import decode_jpeg, upright_jpeg_header
from h5pack.read.cropplan import plan_crops
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.fixed_size import FixedSizeReader
from h5pack.training.resize import torch_resize_into

BATCH = 64

# torch's in-place antialiased bilinear kernel (NOTE [ Pillow's filter, computed by torch ])
AA_OUT = torch.ops.aten._upsample_bilinear2d_aa.out


def profile(data: Path, top: int) -> None:
    """The top calls by own CPU time of each path, us per image."""
    torch.set_num_threads(1)
    paths = {
        "raw 256": (data / "raw256.h5", {}),
        "jpeg": (data / "encoded.h5", {}),
        "jpeg cache": (data / "encoded.h5", {"cache": "decoded"}),
    }
    for name, (pack, extra) in paths.items():
        loader = make_loader(
            pack,
            BATCH,
            size=224,
            crop="random-resized",
            flip=True,
            num_workers=0,
            **extra,
            reader=ReaderOptions(threads=1),
        )
        images = 0
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            profiler = cProfile.Profile(time.thread_time)
            if epoch == 1:
                profiler.enable()
            for _, labels in loader:
                images += len(labels) if epoch == 1 else 0
            profiler.disable()
        stats = pstats.Stats(profiler)
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])  # type: ignore[attr-defined]
        total = sum(row[1][2] for row in rows)
        print(f"## {name}: {total / images * 1e6:.0f} us CPU per image under the profiler")
        for (file, line, function), (_, calls, own, _, _) in rows[:top]:
            where = function if file == "~" else f"{Path(file).name}:{line}({function})"
            print(f"{own / images * 1e6:8.1f} us  {calls / images:6.2f} calls  {where}")


def decode(data: Path) -> None:
    """Decodes in a row against decodes each followed by a resize."""
    torch.set_num_threads(1)
    with PackReader(data / "encoded.h5") as reader:
        files = [s.tobytes() for s in reader.read_stored(np.arange(reader.meta.num_samples))]
    flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    out = np.empty((224, 224, 3), dtype=np.uint8)

    def run(resize: bool) -> tuple[float, float]:
        decoding, start = 0.0, time.thread_time()
        for data_ in files:
            began = time.thread_time()
            pixels = cv2.imdecode(np.frombuffer(data_, np.uint8), flags)
            decoding += time.thread_time() - began
            if resize:
                torch_resize_into(pixels[10:300, 20:330], out)
        whole = time.thread_time() - start
        return decoding / len(files) * 1e6, whole / len(files) * 1e6

    for _ in range(2):
        alone, with_resize = run(False), run(True)
        print(
            f"decode alone {alone[0]:.0f} us; decode followed by a resize: the decode "
            f"{with_resize[0]:.0f}, both {with_resize[1]:.0f}"
        )


def mapcopy(data: Path) -> None:
    """Copies out of the file's mapping against copies out of anonymous memory."""
    size_bytes = 256 * 256 * 3
    fd = os.open(data / "raw256.h5", os.O_RDONLY)
    try:
        file_size = os.fstat(fd).st_size
        mapped = np.frombuffer(mmap.mmap(fd, file_size, prot=mmap.PROT_READ), dtype=np.uint8)
    finally:
        os.close(fd)
    anonymous = np.random.default_rng(0).integers(0, 255, file_size, dtype=np.uint8)
    out = np.empty(size_bytes, dtype=np.uint8)
    rng = np.random.default_rng(1)
    starts = (rng.integers(0, (file_size - size_bytes) // 4096, 4000) * 4096).tolist()

    def run(source: np.ndarray) -> float:
        for start in starts[:1000]:  # map the pages first
            np.copyto(out, source[start : start + size_bytes])
        began = time.thread_time()
        for start in starts:
            np.copyto(out, source[start : start + size_bytes])
        return (time.thread_time() - began) / len(starts) * 1e6

    def batches(fresh: bool) -> float:
        """Copies out of the mapping into batches of 64: a fresh tensor each, or one reused."""
        reused = torch.empty((BATCH, size_bytes), dtype=torch.uint8).numpy()
        began = time.thread_time()
        for first in range(0, len(starts) - BATCH + 1, BATCH):
            out = torch.empty((BATCH, size_bytes), dtype=torch.uint8).numpy() if fresh else reused
            for j, start in enumerate(starts[first : first + BATCH]):
                np.copyto(out[j], mapped[start : start + size_bytes])
        return (time.thread_time() - began) / len(starts) * 1e6

    for _ in range(2):
        print(
            f"copy 196 KB: from the mapping {run(mapped):.1f} us, anonymous {run(anonymous):.1f}; "
            f"into batches of 64, fresh {batches(True):.1f}, one reused {batches(False):.1f}"
        )


PHASES = (1, 2, 4, 8, 32)  # 32: a thread's whole share of a 64-image batch on 2 threads


def phase(data: Path, rounds: int, threads: int) -> None:
    """Decode k then cut k, for each k: the kernels on one thread, then the loop."""
    torch.set_num_threads(1)
    with PackReader(data / "encoded.h5") as reader:
        stored = reader.read_stored(np.arange(reader.meta.num_samples))
    datas = [s.tobytes() for s in stored]
    headers = [upright_jpeg_header(d, 3) for d in datas]
    jpegs = [(h, d) for h, d in zip(headers, datas, strict=True) if h is not None]
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    plans = plan_crops(
        spec,
        [h.height for h, _ in jpegs],
        [h.width for h, _ in jpegs],
        seed=0,
        epoch=0,
        indices=np.arange(len(jpegs)),
    )
    out = np.empty((224, 224, 3), dtype=np.uint8)
    size = [224, 224]

    def kernels(k: int) -> tuple[float, float, float]:
        """Microseconds per image: decode, cut, both; k = 0: decodes only, in a row."""
        decoding = cutting = 0.0
        start = time.thread_time()
        for first in range(0, len(jpegs), max(k, 1)):
            if k == 0:
                began = time.thread_time()
                decode_jpeg(jpegs[first][0], jpegs[first][1], name="x")
                decoding += time.thread_time() - began
                continue
            group = range(first, min(first + k, len(jpegs)))
            images = []
            for j in group:
                began = time.thread_time()
                images.append(decode_jpeg(jpegs[j][0], jpegs[j][1], name="x"))
                decoding += time.thread_time() - began
            for j, image in zip(group, images, strict=True):
                began = time.thread_time()
                (top, left, box_h, box_w), flip = plans[j]
                box = np.array(image[top : top + box_h, left : left + box_w])
                AA_OUT(
                    torch.from_numpy(box.transpose(2, 0, 1)[None]),
                    size,
                    False,
                    out=torch.from_numpy(out.transpose(2, 0, 1)[None]),
                )
                if flip:
                    cv2.flip(out, 1, dst=out)
                cutting += time.thread_time() - began
            del images
        whole = time.thread_time() - start
        n = len(jpegs) / 1e6
        return decoding / n, cutting / n, whole / n

    fixed = FixedSizeReader(
        PackReader(data / "encoded.h5", ReaderOptions(threads=threads)), spec, cache=None
    )
    defaults = FixedSizeReader.decode_phase, FixedSizeReader.decode_phase_bytes
    batch = np.empty((BATCH, 224, 224, 3), dtype=np.uint8)
    every = np.arange(fixed.reader.meta.num_samples)

    def loop(k: int, indices: np.ndarray, epoch: int) -> float:
        FixedSizeReader.decode_phase, FixedSizeReader.decode_phase_bytes = k, 1 << 62
        start = time.process_time()
        fixed.read_into(indices, batch[: len(indices)], seed=0, epoch=epoch)
        return time.process_time() - start

    fixed.read_into(every[:BATCH], batch, seed=0, epoch=0)  # untimed

    kernel_rows: dict[int, list[tuple[float, float, float]]] = {k: [] for k in (0, *PHASES)}
    loop_rows: dict[int, list[float]] = {k: [] for k in PHASES}
    for r in range(rounds):
        order = PHASES[r % len(PHASES) :] + PHASES[: r % len(PHASES)]  # rotated each round
        for k in (0, *order):
            kernel_rows[k].append(kernels(k))
        # the loop: each batch of an epoch cut with every k in turn (rotated per batch), the
        # process's CPU per image of each k over the epoch
        spent = dict.fromkeys(PHASES, 0.0)
        shuffled = np.random.default_rng(r).permutation(every)
        for b, first in enumerate(range(0, len(shuffled), BATCH)):
            indices = shuffled[first : first + BATCH]
            for k in PHASES[b % len(PHASES) :] + PHASES[: b % len(PHASES)]:
                spent[k] += loop(k, indices, 1 + r)
        for k in PHASES:
            loop_rows[k].append(spent[k] / len(every) * 1e6)
        print(f"round {r + 1}: loop " + ", ".join(f"k={k} {loop_rows[k][-1]:.0f}" for k in PHASES))
    base = np.array(loop_rows[1])
    print(f"{len(jpegs)} upright JPEGs; medians of {rounds} rounds, us per image")
    print("k  | kernels: decode  cut  whole | loop CPU | loop / k=1 (median of per-round ratios)")
    print(f"decodes only, in a row: {np.median([row[0] for row in kernel_rows[0]]):.0f}")
    for k in PHASES:
        dec, cut, whole = np.median(np.array(kernel_rows[k]), axis=0)
        ratio = np.median(np.array(loop_rows[k]) / base)
        print(
            f"{k:<3}| {dec:15.0f} {cut:4.0f} {whole:6.0f} | "
            f"{np.median(loop_rows[k]):8.0f} | {ratio:.3f}"
        )
    FixedSizeReader.decode_phase, FixedSizeReader.decode_phase_bytes = defaults


def box(data: Path, rounds: int) -> None:
    """Whole decodes against box decodes (NOTE [ Decoding only the box ]), side by side."""
    from h5pack.core import jpegbox

    if not jpegbox.available():
        print("box: the box decoder is not available (not built, or no libjpeg)")
        return
    with PackReader(data / "encoded.h5") as reader:
        files = [s.tobytes() for s in reader.read_stored(np.arange(reader.meta.num_samples))]
    headers = [upright_jpeg_header(f, 3) for f in files]
    keep = [j for j, h in enumerate(headers) if h is not None]
    files = [files[j] for j in keep]
    sizes = [(headers[j].height, headers[j].width) for j in keep]  # type: ignore[union-attr]
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    rows: dict[str, list[float]] = {"whole": [], "box": [], "last row": [], "ratio": []}
    area: list[float] = []
    for number in range(rounds):
        plans = plan_crops(
            spec,
            [h for h, _ in sizes],
            [w for _, w in sizes],
            seed=0,
            epoch=number,
            indices=np.arange(len(files)),
        )
        spent = {"whole": 0.0, "box": 0.0, "last row": 0.0}
        names = list(spent)
        for j, (data_, (height, width), (cut, _)) in enumerate(
            zip(files, sizes, plans, strict=True)
        ):
            for name in names[j % 3 :] + names[: j % 3]:
                began = time.thread_time()
                if name == "whole":
                    got = cv2.imdecode(np.frombuffer(data_, np.uint8), flags)
                else:
                    where = tuple(cut) if name == "box" else (height - 1, 0, 1, width)
                    got = jpegbox.decode_box(data_, (height, width), where, 3)
                spent[name] += time.thread_time() - began
                assert got is not None, name
            area.append(cut.height * cut.width / (height * width))
        for name, seconds in spent.items():
            rows[name].append(seconds / len(files) * 1e6)
        rows["ratio"].append(spent["box"] / spent["whole"])
        print(
            f"box round {number}: whole {rows['whole'][-1]:.0f} us, box {rows['box'][-1]:.0f}, "
            f"last row only {rows['last row'][-1]:.0f}; box / whole {rows['ratio'][-1]:.3f}"
        )
    print(
        f"box: {len(files)} JPEGs, mean box area {np.mean(area):.2f} of the image; medians: "
        f"whole {np.median(rows['whole']):.0f} us, box {np.median(rows['box']):.0f}, last row "
        f"only {np.median(rows['last row']):.0f}; box / whole {np.median(rows['ratio']):.3f}"
    )


def photos(folder: Path, rounds: int) -> None:
    """Real photos through decode_crop_into, box decodes against whole ones, side by side."""
    from h5pack.core import jpegbox
    from h5pack.read.crop import decode_crop_into

    if not jpegbox.available():
        print("photos: the box decoder is not available (not built, or no libjpeg)")
        return
    files = [p.read_bytes() for p in sorted(folder.glob("*.jpg"))]
    spec = CropSpec.of(224, crop="random-resized", flip=True)
    ratios, boxed_ms, whole_ms, same = [], [], [], True
    for number in range(rounds):
        spent = [0.0, 0.0]
        for index, data_ in enumerate(files):
            outs = []
            for way in (0, 1) if index % 2 else (1, 0):
                out = np.empty((224, 224, 3), dtype=np.uint8)
                began = time.process_time()
                if way == 0:
                    decode_crop_into(data_, spec, out, seed=0, epoch=number, index=index)
                else:
                    with jpegbox.disabled():
                        decode_crop_into(data_, spec, out, seed=0, epoch=number, index=index)
                spent[way] += time.process_time() - began
                outs.append(out)
            same = same and np.array_equal(outs[0], outs[1])
        boxed_ms.append(spent[0] / len(files) * 1e3)
        whole_ms.append(spent[1] / len(files) * 1e3)
        ratios.append(spent[0] / spent[1])
        print(
            f"photos round {number}: box decodes {boxed_ms[-1]:.1f} ms per sample, whole "
            f"{whole_ms[-1]:.1f}; {ratios[-1]:.3f}"
        )
    print(
        f"photos: {len(files)} photos x {rounds} epochs; medians: box decodes "
        f"{np.median(boxed_ms):.1f} ms per sample, whole {np.median(whole_ms):.1f}; box / "
        f"whole {np.median(ratios):.3f}; same pixels: {same}"
    )


def enlarge(rounds: int) -> None:
    """Enlarging boxes resized by torch's kernel and by OpenCV's bilinear resize, in turn."""
    from h5pack.read.crop import pillow_resize_into
    from h5pack.synthetic import synthesize_photo
    from h5pack.training import resize

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    image = synthesize_photo(rng, (256, 256))
    boxes = []
    for _ in range(400):
        h, w = int(rng.integers(72, 224)), int(rng.integers(72, 224))
        boxes.append((int(rng.integers(0, 256 - h)), int(rng.integers(0, 256 - w)), h, w))
    out = np.empty((224, 224, 3), dtype=np.uint8)
    times: dict[bool, list[float]] = {True: [], False: []}
    worst = {True: 0, False: 0}
    for _ in range(rounds):
        for switch in (False, True):
            resize.ENLARGE_WITH_OPENCV = switch
            spent = 0.0
            for top, left, h, w in boxes:
                source = np.ascontiguousarray(image[top : top + h, left : left + w])
                began = time.thread_time()
                torch_resize_into(source, out)
                spent += time.thread_time() - began
            times[switch].append(spent / len(boxes) * 1e6)
    reference = np.empty_like(out)
    for switch in (False, True):
        resize.ENLARGE_WITH_OPENCV = switch
        for top, left, h, w in boxes[:100]:
            source = np.ascontiguousarray(image[top : top + h, left : left + w])
            torch_resize_into(source, out)
            pillow_resize_into(source, reference)
            worst[switch] = max(worst[switch], int(np.abs(out.astype(int) - reference).max()))
    resize.ENLARGE_WITH_OPENCV = True
    print(
        f"enlarge: torch {np.median(times[False]):.0f} us per output (max {worst[False]} "
        f"level from Pillow), OpenCV {np.median(times[True]):.0f} us (max {worst[True]})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="bench_ffcv.py's --data")
    only = ("profile", "decode", "mapcopy", "phase", "box", "photos", "enlarge")
    parser.add_argument("--only", choices=only, default=None)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3, help="phase's and box's rounds")
    parser.add_argument("--threads", type=int, default=2, help="phase's reader threads")
    parser.add_argument(
        "--photos",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared" / "data" / "photos",
        help="photos' folder",
    )
    args = parser.parse_args(argv)
    if args.only in (None, "profile"):
        profile(args.data, args.top)
    if args.only in (None, "decode"):
        decode(args.data)
    if args.only in (None, "mapcopy"):
        mapcopy(args.data)
    if args.only in (None, "phase"):
        phase(args.data, args.rounds, args.threads)
    if args.only in (None, "box"):
        box(args.data, args.rounds)
    if args.only in (None, "photos"):
        photos(args.photos, args.rounds)
    if args.only in (None, "enlarge"):
        enlarge(args.rounds)


if __name__ == "__main__":
    main()
