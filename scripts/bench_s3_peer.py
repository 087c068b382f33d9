"""h5pack's remote read against WebDataset's, from the same local S3 server (issue 17 item 7).

    python scripts/bench_s3_peer.py [--images 2000] [--size 128] [--workers 2]
                                    [--batch-size 64] [--shards 8] [--epochs 3]

The same JPEGs (generated, exactly H x W, so nobody resizes), the same loader settings
(batch size, workers, a shuffled order, uint8 (B, 3, H, W) tensors and int64 labels), read
from one ``rclone serve s3`` (``h5pack.bench.s3local``) through the counting proxy:

- h5pack: an encoded pack set of ``--shards`` shards converted into the bucket
  (``h5pack convert images/ s3://bench/h5/ --shards N --mode encoded``: the JPEG bytes as
  stored, so both read the same bytes), read with ``make_loader("s3://bench/h5/")``;
- WebDataset: ``--shards`` tar shards of the same files uploaded to the bucket, read through
  ``pipe:rclone cat ...`` URLs (WebDataset's way to stream from S3) with its shard shuffle
  and a shuffle buffer; and through fsspec (``s3fs``) when it imports;
- both from local disk too, for reference.

Each loader is created fresh (a remote h5pack loader with an empty disk cache, and once
with none) and runs ``--epochs`` epochs in a row; the loaders take turns, ``--rounds``
times. The table gives each epoch's median rate and CPU time per image over the rounds
(this process and its workers, the rclone processes of ``pipe:`` included) and what the
proxy counted: GETs, all requests and the bytes sent back over the JPEG bytes ("open": the
loader's creation, i.e. the metadata).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from h5pack.bench.s3local import Bucket, FaultProxy, S3Server
from h5pack.bench.system import machine_info, tree_cpu_s
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.loader import make_loader
from h5pack.write.options import ConvertOptions
from h5pack.write.shards import convert_set

# The peers' shared pieces (JPEG samples, tar shards, decode, collation) are bench_peers'.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import PHOTOS, check_batch, jpeg_samples, stack, wds_tuple, write_shards

BUCKET = "bench"


def rclone_url(server: S3Server, endpoint: str, key: str) -> str:
    """A WebDataset ``pipe:`` URL that streams ``key`` from the server with ``rclone cat``."""
    rclone = Path(sys.executable).parent / "rclone"
    flags = (
        f"--config /dev/null --s3-provider Other --s3-endpoint {endpoint} "
        f"--s3-access-key-id {server.access_key} --s3-secret-access-key {server.secret_key}"
    )
    return f"pipe:{rclone} cat {flags} :s3:{BUCKET}/{key}"


def wds_loader(urls: list[str], args: argparse.Namespace, **gopen: Any) -> Iterable[Any]:
    import webdataset as wds

    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False, **gopen)
        .shuffle(args.shuffle_buffer)
        .map(wds_tuple)
        .batched(args.batch_size, collation_fn=stack, partial=True)
    )
    persistent = {"persistent_workers": True} if args.workers else {}
    return wds.WebLoader(dataset, batch_size=None, num_workers=args.workers, **persistent)


def register_fsspec(options: dict[str, Any]) -> str | None:
    """Let WebDataset open ``s3://`` URLs through fsspec (s3fs); return why not, or None."""
    try:
        import fsspec
        import s3fs  # noqa: F401
    except ImportError as err:
        return f"skipped: s3fs does not import ({err})"
    import webdataset  # noqa: F401  (webdataset.gopen is also a function's name there)

    gopen_module = sys.modules["webdataset.gopen"]
    storage = {
        "key": options["access_key_id"],
        "secret": options["secret_access_key"],
        "client_kwargs": {"endpoint_url": options["endpoint"], "region_name": options["region"]},
    }

    def gopen_fsspec(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        return fsspec.open(url, mode, **storage).open()

    gopen_module.gopen_schemes["s3"] = gopen_fsspec
    return None


def check_first(batch: Any, size: int) -> str | None:
    """Return what is wrong with a peer's first batch (None: uint8 (B, 3, H, W), int64)."""
    return check_batch([batch], size)


def run_epochs(
    make: Callable[[], Iterable[Any] | str],
    proxy: FaultProxy,
    args: argparse.Namespace,
    stored_bytes: int,
) -> list[dict[str, Any]] | str:
    """Run ``args.epochs`` epochs of a fresh loader; each epoch's rate, CPU and counts.

    Epoch 0 is the loader's creation and open (its requests: the metadata).
    """
    proxy.reset_counts()
    loader = make()
    if isinstance(loader, str):
        return loader
    opened = proxy.reset_counts()
    rows: list[dict[str, Any]] = [
        {
            "epoch": 0,
            "requests": opened.total,
            "gets": opened.gets,
            "bytes_over_stored": opened.body_bytes / stored_bytes,
        }
    ]
    for epoch in range(1, args.epochs + 1):
        proxy.reset_counts()
        cpu, started = tree_cpu_s(), time.perf_counter()
        images = 0
        for batch in loader:
            if epoch == 1 and images == 0:
                problem = check_first(batch, args.size)
                if problem:
                    return f"skipped: {problem}"
            images += len(batch[1])
        elapsed, used = time.perf_counter() - started, tree_cpu_s() - cpu
        counts = proxy.reset_counts()
        rows.append(
            {
                "epoch": epoch,
                "images": images,
                "images_per_s": images / elapsed,
                "cpu_ms_per_image": 1e3 * used / max(1, images),
                "requests": counts.total,
                "gets": counts.gets,
                "bytes_over_stored": counts.body_bytes / stored_bytes,
            }
        )
    del loader
    return rows


def medians(rounds: list[list[dict[str, Any]] | str]) -> list[dict[str, Any]] | str:
    """Return each epoch's median rate and CPU over the rounds (counts: the last round's)."""
    done = [r for r in rounds if not isinstance(r, str)]
    if not done:
        return rounds[-1]
    found = []
    for k, row in enumerate(done[-1]):
        merged = dict(row)
        for key in ("images_per_s", "cpu_ms_per_image"):
            if key in row:
                merged[key] = statistics.median(r[k][key] for r in done)
                merged[key + "_all"] = [r[k][key] for r in done]
        found.append(merged)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="Runs of every loader, interleaved.")
    parser.add_argument("--shuffle-buffer", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="h5pack-s3-peer-"))
    folder = work / "images"
    spec = SampleSpec(num_images=args.images, num_classes=10, size=(args.size, args.size))
    make_image_folder(folder, spec, photos=PHOTOS, workers=os.cpu_count() or 1)
    samples = jpeg_samples(folder)
    stored = sum(len(data) for data, _ in samples)
    print(
        f"data: {args.images} JPEGs of {args.size}x{args.size}, {stored / 1e6:.1f} MB",
        file=sys.stderr,
    )
    print(f"machine: {machine_info(work).describe()} (shared)", file=sys.stderr)
    per_shard = -(-len(samples) // args.shards)
    tars = write_shards(samples, work / "wds", per_shard=per_shard)
    encoded = ConvertOptions(mode="encoded", workers=args.workers)
    local_set = work / "h5"
    convert_set(folder, local_set, encoded, shards=args.shards)

    results: dict[str, Any] = {}
    with S3Server(work / "s3") as server, FaultProxy(server.endpoint) as proxy:
        bucket = Bucket(server, proxy, BUCKET)
        options = dict(server.storage_options(proxy.endpoint))
        os.environ.update(
            AWS_ENDPOINT_URL=options["endpoint"],
            AWS_ACCESS_KEY_ID=options["access_key_id"],
            AWS_SECRET_ACCESS_KEY=options["secret_access_key"],
            AWS_REGION=options["region"],
        )
        keys = [f"wds/{Path(t).name}" for t in tars]
        for tar, key in zip(tars, keys, strict=True):
            bucket.put(tar, key)
        convert_set(folder, f"s3://{BUCKET}/h5/", encoded, shards=args.shards)
        fsspec_note = register_fsspec(options)
        cache = work / "cache"

        def h5pack_remote(**cached: Any) -> Iterable[Any]:
            shutil.rmtree(cache, ignore_errors=True)  # every run starts cold
            return make_loader(
                f"s3://{BUCKET}/h5/",
                args.batch_size,
                shuffle=True,
                num_workers=args.workers,
                seed=0,
                cache_dir=cache,
                **cached,
            )

        peers: dict[str, Callable[[], Iterable[Any] | str]] = {
            "h5pack, s3:// set, disk cache": h5pack_remote,
            "h5pack, s3:// set, no cache": lambda: h5pack_remote(cache_disk_bytes=0),
            "WebDataset, pipe:rclone cat": lambda: wds_loader(
                [rclone_url(server, proxy.endpoint, k) for k in keys], args
            ),
            "WebDataset, fsspec s3fs": lambda: (
                fsspec_note or wds_loader([f"s3://{BUCKET}/{k}" for k in keys], args)
            ),
            "h5pack, local set (encoded)": lambda: make_loader(
                local_set, args.batch_size, shuffle=True, num_workers=args.workers, seed=0
            ),
            "WebDataset, local tars": lambda: wds_loader(tars, args),
        }
        runs: dict[str, list[list[dict[str, Any]] | str]] = {name: [] for name in peers}
        for round_number in range(args.rounds):
            for name, make in peers.items():
                print(f"round {round_number + 1}: {name}", file=sys.stderr)
                try:
                    runs[name].append(run_epochs(make, proxy, args, stored))
                except Exception as err:  # a peer that fails is reported, not fatal
                    runs[name].append(f"failed: {type(err).__name__}: {err}")
        results = {name: medians(found) for name, found in runs.items()}

    print(
        f"\n{'loader':32s} {'epoch':>5s} {'images':>6s} {'images/s':>9s} {'CPU ms/img':>10s} "
        f"{'GETs':>6s} "
        f"{'requests':>8s} {'bytes/JPEG':>12s}"
    )
    for name, rows in results.items():
        if isinstance(rows, str):
            print(f"{name:32s} {rows}")
            continue
        for row in rows:
            if row["epoch"] == 0:
                print(
                    f"{name:32s}  open {'':6s} {'':9s} {'':10s} {row['gets']:6d} "
                    f"{row['requests']:8d} {row['bytes_over_stored']:12.3f}"
                )
                continue
            print(
                f"{name:32s} {row['epoch']:5d} {row['images']:6d} {row['images_per_s']:9,.0f} "
                f"{row['cpu_ms_per_image']:10.2f} {row['gets']:6d} {row['requests']:8d} "
                f"{row['bytes_over_stored']:12.2f}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=2
            )
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
