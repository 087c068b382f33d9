"""H5ImageDataset / H5IterableDataset / PackReader reads: pixels, outputs, errors, reads."""

from __future__ import annotations

import fcntl
import pickle
from collections import Counter

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from h5pack.core import format as fmt
from h5pack.core.layout import Compression
from h5pack.errors import FormatError, OptionsError, PackNotFoundError
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.dataset import H5ImageDataset, H5IterableDataset
from h5pack.training.sampler import ChunkBatchSampler, EpochSpec
from tests.helpers import NUM, arrays, expected, make_pack, png


@pytest.mark.parametrize(
    "options",
    [
        {"layout": "contiguous"},
        {"chunk_samples": 1},
        {"chunk_samples": 37},
        {"chunk_samples": 5, "compression": Compression(codec="gzip")},
    ],
)
def test_every_array_layout_round_trips(tmp_path, options):
    samples = arrays()
    path = make_pack(tmp_path / "p.h5", samples=samples, **options)
    want = expected(path, samples)
    ds = H5ImageDataset(path, output="hwc")
    batch = ds.__getitems__([5, 0, 36, 5, -1])
    for (image, label), i in zip(batch, [5, 0, 36, 5, 36], strict=True):
        np.testing.assert_array_equal(image, want[i])
        assert label == ds.meta.labels[i]


@pytest.mark.parametrize(
    ("codec", "chunk_bytes"),
    [("none", 300), ("gzip", 300), ("zstd", 300), ("gzip", 64), ("none", None)],
)
def test_variable_sizes_and_encoded_round_trip(tmp_path, codec, chunk_bytes):
    """Blobs: chunked (64 bytes: samples larger than a chunk span several) or contiguous."""
    rng = np.random.default_rng(3)
    samples = [
        rng.integers(0, 256, (int(rng.integers(3, 9)), int(rng.integers(3, 9)), 3), dtype=np.uint8)
        for _ in range(NUM)
    ]
    options: dict[str, object] = {"compression": Compression(codec=codec)}
    if chunk_bytes is None:
        options = {"layout": "contiguous"}
    raw = make_pack(tmp_path / "raw.h5", samples=samples, chunk_bytes=chunk_bytes, **options)
    encoded = make_pack(
        tmp_path / "enc.h5",
        samples=[png(s) for s in samples],
        chunk_bytes=chunk_bytes and 3 * chunk_bytes,
        **options,
    )
    for path in (raw, encoded):
        want = expected(path, samples)
        for direct in (True, False):
            ds = H5ImageDataset(
                path, output="hwc", reader=ReaderOptions(direct=direct, window_chunks=2)
            )
            assert ds.meta.storage == "blob"
            order = np.random.default_rng(0).permutation(NUM).tolist()
            for (image, _), i in zip(ds.__getitems__(order), order, strict=True):
                np.testing.assert_array_equal(image, want[i])


def test_outputs_transforms_and_paths(tmp_path):
    samples = arrays()
    path = make_pack(tmp_path / "p.h5", samples=samples, chunk_samples=8)
    want = expected(path, samples)
    meta = fmt.load_meta(path)

    image, label = H5ImageDataset(path)[3]
    assert isinstance(image, torch.Tensor)
    assert image.dtype == torch.uint8
    assert image.shape == (3, 6, 5)
    assert image.is_contiguous()
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), want[3])
    assert label == meta.labels[3]

    pil, _ = H5ImageDataset(path, output="pil")[3]
    assert isinstance(pil, Image.Image)
    np.testing.assert_array_equal(np.asarray(pil), want[3])

    ds = H5ImageDataset(
        path,
        transform=lambda img: img.float().mean(),
        target_transform=lambda y: f"class-{y}",
        return_path=True,
    )
    value, name, source = ds[4]
    assert value == pytest.approx(float(want[4].mean()))
    assert name == f"class-{meta.labels[4]}"
    assert source == f"sample-{int(meta.source_index[4]):06d}"

    batch = H5ImageDataset(path).__getitems__([1, 2, 3])
    assert batch.images.shape == (3, 3, 6, 5)
    assert batch.labels.tolist() == meta.labels[[1, 2, 3]].tolist()


def test_dataset_pickles_without_its_handle(tmp_path):
    path = make_pack(tmp_path / "p.h5", chunk_samples=8, compression=Compression(codec="gzip"))
    ds = H5ImageDataset(path)
    first = ds[0][0]
    assert ds._reader is not None
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._reader is None
    assert torch.equal(clone[0][0], first)


