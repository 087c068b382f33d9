"""Small builders shared by the tests: seeded arrays, image files, packs, expected order."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from h5pack.core import format as fmt
from h5pack.core.layout import ChunkMap
from h5pack.read.crop import CropSpec, ResizeInto, decode_crop_into
from h5pack.read.setreader import open_reader
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.s3local import Counts

NUM = 37  # divides no chunk size used in the tests
SHAPE = (6, 5, 3)


def arrays(num: int = NUM, shape: tuple[int, ...] = SHAPE, seed: int = 0) -> list[np.ndarray]:
    """Return ``num`` seeded uint8 images of ``shape``, smooth-ish so that codecs compress."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (num, 1, 1, shape[-1]), dtype=np.uint8)
    noise = rng.integers(0, 8, (num, *shape), dtype=np.uint8)
    return list(base + noise)


def random_arrays(num: int, shape: tuple[int, ...] = (8, 10, 3), seed: int = 0) -> list[np.ndarray]:
    """Return ``num`` seeded uint8 images of uniform noise (incompressible)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(num)]


def jpeg(
    array: np.ndarray,
    quality: int = 90,
    *,
    orientation: int = 1,
    mode: str | None = None,
    **options: object,
) -> bytes:
    """Return ``array`` encoded as JPEG bytes.

    Converted to ``mode`` first when given, with an EXIF ``orientation`` when it is not 1,
    and Pillow's other save ``options`` (``subsampling``, ``progressive``...).
    """
    image = Image.fromarray(array)
    if mode is not None:
        image = image.convert(mode)
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality, **options)
    return buffer.getvalue()


def crops_one_by_one(
    stored: list[np.ndarray],
    spec: CropSpec,
    out: np.ndarray,
    *,
    seed: int,
    epoch: int,
    resize: ResizeInto,
) -> np.ndarray:
    """Fill ``out[k]`` with ``decode_crop_into`` of ``stored[k]`` (index ``k``), and return it.

    The sample-by-sample reference the per-batch loops are compared with.
    """
    for index, data in enumerate(stored):
        decode_crop_into(
            data.tobytes(), spec, out[index], seed=seed, epoch=epoch, index=index,
            resize=resize,
        )  # fmt: skip
    return out


def png(array: np.ndarray) -> bytes:
    """Return ``array`` encoded as PNG bytes."""
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def make_pack(path: Path, *, samples: list | None = None, **options: object) -> Path:
    """Write ``samples`` (default ``arrays()``) with labels ``i % 4``; return the path."""
    samples = arrays() if samples is None else samples
    labels = [i % 4 for i in range(len(samples))]
    write_arrays(path, samples, labels, options=ConvertOptions(**options))  # type: ignore[arg-type]
    return path


def expected(path: Path, samples: list[np.ndarray]) -> list[np.ndarray]:
    """Return ``samples`` in the pack's stored order (through its ``source_index``)."""
    meta = fmt.load_meta(path)
    return [samples[int(s)] for s in meta.source_index]


