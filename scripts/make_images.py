"""Make a deterministic folder of natural-looking images (for demos, tests, benchmarks).

Example::

    python scripts/make_images.py /tmp/images --num 2000 --classes 10 --size 375 500
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from h5pack.synthetic import SampleSpec, make_image_folder, photos_folder

# The project's real photographs, beside the checkout (see its README).
SHARED_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "photos"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write (must be empty or missing)")
    parser.add_argument("--num", type=int, default=2000, help="number of images")
    parser.add_argument("--classes", type=int, default=10, help="number of classes")
    parser.add_argument(
        "--size", type=int, nargs=2, default=(375, 500), metavar=("H", "W"), help="base size"
    )
    parser.add_argument(
        "--jitter", type=float, default=0.0, help="vary H and W by up to this fraction"
    )
    parser.add_argument("--format", choices=("jpeg", "png"), default="jpeg")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--photos",
        type=Path,
        default=None,
        help=f"folder of photographs to crop (default: {SHARED_PHOTOS}, if present)",
    )
    parser.add_argument(
        "--synthetic", action="store_true", help="use synthetic photographs, not --photos"
    )
    parser.add_argument("--flat", action="store_true", help="no class subfolders")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: none)")
    parser.add_argument("--overwrite", action="store_true", help="allow a non-empty OUT")
    args = parser.parse_args(argv)
    if args.synthetic and args.photos is not None:
        parser.error("--synthetic and --photos exclude each other")

    spec = SampleSpec(
        num_images=args.num,
        num_classes=args.classes,
        size=tuple(args.size),
        size_jitter=args.jitter,
        fmt=args.format,
        quality=args.quality,
        seed=args.seed,
        flat=args.flat,
    )
    default = SHARED_PHOTOS if SHARED_PHOTOS.is_dir() else None
    photos: Path | None = None if args.synthetic else (args.photos or default)
    source = photos_folder(photos)
    start = time.perf_counter()
    paths = make_image_folder(
        args.out, spec, photos=photos, workers=args.workers, overwrite=args.overwrite
    )
    elapsed_s = time.perf_counter() - start
    total_mb = sum(path.stat().st_size for path in paths) / 1e6
    layout = "flat" if args.flat else f"{min(args.classes, args.num)} classes"
    print(
        f"made {len(paths)} {args.format} images in {args.out} ({layout}, "
        f"photos: {source or 'synthetic'}): {total_mb:.1f} MB, "
        f"{1e3 * total_mb / len(paths):.1f} KB each, {elapsed_s:.1f} s"
    )


if __name__ == "__main__":
    main()
