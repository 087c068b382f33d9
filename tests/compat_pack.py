"""The frozen format-v1 packs in tests/data and how they were made.

The samples are a pure function of a seed, so a test can regenerate the expected pixels
and compare them with what a current h5pack reads from the committed file. Rerun this
module (``python tests/compat_pack.py``, or ``python tests/compat_pack.py 1.1``) only when
a new format version is released, into a new file: the old files must never change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data"
V1_ARRAY = DATA / "v1_raw_gzip.h5"
V1_BLOB = DATA / "v1_raw_variable_zstd.h5"
CLASSES = ("cat", "dog")
# Format 1.1 (issue 16.5): written by the writer of December 2026, frozen so that a change
# to writer and reader together cannot pass unnoticed. An array pack (lz4, XXH3 per
# sample), an encoded blob pack of PNG files (zstd) and a pack set of two shards.
V11_ARRAY = DATA / "v1_1_raw_lz4.h5"
V11_ENCODED = DATA / "v1_1_encoded_png_zstd.h5"
V11_SET = DATA / "v1_1_set"


def v1_samples() -> tuple[list[np.ndarray], list[int], list[str]]:
    """Return the samples of the frozen packs: arrays, labels and paths."""
    rng = np.random.default_rng(20261129)
    images = [rng.integers(0, 256, (6, 8, 3), dtype=np.uint8) for _ in range(7)]
    labels = [i % 2 for i in range(7)]
    paths = [f"{CLASSES[label]}/img_{i}.png" for i, label in enumerate(labels)]
    return images, labels, paths


def v1_variable_samples() -> list[np.ndarray]:
    """Return the variable-size samples of the frozen blob pack."""
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (4 + i, 5 + 2 * i, 3), dtype=np.uint8) for i in range(5)]


def v11_samples() -> tuple[list[np.ndarray], list[int], list[str]]:
    """Return the samples of the frozen 1.1 packs and set: arrays, labels and paths."""
    rng = np.random.default_rng(20261201)
    images = [rng.integers(0, 256, (5 + i % 3, 7, 3), dtype=np.uint8) for i in range(11)]
    labels = [i % 2 for i in range(11)]
    paths = [f"{CLASSES[label]}/img_{i:02d}.png" for i, label in enumerate(labels)]
    return images, labels, paths


def png_bytes(array: np.ndarray) -> bytes:
    """Return ``array`` as a PNG file (lossless: it decodes to ``array``)."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def main_v11() -> None:
    """Write the frozen format-1.1 packs and set (run once; the files must never change)."""
    import tempfile

    from h5pack.core.layout import Compression
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions
    from h5pack.write.shards import convert_set

    images, labels, paths = v11_samples()
    same = [a[:5] for a in images]
    write_arrays(
        V11_ARRAY,
        same,
        labels,
        classes=CLASSES,
        paths=paths,
        options=ConvertOptions(chunk_samples=4, compression=Compression(codec="lz4"), seed=5),
    )
    write_arrays(
        V11_ENCODED,
        [png_bytes(a) for a in images],
        labels,
        classes=CLASSES,
        paths=paths,
        options=ConvertOptions(
            mode="encoded", chunk_bytes=1024, compression=Compression(codec="zstd"), seed=5
        ),
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images"
        for array, path in zip(images, paths, strict=True):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(png_bytes(array))
        convert_set(root, V11_SET, ConvertOptions(mode="raw", chunk_bytes=512, seed=5), shards=2)


def main() -> None:
    from h5pack.core.layout import Compression
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    images, labels, paths = v1_samples()
    write_arrays(
        V1_ARRAY,
        images,
        labels,
        classes=CLASSES,
        paths=paths,
        options=ConvertOptions(chunk_samples=3, compression=Compression(codec="gzip"), seed=3),
    )
    variable = v1_variable_samples()
    write_arrays(
        V1_BLOB,
        variable,
        labels[:5],
        classes=CLASSES,
        paths=paths[:5],
        options=ConvertOptions(chunk_bytes=256, compression=Compression(codec="zstd"), seed=3),
    )


if __name__ == "__main__":
    import sys

    main_v11() if sys.argv[1:] == ["1.1"] else main()
