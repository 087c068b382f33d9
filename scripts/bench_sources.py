"""Converting the same images from each kind of source, side by side (issue 27 item 5).

    python scripts/bench_sources.py bench-data/sources --make 600 --rounds 3

Data: ``--make`` ImageNet-like JPEGs (``h5pack.synthetic.make_image_folder``, cut from
../shared/data/photos when present, 10 classes, around 500x375 with +-30% jitter) when the
folder is absent; beside it, the same images as a ``.tar``, a ``.tar.gz``, a deflated
``.zip`` and WebDataset shards (``ShardWriter``, 200 a shard), and as Parquet when a
``parquet`` kind is there (Hugging Face's layout: an ``image`` struct and a ``label``).
Each arm converts one source with the same options (``--modes``: ``raw`` at 256x256 and
``encoded``, ``--workers``), round by round, rotated (``bench_convert.interleaved``): the
median images/s, the ratio to the folder per round, CPU per image of the process tree.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_convert import HEADER, Measured, interleaved, timed

from h5pack import ConvertOptions, convert
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.write.sources import KINDS

PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"


def make_sources(folder: Path) -> dict[str, str]:
    """Write the folder's images as every other kind of source (once); return them by arm."""
    root = folder.parent
    name = folder.name
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    sources = {"folder": str(folder)}
    tar = root / f"{name}.tar"
    if not tar.exists():
        with tarfile.open(tar, "w") as archive:
            archive.add(folder, arcname=name)
    sources["tar"] = str(tar)
    for arm, form, suffix in (("tgz", "gztar", ".tar.gz"), ("zip", "zip", ".zip")):
        if not (root / f"{name}{suffix}").exists():
            shutil.make_archive(str(root / name), form, root, name)
        sources[arm] = str(root / f"{name}{suffix}")
    shards = root / f"{name}-shards"
    if not shards.exists():
        import webdataset as wds

        shards.mkdir()
        classes = sorted({p.parent.name for p in paths})
        with wds.ShardWriter(str(shards / "train-%06d.tar"), maxcount=200, verbose=0) as sink:
            for path in paths:
                key = path.relative_to(folder).with_suffix("").as_posix()
                sink.write(
                    {
                        "__key__": key,
                        "jpg": path.read_bytes(),
                        "cls": classes.index(path.parent.name),
                    }
                )
    sources["webdataset"] = str(shards)
    if "parquet" in KINDS:
        sources["parquet"] = str(_parquet_of(folder, paths, root / f"{name}.parquet"))
    return sources


def _parquet_of(folder: Path, paths: list[Path], target: Path) -> Path:
    """Write the images as one Parquet file in Hugging Face's layout (once)."""
    if target.exists():
        return target
    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = sorted({p.parent.name for p in paths})
    images = [{"bytes": p.read_bytes(), "path": p.relative_to(folder).as_posix()} for p in paths]
    labels = [classes.index(p.parent.name) for p in paths]
    features = {
        "image": {"_type": "Image"},
        "label": {"names": classes, "_type": "ClassLabel"},
    }
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    table = pa.table({"image": images, "label": pa.array(labels, pa.int64())})
    pq.write_table(table.replace_schema_metadata(meta), target, row_group_size=100)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--make", type=int, default=600, help="images to make if absent")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["raw", "encoded"])
    args = parser.parse_args()
    if not args.folder.exists():
        spec = SampleSpec(num_images=args.make, num_classes=10, size=(375, 500), size_jitter=0.3)
        make_image_folder(args.folder, spec, photos=PHOTOS if PHOTOS.is_dir() else None)
    sources = make_sources(args.folder)
    images = sum(1 for p in args.folder.rglob("*") if p.is_file())
    print(f"{images} images; sources: {', '.join(sources)}; workers {args.workers}")
    print(HEADER)
    with tempfile.TemporaryDirectory(dir=args.folder.parent) as tmp:
        for mode in args.modes:
            size = (256, 256) if mode == "raw" else None
            options = ConvertOptions(mode=mode, size=size, workers=args.workers)

            def arm(source: str, options: ConvertOptions = options) -> Callable[[], Measured]:
                def once() -> None:
                    convert(source, Path(tmp) / "bench.h5", options, overwrite=True)

                return lambda: timed(once, images)

            label = f"{mode}{' 256x256' if size else ''}"
            interleaved(label, args.rounds, {name: arm(src) for name, src in sources.items()})


if __name__ == "__main__":
    main()
