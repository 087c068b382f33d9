"""Training over a pack set: make_loader, datasets, samplers, fixed size, decoded cache, DDP.

Every test compares the set with a single-pack conversion of the same images: a sample is
named by its source path, so pixels and labels are checked sample for sample.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image
from torch.utils.data import DataLoader

from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.core.packset import (
    MANIFEST_NAME,
    PackSetManifest,
    ShardEntry,
    shard_name,
    write_manifest,
)
from h5pack.errors import FormatError, PackNotFoundError
from h5pack.training.cache import CacheSpec
from h5pack.training.dataset import H5ImageDataset, H5IterableDataset
from h5pack.training.loader import make_loader
from h5pack.training.sampler import (
    ChunkBatchSampler,
    ChunkSampler,
    EpochSpec,
    sampler_for_labels,
)
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

COUNTS = (7, 5, 9, 8)  # 29 samples in 4 shards, of 3, 2, 3 and 3 chunks
CLASSES = ["a", "b", "c"]


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _images(kind: str, seed: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "mixed":  # every shard holds two sizes: each one is a blob pack
        return [
            rng.integers(0, 256, (6 + i % 2 * 3, 5 + i % 3, 3), dtype=np.uint8)
            for i in range(sum(COUNTS))
        ]
    return [rng.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(sum(COUNTS))]


def build(
    root: Path, kind: str = "array", codec: str = "zstd", seed: int = 7, shuffle: bool = True
) -> tuple[Path, Path]:
    """Write the images as a pack set (one write_arrays per shard) and as one pack.

    With ``shuffle=False`` the labels run in blocks (one class after another) and the
    shards keep that order.
    """
    images = _images(kind, seed)
    samples: list = [_png(a) for a in images] if kind == "encoded" else images
    labels = [i % 3 for i in range(len(images))]
    if not shuffle:
        labels = [3 * i // len(images) for i in range(len(images))]
    names = [f"img_{i:03d}.png" for i in range(len(images))]
    chunking: dict = {"chunk_samples": 3} if kind == "array" else {"chunk_bytes": 512}
    if kind == "encoded":
        chunking["mode"] = "encoded"
    options = ConvertOptions(
        **chunking, compression=Compression(codec=codec), seed=1, shuffle_samples=shuffle
    )
    root.mkdir(parents=True)
    entries, low = [], 0
    for index, count in enumerate(COUNTS):
        path = root / shard_name(index, len(COUNTS))
        part = slice(low, low + count)
        write_arrays(
            path,
            samples[part],
            labels[part],
            options=options,
            classes=CLASSES,
            paths=names[part],
        )
        low += count
        meta = fmt.load_meta(path)
        entries.append(ShardEntry.of(path, meta))
    manifest = PackSetManifest(
        root=root,
        shards=tuple(entries),
        classes=tuple(CLASSES),
        num_samples=len(images),
        seed=1,
        num_shards=len(COUNTS),
    )
    write_manifest(manifest)
    single = root.parent / f"{root.name}-single.h5"
    write_arrays(single, samples, labels, options=options, classes=CLASSES, paths=names)
    return root, single


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build(tmp_path_factory.mktemp("sets") / "set")


def reference(single: Path, **kwargs: object) -> dict[str, tuple[np.ndarray, int]]:
    """Every sample of the single pack by source path: (CHW pixels, label)."""
    out = {}
    for images, labels, paths in make_loader(
        single, 8, shuffle=False, num_workers=0, return_path=True, **kwargs
    ):
        for image, label, path in zip(images, labels.tolist(), paths, strict=True):
            out[path] = (image.numpy().copy(), label)
    return out


def deliveries(loader: DataLoader) -> list[tuple[np.ndarray, int, str]]:
    return [
        (image.numpy().copy(), label, path)
        for images, labels, paths in loader
        for image, label, path in zip(images, labels.tolist(), paths, strict=True)
    ]


def assert_exactly_once(got: list[tuple[np.ndarray, int, str]], want: dict) -> None:
    counts = Counter(path for _, _, path in got)
    assert sorted(counts) == sorted(want)
    assert set(counts.values()) == {1}
    for image, label, path in got:
        np.testing.assert_array_equal(image, want[path][0])
        assert label == want[path][1]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("form", ["directory", "manifest", "list"])
def test_make_loader_over_a_set_delivers_every_sample_once(packs, form, num_workers) -> None:
    root, single = packs
    source: object = {
        "directory": root,
        "manifest": root / MANIFEST_NAME,
        "list": sorted(root.glob("shard-*.h5")),
    }[form]
    want = reference(single)
    loader = make_loader(
        source,
        EpochSpec(batch_size=4, window_chunks=2),
        num_workers=num_workers,
        seed=3,
        return_path=True,
    )
    assert len(loader.dataset) == sum(COUNTS)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert_exactly_once(deliveries(loader), want)
    assert len(loader) == -(-sum(COUNTS) // 4)


def test_set_chunks_are_one_pool_split_across_files(packs) -> None:
    root, _ = packs
    sampler = ChunkBatchSampler(root, 4, seed=0, num_replicas=2, rank=0, window_chunks=2)
    assert sampler.chunk_map.num_chunks == 3 + 2 + 3 + 3
    cuts = np.cumsum(COUNTS)[:-1]
    served = {int(np.searchsorted(cuts, i, side="right")) for b in sampler for i in b}
    assert len(served) > 1  # a rank reads chunks of several shards, not one file each
    flat = list(ChunkSampler(root, EpochSpec(batch_size=4, num_replicas=1, rank=0)))
    assert sorted(flat) == list(range(sum(COUNTS)))


def test_label_mixing_of_a_set_in_shard_order(tmp_path) -> None:
    # shards written without shuffling, one class after another: chunks that do not mix
    root, _ = build(tmp_path / "sorted", shuffle=False)
    meta = H5ImageDataset(root).meta
    spec = EpochSpec(batch_size=2, num_replicas=1, rank=0, window_chunks=1)
    sampler, report = sampler_for_labels(root, spec, meta)
    assert report is not None
    assert report.warns
    assert str(root / MANIFEST_NAME) in report.message  # names the set
    assert sampler.spec.chunk_strata is not None  # stratified across every shard's chunks
    assert sorted(i for b in sampler for i in b) == list(range(sum(COUNTS)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_over_a_set(packs, num_workers) -> None:
    root, single = packs
    want = reference(single)
    stream = H5IterableDataset(
        H5ImageDataset(root, return_path=True),
        EpochSpec(batch_size=4, seed=2, window_chunks=2, num_replicas=1, rank=0),
    )
    loader = DataLoader(stream, batch_size=4, num_workers=num_workers)
    assert_exactly_once(deliveries(loader), want)


def test_fixed_size_over_a_set_of_mixed_sizes(tmp_path) -> None:
    root, single = build(tmp_path / "mixed", kind="mixed")
    assert fmt.load_meta(root / shard_name(0, len(COUNTS))).storage == "blob"
    want = reference(single, size=(4, 4), crop="resize")
    loader = make_loader(
        root, 5, size=(4, 4), crop="resize", num_workers=2, return_path=True, seed=1
    )
    assert_exactly_once(deliveries(loader), want)


def test_decoded_cache_over_a_set(tmp_path) -> None:
    root, single = build(tmp_path / "encoded", kind="encoded", codec="none")
    assert fmt.load_meta(single).mode == "encoded"
    want = reference(single, size=(4, 3), crop="center")
    with make_loader(
        root,
        5,
        size=(4, 3),
        crop="center",
        cache=CacheSpec(cache_bytes=1 << 20),
        num_workers=2,
        return_path=True,
    ) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            assert_exactly_once(deliveries(loader), want)
        assert loader.cache is not None
        stats = loader.cache.stats()
        assert stats.entries == sum(COUNTS)
        assert stats.hits >= sum(COUNTS)  # the second epoch decoded nothing


def test_missing_truncated_and_changed_shards_are_refused_by_name(tmp_path) -> None:
    root, _ = build(tmp_path / "missing")
    victim = root / shard_name(2, len(COUNTS))
    victim.unlink()
    with pytest.raises(PackNotFoundError, match=victim.name):
        make_loader(root, 4, num_workers=0)

    root, _ = build(tmp_path / "truncated")
    victim = root / shard_name(1, len(COUNTS))
    os.truncate(victim, victim.stat().st_size - 100)
    with pytest.raises(FormatError, match=victim.name):
        make_loader(root, 4, num_workers=0)

    root, _ = build(tmp_path / "changed")
    victim = root / shard_name(3, len(COUNTS))
    write_arrays(
        victim,
        _images("array")[: COUNTS[3]],
        [0] * COUNTS[3],
        options=ConvertOptions(chunk_samples=3),
        classes=CLASSES,
        overwrite=True,
    )
    with pytest.raises(FormatError, match=rf"{victim.name}: the shard changed"):
        make_loader(root, 4, num_workers=0)


def test_a_shard_replaced_after_the_loader_was_made_is_refused(tmp_path) -> None:
    root, _ = build(tmp_path / "set")
    loader = make_loader(root, 4, num_workers=0, shuffle=False)
    victim = root / shard_name(0, len(COUNTS))
    replacement = tmp_path / "replacement.h5"
    write_arrays(
        replacement,
        _images("array")[: COUNTS[0]],
        [1] * COUNTS[0],
        options=ConvertOptions(chunk_samples=3),
        classes=CLASSES,
    )
    os.replace(replacement, victim)
    with pytest.raises(FormatError, match=victim.name):
        next(iter(loader))


# -- torch.distributed ---------------------------------------------------------------------


def _rank_main(rank: int, world: int, root: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world
    )
    try:
        result = {}
        for num_workers in (0, 2):
            loader = make_loader(
                root,
                EpochSpec(batch_size=3, window_chunks=2),
                num_workers=num_workers,
                seed=5,
                return_path=True,
            )
            loader.set_epoch(1)
            batches = [paths for _, _, paths in loader]
            result[str(num_workers)] = {"len": len(loader), "batches": batches}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_exactly_once_under_torch_distributed(packs, tmp_path, world) -> None:
    root, _ = packs
    # fork: the ranks start without importing torch again (spawn took ~3 s a rank here)
    mp.start_processes(
        _rank_main,
        args=(world, str(root), str(tmp_path)),
        nprocs=world,
        join=True,
        start_method="fork",
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    total = sum(COUNTS)
    names = {f"img_{i:03d}.png" for i in range(total)}
    for num_workers in ("0", "2"):
        runs = [r[num_workers] for r in results]
        assert len({len(run["batches"]) for run in runs}) == 1  # equal batches on every rank
        assert all(run["len"] == len(run["batches"]) for run in runs)
        served = Counter(p for run in runs for batch in run["batches"] for p in batch)
        assert set(served) == names
        # padding (sampler note "Ranks"): ceil(N / R) per rank, the extra R*ceil(N/R) - N
        # samples served twice, each a different one
        padding = world * -(-total // world) - total
        assert sum(served.values()) == total + padding
        assert max(served.values()) <= 2
        assert sum(1 for c in served.values() if c == 2) == padding
