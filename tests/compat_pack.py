"""The frozen format-v1 packs in tests/data and how they were made.

The samples are a pure function of a seed, so a test can regenerate the expected pixels
and compare them with what a current h5pack reads from the committed file. Rerun this
module (``python tests/compat_pack.py``) only when a new format version is released, into
a new file: the old file must never change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data"
V1_ARRAY = DATA / "v1_raw_gzip.h5"
V1_BLOB = DATA / "v1_raw_variable_zstd.h5"
CLASSES = ("cat", "dog")


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
    main()
