"""Requests, bytes and CPU of converting sources in a bucket against the same local files.

Usage: ``python scripts/measure_bucket_sources.py [--images 600] [--rounds 3]``

Makes ``--images`` synthetic JPEGs in 10 classes, a tar, WebDataset shards and a Parquet
file of them, puts them in a bucket of the local S3 server (rclone) behind a counting proxy,
and converts each (encoded, 2 workers) from the bucket and from the local files: median CPU
per image (this process and its workers), and the proxy's requests and bytes (decision 0056).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from h5pack import ConvertOptions, convert
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.sources import sample_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3local import Bucket, FaultProxy, S3Server


def cpu() -> float:
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(-1)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def timed(run: Callable[[], object], rounds: int) -> float:
    spent = []
    for _ in range(rounds):
        start = cpu()
        run()
        spent.append(cpu() - start)
    return statistics.median(spent)


def inputs(root: Path, count: int) -> dict[str, Path]:
    """The image folder as a tar, WebDataset shards and a Parquet file (the users' writers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds

    images = root / "images"
    spec = SampleSpec(num_images=count, num_classes=10, size=(96, 128), size_jitter=0.3)
    make_image_folder(images, spec, photos=False)
    with tarfile.open(root / "train.tar", "w") as archive:
        archive.add(images, arcname="images")
    paths = sorted(images.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in paths})
    (root / "shards").mkdir()
    with wds.ShardWriter(str(root / "shards" / "train-%06d.tar"), maxcount=100, verbose=0) as sink:
        for p in paths:
            key = p.relative_to(images).with_suffix("").as_posix()
            sink.write({"__key__": key, "jpg": p.read_bytes(), "cls": classes.index(p.parent.name)})
    rows = [{"bytes": p.read_bytes(), "path": p.relative_to(images).as_posix()} for p in paths]
    pq.write_table(pa.table({"image": rows}), root / "train.parquet", row_group_size=100)
    return {
        "folder": images,
        "tar": root / "train.tar",
        "webdataset": root / "shards",
        "parquet": root / "train.parquet",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    options = ConvertOptions(mode="encoded", workers=2)
    with tempfile.TemporaryDirectory() as folder, S3Server(Path(folder) / "s3") as server:
        root = Path(folder)
        local = inputs(root, args.images)
        with FaultProxy(server.endpoint) as proxy:
            bucket = Bucket(server, proxy, "measure")
            for kind, path in local.items():
                url = bucket.put_tree(path, kind) if path.is_dir() else bucket.put(path, path.name)
                out = root / f"{kind}.h5"
                here = timed(
                    lambda p=path, o=out: convert(p, o, options, overwrite=True), args.rounds
                )
                proxy.reset_counts()
                there = timed(
                    lambda u=url, o=out: convert(
                        sample_source(u, storage_options=bucket.storage_options),
                        o,
                        options,
                        overwrite=True,
                    ),
                    args.rounds,
                )
                counts = proxy.reset_counts()
                size = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
                size = size or path.stat().st_size
                per = 1e3 / args.images
                print(
                    f"{kind:10s} CPU ms/image local {here * per:.2f} bucket {there * per:.2f} "
                    f"({there / here:.2f}x); per conversion: {counts.gets / args.rounds:.0f} GETs "
                    f"({counts.ranged_gets / args.rounds:.0f} ranged), "
                    f"{counts.body_bytes / args.rounds / size:.2f}x the source's bytes"
                )


if __name__ == "__main__":
    main()