def test_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.h5"
    with pytest.raises(PackNotFoundError, match=r"missing\.h5"):
        H5ImageDataset(missing)
    with pytest.raises(FileNotFoundError):
        H5ImageDataset(missing)

    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["images"] = np.zeros((2, 2, 2, 3), dtype=np.uint8)
    with pytest.raises(FormatError, match=r"plain\.h5 is an HDF5 file but not an h5pack pack"):
        H5ImageDataset(plain)

    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    with pytest.raises(FormatError, match=r"text\.h5 is not a readable HDF5 file"):
        H5ImageDataset(text)

    newer = make_pack(tmp_path / "newer.h5", chunk_samples=8)
    with h5py.File(newer, "a") as f:
        f.attrs[fmt.FORMAT_VERSION_KEY] = fmt.FORMAT_VERSION + 1
    with pytest.raises(FormatError, match=r"newer\.h5 is a pack of format version 2.*upgrade"):
        H5ImageDataset(newer)

    ds = H5ImageDataset(make_pack(tmp_path / "ok.h5", chunk_samples=8))
    with pytest.raises(IndexError, match="index 37 is out of range"):
        ds[NUM]
    with pytest.raises(OptionsError, match="output should be one of"):
        H5ImageDataset(tmp_path / "ok.h5", output="jpeg")  # type: ignore[arg-type]


def test_locking_option_reads_a_pack_held_by_a_writer(tmp_path):
    path = make_pack(tmp_path / "p.h5", chunk_samples=8)
    with path.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what an HDF5 writer holds
        with pytest.raises(FormatError, match="locked by a process writing it"):
            H5ImageDataset(path)
        ds = H5ImageDataset(path, reader=ReaderOptions(locking=False))
        assert ds[0][0].shape == (3, 6, 5)


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_each_chunk_decompressed_once_per_epoch(tmp_path, monkeypatch, window, num_workers):
    path = make_pack(tmp_path / "p.h5", chunk_samples=4, compression=Compression(codec="gzip"))
    loads: Counter[tuple[int, int]] = Counter()  # (simulated worker, chunk)
    current = [0]
    original = PackReader._load_group

    def counting(self: PackReader, group: int, *args: object) -> np.ndarray:
        loads[(current[0], group)] += 1
        return original(self, group, *args)

    monkeypatch.setattr(PackReader, "_load_group", counting)
    sampler = ChunkBatchSampler(
        H5ImageDataset(path), 5, seed=2, window_chunks=window, num_workers=num_workers
    )
    sampler.set_epoch(4)
    batches = list(sampler)
    workers = max(1, num_workers)
    seen: list[int] = []
    for worker in range(workers):  # each worker process has its own dataset copy
        current[0] = worker
        ds = H5ImageDataset(path, reader=ReaderOptions(window_chunks=window))
        for batch in batches[worker::workers]:
            assert len(ds.__getitems__(batch)) == len(batch)
            seen.extend(batch)
    assert sorted(seen) == list(range(NUM))
    assert max(loads.values()) == 1  # no worker decompresses a chunk twice
    per_chunk = Counter(chunk for _, chunk in loads)
    assert sorted(per_chunk) == list(range(10))
    # only chunks on a boundary between two workers are read by both
    assert sum(per_chunk.values()) - 10 <= workers - 1


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_resumes_one_pack_exactly(tmp_path, workers):
    path = make_pack(tmp_path / "p.h5", chunk_samples=4, compression=Compression(codec="gzip"))

    def stream():
        data = H5ImageDataset(path, output="hwc", return_path=True)
        return H5IterableDataset(data, EpochSpec(batch_size=5, seed=3, window_chunks=2))

    def batches(it):
        return [list(paths) for _, _, paths in it]

    whole = stream()
    expected = batches(torch.utils.data.DataLoader(whole, batch_size=5, num_workers=workers))
    first = stream()
    it = iter(torch.utils.data.DataLoader(first, batch_size=5, num_workers=workers))
    before = [list(next(it)[2]) for _ in range(3)]
    state = first.state_dict(position=None if workers == 0 else 15)
    del it
    assert (state["position"], state["order"], state["sources"]) == (15, "permutation", None)
    again = stream()
    again.load_state_dict(state)
    assert len(again) == NUM - 15
    loader = torch.utils.data.DataLoader(again, batch_size=5, num_workers=workers)
    assert before + batches(loader) == expected


def test_iterable_dataset_in_process_is_the_sampler_order(tmp_path):
    path = make_pack(tmp_path / "p.h5", chunk_samples=4, compression=Compression(codec="gzip"))
    stream = H5IterableDataset(
        H5ImageDataset(path, output="hwc"), EpochSpec(batch_size=5, seed=3, window_chunks=2)
    )
    labels = fmt.load_meta(path).labels
    stream.set_epoch(2)
    got = [int(label) for _, label in stream]
    sampler = ChunkBatchSampler(H5ImageDataset(path), 5, seed=3, window_chunks=2)
    sampler.set_epoch(2)
    order = [i for b in sampler for i in b]
    assert got == labels[order].tolist()
    assert len(stream) == NUM
    stream.set_epoch(3)
    assert [int(label) for _, label in stream] != got
    clone = pickle.loads(pickle.dumps(stream))
    assert clone.epoch == 3
