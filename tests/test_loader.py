"""make_loader with real DataLoader workers: exactly once, ranks, resume, seeding, collate."""

from __future__ import annotations

import io
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.core.machine import available_cores
from h5pack.errors import OptionsError
from h5pack.read.crop import CropSpec
from h5pack.read.reader import ReaderOptions
from h5pack.training.cache import CacheSpec
from h5pack.training.dataset import H5ImageDataset, H5IterableDataset
from h5pack.training.loader import (
    auto_workers,
    collate_batch,
    make_loader,
    seed_everything,
)
from h5pack.training.prefetch import DevicePrefetcher
from h5pack.training.sampler import EpochSpec
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

NUM = 29  # divides nothing used here


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny gzip pack whose labels are the source index, so a label names its sample."""
    rng = np.random.default_rng(0)
    samples = [rng.integers(0, 256, (4, 3, 3), dtype=np.uint8) for _ in range(NUM)]
    path = tmp_path_factory.mktemp("packs") / "p.h5"
    options = ConvertOptions(chunk_samples=4, compression=Compression(codec="gzip"))
    write_arrays(path, samples, list(range(NUM)), options=options)
    return path


def pack_indices(path: Path, labels: list[int]) -> list[int]:
    """Map labels (= source indices) back to pack indices."""
    where = {int(s): i for i, s in enumerate(fmt.load_meta(path).source_index)}
    return [where[label] for label in labels]


def epoch_labels(loader: DataLoader) -> list[list[int]]:
    return [labels.tolist() for _, labels in loader]


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 on 2 cores
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_exactly_once_per_epoch_with_workers(pack, num_workers):
    loader = make_loader(
        pack, EpochSpec(batch_size=5, window_chunks=2), num_workers=num_workers, seed=1
    )
    first = epoch_labels(loader)
    assert sorted(i for b in first for i in b) == list(range(NUM))
    assert [len(b) for b in first] == [5] * 5 + [4]
    loader.set_epoch(1)
    second = epoch_labels(loader)
    assert sorted(i for b in second for i in b) == list(range(NUM))
    assert second != first
    # the batches are the sampler's, whatever the number of workers
    sampler = loader.chunk_sampler
    assert [pack_indices(pack, b) for b in second] == [b.tolist() for b in sampler.plan(1)]


@pytest.mark.slow  # spawned workers import torch again
def test_spawn_workers(pack):
    loader = make_loader(
        pack, 6, num_workers=1, seed=0, multiprocessing_context="spawn", persistent_workers=False
    )
    images, _ = next(iter(loader))
    assert images.shape == (6, 3, 4, 3)
    assert sorted(i for b in epoch_labels(loader) for i in b) == list(range(NUM))


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4])
def test_simulated_ranks_split_the_epoch(pack, num_replicas):
    per_rank = [
        epoch_labels(
            make_loader(
                pack,
                EpochSpec(batch_size=3, num_replicas=num_replicas, rank=r),
                num_workers=0,
                seed=5,
            )
        )
        for r in range(num_replicas)
    ]
    counts = Counter(i for batches in per_rank for b in batches for i in b)
    assert set(counts) == set(range(NUM))  # covering
    assert sum(counts.values()) - NUM == (-NUM) % num_replicas  # padding only
    assert len({len(batches) for batches in per_rank}) == 1  # equal batch counts
    dropped = [
        epoch_labels(
            make_loader(
                pack,
                EpochSpec(batch_size=3, num_replicas=num_replicas, rank=r),
                num_workers=0,
                seed=5,
                drop_last=True,
            )
        )
        for r in range(num_replicas)
    ]
    flat = [i for batches in dropped for b in batches for i in b]
    assert len(flat) == len(set(flat))  # disjoint
    assert len({len(batches) for batches in dropped}) == 1
    assert all(len(b) == 3 for batches in dropped for b in batches)


def test_same_seed_same_order_and_resume_mid_epoch(pack):
    def loader(num_workers: int = 0) -> DataLoader:
        return make_loader(
            pack, EpochSpec(batch_size=4, window_chunks=2), num_workers=num_workers, seed=9
        )

    a, b = loader(2), loader(2)
    a.set_epoch(3)
    b.set_epoch(3)
    full = epoch_labels(a)
    assert epoch_labels(b) == full

    it = iter(b)
    head = [next(it)[1].tolist() for _ in range(3)]
    state = b.state_dict()  # 3 delivered, although workers prefetched more
    assert state["position"] == 3
    assert state["epoch"] == 3
    del it

    resumed = loader(2)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)
    assert head + epoch_labels(resumed) == full
    assert epoch_labels(resumed) == full  # the next iteration is a whole epoch


def test_iterable_dataset_with_workers_exactly_once(pack):
    stream = H5IterableDataset(pack, EpochSpec(batch_size=4, seed=2, window_chunks=2))
    for num_workers in (0, 2):
        loader = DataLoader(
            stream, batch_size=4, num_workers=num_workers, persistent_workers=num_workers > 0
        )
        for epoch in (0, 1):
            stream.set_epoch(epoch)  # reaches the persistent workers
            labels = [i for _, b in loader for i in b.tolist()]
            assert sorted(labels) == list(range(NUM))
            reference = H5IterableDataset(pack, EpochSpec(batch_size=4, seed=2, window_chunks=2))
            reference.set_epoch(epoch)
            assert Counter(labels) == Counter(int(y) for _, y in reference)


def test_iterable_dataset_ranks(pack):
    seen: Counter[int] = Counter()
    lengths = set()
    for rank in range(3):
        stream = H5IterableDataset(pack, EpochSpec(batch_size=4, num_replicas=3, rank=rank))
        labels = [int(y) for _, y in stream]
        lengths.add(len(labels))
        assert len(labels) == len(stream)
        seen.update(labels)
    assert lengths == {10}
    assert set(seen) == set(range(NUM))


def test_return_path_and_hwc(pack):
    loader = make_loader(pack, 7, num_workers=0, return_path=True, output="hwc", shuffle=False)
    images, labels, paths = next(iter(loader))
    assert images.shape == (7, 4, 3, 3)
    assert paths == [f"sample-{int(y):06d}" for y in labels]


def test_collate_stacks_into_one_tensor():
    samples = [(torch.full((3, 2, 2), i, dtype=torch.uint8), i) for i in range(4)]
    images, labels = collate_batch(samples)
    assert images.shape == (4, 3, 2, 2)
    assert images[:, 0, 0, 0].tolist() == [0, 1, 2, 3]
    assert labels.tolist() == [0, 1, 2, 3]
    floats = [(torch.zeros(2), 1.5)]
    images, labels = collate_batch(floats)
    assert images.dtype == torch.float32


def test_transform_runs_in_workers(pack):
    loader = make_loader(pack, 5, num_workers=2, transform=lambda img: img.float() / 255)
    images, _ = next(iter(loader))
    assert images.dtype == torch.float32
    assert images.shape == (5, 3, 4, 3)


def test_auto_workers_policy(pack, tmp_path):
    assert auto_workers(H5ImageDataset(pack), cores=4) == (0, 4)  # gzip: threads in-process
    raw = tmp_path / "raw.h5"
    write_arrays(raw, [np.zeros((2, 2, 3), np.uint8)] * 3, [0, 0, 0])
    assert auto_workers(H5ImageDataset(raw), cores=4) == (0, 4)
    # cut to a training size: a per-sample resize, in worker processes
    sized = H5ImageDataset(raw, pipeline=CropSpec.of(2, crop="random-resized"))
    assert auto_workers(sized, cores=4) == (4, 0)
    assert auto_workers(H5ImageDataset(pack, transform=lambda x: x), cores=4) == (4, 0)
    encoded = tmp_path / "encoded.h5"
    jpeg = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(jpeg, format="JPEG")
    write_arrays(encoded, [jpeg.getvalue()] * 3, [0, 0, 0], options=ConvertOptions(mode="encoded"))
    assert auto_workers(H5ImageDataset(encoded), cores=4) == (4, 0)  # decoding: processes


def test_make_loader_arguments(pack):
    loader = make_loader(pack, 4, num_workers=2, seed=0)
    assert loader.persistent_workers
    assert loader.pin_memory == torch.cuda.is_available()
    assert loader.chunk_sampler.spec.num_workers == 2
    assert loader.dataset.options.window_chunks == loader.chunk_sampler.window_chunks
    with pytest.raises(OptionsError, match="num_workers should be"):
        make_loader(pack, 4, num_workers=-1)
    with pytest.raises(OptionsError, match="apply only when make_loader opens"):
        make_loader(H5ImageDataset(pack), 4, output="hwc")


def test_make_loader_never_changes_the_dataset_it_was_given(pack):
    options = ReaderOptions(threads=8, verify_checksums=True)
    dataset = H5ImageDataset(pack, reader=options)
    first = dataset[0][0]
    opened = dataset.reader
    loader = make_loader(dataset, 4, num_workers=2, seed=0)
    # the given dataset keeps its settings and its open reader...
    assert dataset.options == options
    assert dataset.options.window_chunks is None
    assert dataset.reader is opened
    assert torch.equal(dataset[0][0], first)
    # ...and the loader reads with a configured copy: the sampler's window, the same checks,
    # and the threads the user asked for
    assert loader.dataset is not dataset
    assert loader.dataset.options.window_chunks == loader.chunk_sampler.window_chunks
    assert loader.dataset.options.threads == 8
    assert loader.dataset.options.verify_checksums
    # a dataset without a thread setting gets the loader's: all cores in the main process
    in_process = make_loader(H5ImageDataset(pack), 4, num_workers=0)
    assert in_process.dataset.options.threads == available_cores()
    assert (
        make_loader(pack, 4, num_workers=0, reader=ReaderOptions(threads=3)).dataset.options.threads
        == 3
    )


def test_seed_everything_repeats_random_numbers():
    def draw() -> tuple[float, float, float]:
        return random.random(), float(np.random.random()), float(torch.rand(1))  # noqa: NPY002

    seed_everything(7)
    first = draw()
    seed_everything(7, deterministic=True)
    assert draw() == first
    assert torch.backends.cudnn.deterministic
    assert torch.are_deterministic_algorithms_enabled()
    seed_everything(7)
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_batches_reach_the_gpu(pack):
    loader = make_loader(pack, 8, num_workers=0)
    images, _ = next(iter(loader))
    assert images.is_pinned()
    assert images.cuda(non_blocking=True).shape == (8, 3, 4, 3)


def test_device_prefetcher_echoes_batches(pack):
    loader = make_loader(pack, 8, num_workers=0, shuffle=False)
    prefetched = DevicePrefetcher(loader, "cpu", echo=2)
    batches = [labels.tolist() for _, labels in prefetched]
    assert len(batches) == len(prefetched) == 2 * len(loader)
    assert batches[0::2] == batches[1::2] == epoch_labels(loader)
    prefetched.set_epoch(1)
    assert loader.chunk_sampler.epoch == 1
    with pytest.raises(OptionsError, match="echo should be an integer >= 1"):
        DevicePrefetcher(loader, "cpu", echo=0)


def test_device_prefetcher_normalises_uint8_batches_on_the_device(pack):
    loader = make_loader(pack, 8, num_workers=0, shuffle=False)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    plain = [images for images, _ in loader]
    normalised = [images for images, _ in DevicePrefetcher(loader, "cpu", normalize=(mean, std))]
    for raw, got in zip(plain, normalised, strict=True):
        assert raw.dtype == torch.uint8
        assert got.dtype == torch.float32
        want = (raw.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
            1, 3, 1, 1
        )
        torch.testing.assert_close(got, want)
    with pytest.raises(OptionsError, match="normalize should be"):
        DevicePrefetcher(loader, "cpu", normalize=((0.5,), (0.0,)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_prefetcher_on_cuda(pack):
    loader = make_loader(pack, 8, num_workers=0, shuffle=False)
    expected = epoch_labels(loader)
    got = []
    for images, labels in DevicePrefetcher(loader, "cuda"):
        assert images.is_cuda
        assert labels.is_cuda
        got.append(labels.cpu().tolist())
    assert got == expected


@pytest.mark.parametrize("threads", [0, 2])
def test_in_process_loader_decompresses_each_chunk_once_per_epoch(pack, threads):
    loader = make_loader(
        pack,
        EpochSpec(batch_size=3, window_chunks=2),
        num_workers=0,
        seed=4,
        reader=ReaderOptions(threads=threads),
    )
    chunks = loader.dataset.chunk_map.num_chunks
    for epoch in range(2):
        loader.set_epoch(epoch)
        before = loader.dataset.reader.loads
        assert sorted(i for b in epoch_labels(loader) for i in b) == list(range(NUM))
        loads = loader.dataset.reader.loads - before
        # epoch 0 reads every chunk once; later epochs find their first window's chunks
        # possibly still in the window
        assert loads == chunks if epoch == 0 else loads <= chunks


# -- the option objects at the public edge (issue 16.1) and bad arguments (issue 20 A, F) ---


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # A: a float batch size skipped samples every epoch (78 of 97 served at 2.5)
        ({"batch_size": 2.5}, r"batch_size should be an integer >= 1, but got batch_size=2\.5"),
        ({"batch_size": "8"}, "batch_size should be an integer >= 1, but got batch_size='8'"),
        ({"batch_size": None}, "batch_size should be an integer >= 1"),
        ({"seed": 2**70}, r"seed should be an integer in -2\*\*63 \.\. 2\*\*64 - 1"),
        ({"prefetch_factor": 0, "num_workers": 2}, "prefetch_factor should be an integer >= 1"),
        # a keyword of an older release names its new home
        ({"locking": False}, r"locking= moved to reader=ReaderOptions\(locking=\.\.\.\)"),
        ({"threads": 2}, r"threads= moved to reader=ReaderOptions\(threads=\.\.\.\)"),
        ({"cache_dir": "c"}, r"cache_dir= moved to reader=ReaderOptions\(disk_cache_dir="),
        ({"disk_cache_bytes": 0}, r"disk_cache_bytes= moved to reader=ReaderOptions\(disk_cache_"),
        ({"window_chunks": 2}, r"window_chunks= moved to epoch=EpochSpec\(window_chunks="),
        ({"stratify": True}, "stratify= is retired: every mix now holds its shares in every"),
        ({"scale": (0.5, 1.0)}, r"scale= moved to pipeline=CropSpec\(scale=\.\.\.\)"),
        ({"cache_bytes": 1}, r"cache_bytes= moved to cache=CacheSpec\(cache_bytes=\.\.\.\)"),
        ({"pin_memory": "yes"}, "pin_memory should be True or False or None"),
        ({"shuffle": 1}, "shuffle should be True or False"),
    ],
)
def test_bad_arguments_are_one_options_error_naming_them_when_built(pack, kwargs, message):
    args = {"batch_size": 4, "num_workers": 0, **kwargs}
    with pytest.raises(OptionsError, match=message):
        make_loader(pack, **args)


@pytest.mark.parametrize("path", [None, 5, [None], 2.5])
def test_a_path_that_is_no_path_is_an_options_error_naming_it(path):
    with pytest.raises(OptionsError, match="path_or_dataset should be a pack path"):
        make_loader(path, 4)
    with pytest.raises(OptionsError, match="path should be a pack path"):
        H5ImageDataset(path)


def test_a_too_small_cache_budget_names_cache_bytes(pack, tmp_path):
    encoded = tmp_path / "encoded.h5"
    jpeg = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(jpeg, format="JPEG")
    write_arrays(encoded, [jpeg.getvalue()] * 3, [0, 0, 0], options=ConvertOptions(mode="encoded"))
    with pytest.raises(OptionsError, match="cache_bytes should be at least"):
        make_loader(encoded, 4, size=4, cache=CacheSpec(cache_bytes=100), num_workers=0)


def test_option_objects_whole_give_the_loader_the_keywords_give(pack):
    from h5pack.training.options import loader_spec

    by_keywords = make_loader(
        pack,
        EpochSpec(batch_size=5, window_chunks=2),
        shuffle=True,
        seed=3,
        num_workers=0,
        reader=ReaderOptions(verify_checksums=False),
    )
    whole = make_loader(
        pack,
        epoch=EpochSpec(batch_size=5, seed=3, window_chunks=2),
        reader=ReaderOptions(verify_checksums=False),
        num_workers=0,
    )
    assert epoch_labels(whole) == epoch_labels(by_keywords)
    assert whole.chunk_sampler.spec == by_keywords.chunk_sampler.spec
    assert whole.dataset.options == by_keywords.dataset.options
    # a keyword replaces the field of its name in the object given
    replaced = make_loader(pack, epoch=EpochSpec(batch_size=5, seed=3), seed=4, num_workers=0)
    assert replaced.chunk_sampler.spec.seed == 4
    seven = make_loader(pack, 7, epoch=EpochSpec(batch_size=5), num_workers=0)
    assert seven.chunk_sampler.spec.batch_size == 7
    # the objects are what the keywords build, in one place
    spec = loader_spec(5, seed=3, size=8, storage_options={"anon": True})
    assert spec.epoch == EpochSpec(batch_size=5, seed=3)
    assert spec.reader == ReaderOptions(storage_options={"anon": True})
    assert spec.pipeline is not None
    assert spec.pipeline.size == (8, 8)
    assert spec.cache is None
    with pytest.raises(OptionsError, match="batch_size should be an integer >= 1, but none"):
        make_loader(pack)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['shufle'\\]"):
        make_loader(pack, 4, shufle=True)  # type: ignore[call-arg]


def test_make_loader_takes_at_most_30_keywords_each_a_field_of_its_object():
    import inspect
    from dataclasses import fields
    from typing import get_type_hints

    from h5pack.training.options import KEYWORDS, SpecKeywords, moved_message

    own = [p for p in inspect.signature(make_loader).parameters.values() if p.kind != p.VAR_KEYWORD]
    convenient = set(get_type_hints(SpecKeywords))
    assert len(own) + len(convenient) <= 30
    assert convenient == set().union(*KEYWORDS.values())
    homes = {"epoch": EpochSpec, "reader": ReaderOptions, "pipeline": CropSpec}
    for home, names in KEYWORDS.items():
        assert names <= {f.name for f in fields(homes[home])}
        assert all(moved_message(name) is None for name in names)


def test_a_dataset_refuses_the_objects_that_open_a_pack(pack):
    from h5pack.training.cache import CacheSpec

    dataset = H5ImageDataset(pack)
    for kwargs in (
        {"reader": ReaderOptions()},
        {"storage_options": {"anon": True}},
        {"size": 4},
        {"cache": CacheSpec(), "size": 4},
    ):
        with pytest.raises(OptionsError, match="apply only when make_loader opens"):
            make_loader(dataset, 4, **kwargs)


def test_options_docstring_examples():
    import doctest

    from h5pack.training import options

    assert doctest.testmod(options).failed == 0