def make_folder(
    root: Path,
    *,
    classes: tuple[str, ...] = ("cat", "dog"),
    per_class: int = 4,
    size: tuple[int, int] = (12, 16),
    ext: str = "jpg",
    vary: bool = False,
) -> list[Path]:
    """Write a tiny ImageFolder tree of smooth, noisy images; return the file paths."""
    rng = np.random.default_rng(len(classes) * 100 + per_class)
    paths = []
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = (size[0] + i, size[1] + 2 * c) if vary else size
            y, x = np.mgrid[0:h, 0:w]
            base = np.stack([x * 9 + 40 * c, y * 11, (x + y) * 5 + 17 * i], axis=-1)
            pixels = np.clip(base + rng.integers(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
            path = root / name / f"{i:03d}.{ext}"
            Image.fromarray(pixels).save(path)
            paths.append(path)
    return paths


def pil_rgb(path: Path, size: tuple[int, int] | None = None) -> np.ndarray:
    """The independent reference: Pillow's own decode (and bilinear resize)."""
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        if size is not None:
            rgb = rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        return np.asarray(rgb)


def assert_aligned(offsets: np.ndarray, sizes: np.ndarray, chunk_bytes: int) -> None:
    """Check NOTE [ Aligned blobs ]: slots never straddle a chunk unless larger than one."""
    for start, size in zip(offsets[:-1], sizes, strict=True):
        if size <= chunk_bytes:  # never straddles a boundary
            assert start // chunk_bytes == (start + size - 1) // chunk_bytes
        else:  # owns whole chunks from a boundary
            assert start % chunk_bytes == 0
    assert np.all(np.diff(offsets) >= sizes)
    # Every group of the chunk map covers whole chunks only.
    cmap = ChunkMap.for_blob(offsets, chunk_bytes)
    for group in range(cmap.num_chunks - 1):
        first = cmap.samples(group).start
        assert offsets[first] % chunk_bytes == 0 or first == 0
        nxt = cmap.samples(group + 1).start
        assert offsets[nxt] % chunk_bytes == 0


def contents(source: Path | list[Path]) -> list[tuple[str, int, int, bytes]]:
    """Every sample of a pack or pack set, in order: path, label, source index, pixels."""
    with open_reader(source) as reader:
        meta = reader.meta
        images = reader.read_images(range(meta.num_samples))
        paths = list(reader.paths)
    return [
        (paths[i], int(meta.labels[i]), int(meta.source_index[i]), images[i].tobytes())
        for i in range(meta.num_samples)
    ]


class FakeClock:
    """A clock the test moves: ``advance(s)`` passes time, each reading adds ``tick`` seconds.

    Timing code takes ``clock=`` (see the note "Timing enough work"), so its logic is tested
    without a wall clock: no test compares measured times or rates.
    """

    def __init__(self, tick: float = 0.0) -> None:
        self.now = 0.0
        self.tick = tick

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def shared_photos() -> Path:
    """The project's real photographs: ``shared/data/photos`` in the checkout or above it.

    Found from this file (a checkout sits in the shared tree, or holds ``shared/``
    itself), never a machine's absolute path; tests skip when it is not there.
    """
    root = Path(__file__).resolve().parents[1]
    for base in (root, *root.parents):
        candidate = base / "shared" / "data" / "photos"
        if candidate.is_dir():
            return candidate
    return root / "shared" / "data" / "photos"


def wait_for_a_chunk_get(
    counts: Callable[[], Counts], pack: Path, alive: Callable[[], bool]
) -> None:
    """Wait until a proxy has seen a ranged GET of ``pack``'s chunks, or ``alive()`` is False.

    A remote read claims a chunk in the disk cache's ledger before it asks for its bytes, so
    then a claim is in the ledger: the event a kill test needs, however busy the machine.
    """
    from h5pack.core.description import HDF5Index
    from h5pack.read.direct import chunk_table

    with fmt.open_h5(pack) as handle:
        table = chunk_table(HDF5Index(handle, str(pack)))
    assert table is not None
    first = int(table.offsets.min())

    def seen() -> bool:
        starts = [r.removeprefix("bytes=").split("-")[0] for _, r in counts().ranges]
        return any(start.isdigit() and int(start) >= first for start in starts)

    while alive() and not seen():
        time.sleep(0.05)


def disk_cache_reserve(tmp_path: Path) -> int:
    """Return what a disk cache's directory takes besides its chunks, some growth in.

    A test's budget of ``n`` chunks is this plus their bytes (the budget bounds the whole
    directory: the ledger, its WAL, the folders).
    """
    from h5pack.read import ledger
    from h5pack.read.diskcache import DiskCache, DiskCacheOptions
    from h5pack.read.eviction import Future

    probe = DiskCache(DiskCacheOptions(directory=tmp_path / "probe", budget_bytes=1 << 20))
    probe.set_future("p", Future.of(list(range(80)) * 2, np.arange(160) / 80), now=0.0)
    probe.close()
    return ledger.overhead_bytes(tmp_path / "probe") + ledger.GROWTH + 16 * ledger.BLOCK


def photo_folder(
    root: Path, classes: tuple[str, ...], *, per_class: int = 3, seed: int = 0
) -> Path:
    """Write an ImageFolder tree of real photos (``shared_photos``), downsized, as JPEGs.

    Each image has a size of its own (about 40-70 pixels a side); skips when the photos
    are not there.
    """
    import pytest

    photos = sorted(shared_photos().glob("*.jpg"))
    if len(photos) < len(classes) * per_class:
        pytest.skip(f"needs {len(classes) * per_class} photos in {shared_photos()}")
    rng = np.random.default_rng(seed)
    for i, photo in enumerate(photos[: len(classes) * per_class]):
        folder = root / classes[i % len(classes)]
        folder.mkdir(parents=True, exist_ok=True)
        with Image.open(photo) as image:
            size = (int(rng.integers(40, 70)), int(rng.integers(40, 70)))
            image.convert("RGB").resize(size).save(folder / f"{photo.stem}.jpg", quality=90)
    return root


def pack_samples(path: Path, fields: list[str] | tuple[str, ...] = ()) -> dict[str, dict]:
    """Every sample of a pack by key: its pixels, class name (None) and ``fields``.

    A multi-label field is given as its class names.
    """
    from h5pack.core.fields import MultiLabelField, fields_of
    from h5pack.read.reader import PackReader

    with PackReader(path) as reader:
        meta, indices = reader.meta, np.arange(len(reader))
        images = reader.read_images(indices)
        values = reader.read_fields(indices, list(fields))
        keys = reader.paths
    kinds = {f.name: f for f in fields_of(meta)}
    found = {}
    for i, key in enumerate(keys):
        label = int(meta.labels[i])
        sample: dict = {"image": images[i], "label": meta.classes[label] if label >= 0 else None}
        for name in fields:
            value = values[name][i]
            kind = kinds[name]
            sample[name] = kind.names(value) if isinstance(kind, MultiLabelField) else value
        found[key] = sample
    return found


def interior(mask: np.ndarray, margin: int = 2) -> np.ndarray:
    """Pixels whose whole (2 * margin + 1) square has the same mask value (away from edges)."""
    padded = np.pad(mask, margin, mode="edge")
    same = np.ones(mask.shape, bool)
    for dy in range(2 * margin + 1):
        for dx in range(2 * margin + 1):
            same &= padded[dy : dy + mask.shape[0], dx : dx + mask.shape[1]] == mask
    return same


def table_of_pack(pack: Path) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(offsets, sizes)`` of a local pack's stored image chunks (direct path)."""
    from h5pack.core.description import HDF5Index
    from h5pack.read.direct import chunk_table

    with fmt.open_h5(pack) as handle:
        table = chunk_table(HDF5Index(handle, str(pack)))
    assert table is not None
    return table.offsets, table.sizes
