"""What converting into a bucket costs over converting locally (issue 17 item 2).

    python scripts/bench_upload.py [--images 600] [--size 128] [--shards 4]

One folder of generated JPEGs converted to raw pixels, locally and into a bucket of the
local ``rclone serve s3`` (through the counting proxy): one pack, a set of ``--shards``
shards, and the same set again (every shard reused). For each: the wall time and every
request the proxy counted, by method, with the bytes it sent back.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from h5pack.bench.s3local import Bucket, FaultProxy, S3Server
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.convert import convert
from h5pack.write.options import ConvertOptions
from h5pack.write.shards import convert_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="h5pack-upload-"))
    images = work / "images"
    spec = SampleSpec(num_images=args.images, num_classes=4, size=(args.size, args.size))
    make_image_folder(images, spec, photos=None)
    options = ConvertOptions(workers=args.workers, mode="raw")
    with S3Server(work / "s3") as server, FaultProxy(server.endpoint) as proxy:
        bucket = Bucket(server, proxy, "bench")
        store = {**bucket.storage_options, "read_timeout_s": 30.0}
        n = args.shards
        runs: list[tuple[str, Callable[[], Any]]] = [
            ("one pack, local", lambda: convert(images, work / "local.h5", options)),
            (
                "one pack, bucket",
                lambda: convert(images, bucket.url("pack.h5"), options, storage_options=store),
            ),
            (f"{n} shards, local", lambda: convert_set(images, work / "set", options, shards=n)),
            (
                f"{n} shards, bucket",
                lambda: convert_set(
                    images, bucket.url("set/"), options, shards=n, storage_options=store
                ),
            ),
            (
                f"{n} shards, bucket, rerun",
                lambda: convert_set(
                    images, bucket.url("set/"), options, shards=n, storage_options=store
                ),
            ),
        ]
        print(f"{'conversion':24s} {'s':>6s} {'MiB':>6s}  requests (bytes sent back)")
        for name, run in runs:
            proxy.reset_counts()
            started = time.perf_counter()
            report = run()
            elapsed = time.perf_counter() - started
            counts = proxy.reset_counts()
            size = getattr(report, "file_bytes", None) or sum(s.file_bytes for s in report.shards)
            said = ", ".join(f"{k} {v}" for k, v in sorted(counts.requests.items())) or "none"
            print(f"{name:24s} {elapsed:6.2f} {size / 2**20:6.1f}  {said} ({counts.body_bytes} B)")


if __name__ == "__main__":
    main()
