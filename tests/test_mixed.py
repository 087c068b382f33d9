"""Mixing packs by weight end to end (issue 18): make_loader, the datasets, labels, refusals."""

from __future__ import annotations

import io
import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image
from torch.utils.data import DataLoader

from h5pack.core.layout import Compression
from h5pack.errors import OptionsError
from h5pack.read.mixture import describe_mix, joined_classes
from h5pack.training.dataset import H5ImageDataset, H5IterableDataset
from h5pack.training.loader import make_loader
from h5pack.training.mixed import H5MixDataset
from h5pack.training.mixing import MixingWarning
from h5pack.training.sampler import ChunkBatchSampler, EpochSpec
from h5pack.training.weighted import shares
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

SIZES = {"a": 96, "b": 24, "c": 30}


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _pack(path: Path, count: int, classes: list[str], *, seed: int, kind: str = "raw") -> Path:
    rng = np.random.default_rng(seed)
    side = 9 if kind == "other-size" else 8
    images = [rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for _ in range(count)]
    labels = [i % len(classes) for i in range(count)]
    names = [f"{path.stem}_{i:03d}.png" for i in range(count)]
    if kind == "encoded":
        options = ConvertOptions(mode="encoded", chunk_bytes=700)
        samples: list = [_png(a) for a in images]
    else:
        options = ConvertOptions(chunk_samples=8, compression=Compression(codec="zstd"))
        samples = images
    write_arrays(path, samples, labels, options=options, classes=classes, paths=names)
    return path


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    return {
        "a": _pack(root / "a.h5", SIZES["a"], ["cat", "dog"], seed=1),
        "b": _pack(root / "b.h5", SIZES["b"], ["dog", "fox"], seed=2, kind="encoded"),
        "c": _pack(root / "c.h5", SIZES["c"], ["cat"], seed=3),
        "big": _pack(root / "big.h5", 20, ["cat"], seed=4, kind="other-size"),
    }


def epoch_sources(loader, epoch: int) -> Counter[int]:
    loader.set_epoch(epoch)
    counts: Counter[int] = Counter()
    for batch in loader:
        counts.update(batch[-1].tolist())
    return counts


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("weights", [(3, 1), (1, 3)])
def test_a_mix_at_the_defaults_never_bunches(tmp_path, weights, workers) -> None:
    """Issue 29.2: a = 300 images and b = 400, each one chunk, at 3:1 served up to 220
    samples in a row without b, and with 2 workers every other batch had none of it."""
    options = ConvertOptions(chunk_samples=400)
    paths = []
    for name, count in (("a", 300), ("b", 400)):
        images = [np.full((4, 4, 3), i % 256, np.uint8) for i in range(count)]
        paths.append(tmp_path / f"{name}.h5")
        write_arrays(paths[-1], images, [0] * count, options=options)
    loader = make_loader(paths, 16, weights=list(weights), num_workers=workers, return_source=True)
    want = shares(list(weights), 700).tolist()
    for epoch in range(4):
        loader.set_epoch(epoch)
        batches = [source.numpy() for *_, source in loader]
        assert np.bincount(np.concatenate(batches)).tolist() == want  # exact shares
        for batch in batches[:-1]:  # each source in every batch, within one of its share
            counts = np.bincount(batch, minlength=2)
            assert np.abs(counts - 16 * np.asarray(want) / 700).max() <= 1.0


@pytest.mark.parametrize("workers", [0, 2])
def test_each_epoch_holds_exactly_the_shares(packs, workers) -> None:
    loader = make_loader(
        [packs["a"], packs["b"]],
        EpochSpec(batch_size=10, epoch_samples=100),
        weights=[3, 1],
        num_workers=workers,
        return_source=True,
        seed=3,
    )
    for epoch in range(3):
        counts = epoch_sources(loader, epoch)
        assert [counts[0], counts[1]] == shares([3, 1], 100).tolist() == [75, 25]


def test_labels_are_joined_by_class_name(packs) -> None:
    loader = make_loader([packs["a"], packs["b"]], 8, weights=[1, 1], num_workers=0)
    assert loader.dataset.classes == ("cat", "dog", "fox")
    dataset = loader.dataset
    assert isinstance(dataset, H5MixDataset)
    # b's "dog" (its 0) is the mix's 1, b's "fox" (its 1) the mix's 2
    b_labels = dataset.labels[SIZES["a"] :]
    assert set(b_labels.tolist()) == {1, 2}
    for images, labels in loader:
        assert images.shape[1:] == (3, 8, 8)
        assert set(labels.tolist()) <= {0, 1, 2}
    separate = H5MixDataset([packs["a"], packs["b"]], classes="separate")
    assert separate.classes[-1].endswith("b.h5/fox")
    assert len(separate.classes) == 4


def test_an_explicit_class_list_and_its_refusal() -> None:
    names, maps = joined_classes([("cat",), ("fox", "cat")], ["a", "b"], ["fox", "cat", "owl"])
    assert names == ("fox", "cat", "owl")
    assert maps[1].tolist() == [0, 1]
    with pytest.raises(OptionsError, match="b has classes"):
        joined_classes([("cat",), ("dog",)], ["a", "b"], ["cat"])


def test_samples_are_the_sources_own(packs) -> None:
    dataset = H5ImageDataset([packs["a"], packs["b"]], weights=[1, 1], return_path=True)
    assert isinstance(dataset, H5MixDataset)
    a = H5ImageDataset(packs["a"], return_path=True)
    b = H5ImageDataset(packs["b"], return_path=True)
    batch = dataset.__getitems__([SIZES["a"] + 3, 5, SIZES["a"]])
    assert np.array_equal(batch[0][0].numpy(), b[3][0].numpy())
    assert np.array_equal(batch[1][0].numpy(), a[5][0].numpy())
    assert batch[0][2] == b[3][2]
    assert batch[1][2] == a[5][2]
    clone = pickle.loads(pickle.dumps(dataset))
    assert np.array_equal(clone[5][0].numpy(), a[5][0].numpy())


def test_mode_and_size_may_differ_when_size_makes_one_shape(packs) -> None:
    with pytest.raises(OptionsError, match=r"big\.h5 and .*a\.h5 cannot be batched together"):
        make_loader([packs["a"], packs["big"]], 4, weights=[1, 1], num_workers=0)
    loader = make_loader(
        [packs["a"], packs["big"], packs["b"]], 4, weights=[1, 1, 1], size=6, num_workers=0
    )
    shapes = {tuple(images.shape[1:]) for images, _ in loader}
    assert shapes == {(3, 6, 6)}


def test_the_decoded_cache_works_across_sources(packs) -> None:
    with make_loader(
        [packs["a"], packs["b"]], 6, weights=[1, 1], size=6, cache="decoded", num_workers=0
    ) as loader:
        caches = loader.dataset.caches
        assert len(caches) == 1  # b is the encoded source
        first = [images.clone() for images, _ in loader]
        second = [images for images, _ in loader]
        assert caches[0].stats().hits > 0
        assert len(first) == len(second)


def test_a_source_whose_chunks_do_not_mix_labels_is_named(packs, tmp_path) -> None:
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(64)]
    blocks = tmp_path / "blocks.h5"
    write_arrays(
        blocks,
        images,
        [i // 16 for i in range(64)],  # four classes one after another
        options=ConvertOptions(chunk_samples=8, shuffle_samples=False),
        classes=["w", "x", "y", "z"],
    )
    with pytest.warns(MixingWarning, match=r"blocks\.h5: its chunks do not mix labels"):
        make_loader([packs["a"], blocks], 8, weights=[1, 1], num_workers=0)


def test_weights_need_a_list_of_sources(packs) -> None:
    with pytest.raises(OptionsError, match="give a list of sources"):
        make_loader(packs["a"], 4, weights=[1], num_workers=0)
    with pytest.raises(OptionsError, match="apply to a mix"):
        make_loader([packs["a"]], 4, return_source=True, num_workers=0)
    with pytest.raises(OptionsError, match="given twice"):
        describe_mix([packs["a"], packs["a"]])


def test_iterable_dataset_and_sampler_take_the_weights(packs) -> None:
    spec = EpochSpec(batch_size=5, seed=1, weights=(3.0, 1.0), epoch_samples=40)
    stream = H5IterableDataset([packs["a"], packs["c"]], spec)
    assert len(stream) == 40
    loader = DataLoader(stream, batch_size=5, num_workers=2)
    labels = [int(v) for _, batch in loader for v in batch]
    assert len(labels) == 40
    sampler = ChunkBatchSampler([packs["a"], packs["c"]], 5, weights=[3, 1], epoch_samples=40)
    counts = Counter(int(i >= SIZES["a"]) for b in sampler for i in b)
    assert [counts[0], counts[1]] == [30, 10]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_resume_equals_an_uninterrupted_run(packs, workers) -> None:
    def loader():
        return make_loader(
            [packs["a"], packs["b"]],
            EpochSpec(batch_size=7, epoch_samples=90),
            weights=[2, 1],
            num_workers=workers,
            return_path=True,
            seed=8,
        )

    whole = loader()
    whole.set_epoch(1)
    expected = [paths for _, _, paths in whole]
    first = loader()
    first.set_epoch(1)
    it = iter(first)
    before = [next(it)[2] for _ in range(5)]
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    assert before + [paths for _, _, paths in again] == expected


def test_loader_elastic_resume_from_two_to_three_ranks(packs) -> None:
    def loader(ranks: int, rank: int, workers: int):
        return make_loader(
            [packs["a"], packs["c"]],
            EpochSpec(batch_size=4, num_replicas=ranks, rank=rank),
            weights=[1, 1],
            num_workers=workers,
            return_path=True,
            seed=2,
        )

    before: Counter[str] = Counter()
    state = None
    for rank in range(2):
        old = loader(2, rank, 0)
        it = iter(old)
        for _ in range(6):
            before.update(next(it)[2])
        state = state or old.state_dict()
        del it
    after: Counter[str] = Counter()
    lengths = set()
    for rank in range(3):
        new = loader(3, rank, 2)
        new.load_state_dict(state)
        batches = [paths for _, _, paths in new]
        lengths.add(len(batches))
        for paths in batches:
            after.update(paths)
    assert len(lengths) == 1  # every rank the same number of batches
    total = before + after
    num = SIZES["a"] + SIZES["c"]  # weights 1:1 over 126 samples: 63 each, c repeats
    left = num - sum(before.values())
    assert sum(total.values()) - num == 3 * -(-left // 3) - left
    assert sum(v for k, v in total.items() if k.startswith("c_")) >= 63


# -- the iterable mix's state (H5IterableDataset.state_dict) ------------------------------


def _stream(packs, **fields):
    spec = EpochSpec(batch_size=7, seed=8, weights=(2.0, 1.0), epoch_samples=90, **fields)
    data = H5ImageDataset([packs["a"], packs["b"]], weights=[2, 1], return_path=True, seed=8)
    return H5IterableDataset(data, spec)


def _paths(stream, workers: int) -> list[list[str]]:
    return [list(paths) for _, _, paths in DataLoader(stream, batch_size=7, num_workers=workers)]


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_resume_equals_an_uninterrupted_run(packs, workers) -> None:
    whole = _stream(packs)
    whole.set_epoch(1)
    expected = _paths(whole, workers)
    assert sum(map(len, expected)) == 90
    first = _stream(packs)
    first.set_epoch(1)
    it = iter(DataLoader(first, batch_size=7, num_workers=workers))
    before = [list(next(it)[2]) for _ in range(5)]
    # without workers this process yielded exactly what the loop took; with them, say it
    state = first.state_dict(position=None if workers == 0 else 5 * 7)
    del it
    assert (state["epoch"], state["position"], state["unit"]) == (1, 35, "samples")
    assert state["order"] == "weighted"
    assert state["num_workers"] == workers
    again = _stream(packs)
    again.load_state_dict(state)
    assert again.epoch == 1
    assert len(again) == 90 - 35
    rest = _paths(again, workers)
    assert before + rest == expected
    again.set_epoch(1)  # the state holds for its epoch ...
    assert _paths(again, workers) == rest
    again.set_epoch(2)  # ... and no longer once another is selected
    later = _stream(packs)
    later.set_epoch(2)
    assert _paths(again, workers) == _paths(later, workers)


def test_stream_resume_mid_batch_and_from_a_resumed_epoch(packs) -> None:
    whole = _stream(packs)
    expected = [p for batch in _paths(whole, 0) for p in batch]
    first = _stream(packs)
    it = iter(first)  # no DataLoader: samples one by one
    before = [next(it)[2] for _ in range(17)]
    state = first.state_dict()
    assert state["position"] == 17
    second = _stream(packs)
    second.load_state_dict(state)
    it = iter(second)
    middle = [next(it)[2] for _ in range(20)]
    state = second.state_dict()  # counts from where the resumed epoch started
    assert state["position"] == 37
    third = _stream(packs)
    third.load_state_dict(state)
    rest = [p for batch in _paths(third, 0) for p in batch]
    assert before + middle + rest == expected


@pytest.mark.parametrize("workers", [0, 1])
def test_stream_elastic_resume_on_other_workers(packs, workers) -> None:
    """A state of 2 workers finishes on 0 or 1 (another plan): every position once."""
    whole = _stream(packs)
    expected = Counter(p for batch in _paths(whole, 2) for p in batch)
    first = _stream(packs)
    it = iter(DataLoader(first, batch_size=7, num_workers=2))
    before = Counter(p for _ in range(4) for p in next(it)[2])
    state = first.state_dict(position=28)
    del it
    again = _stream(packs)
    again.load_state_dict(state)
    rest = Counter(p for batch in _paths(again, workers) for p in batch)
    assert before + rest == expected


def test_stream_elastic_resume_from_one_to_three_ranks(packs) -> None:
    first = _stream(packs)
    it = iter(DataLoader(first, batch_size=7, num_workers=0))
    before = Counter(p for _ in range(3) for p in next(it)[2])
    state = first.state_dict()
    del it
    after: Counter[str] = Counter()
    lengths = set()
    for rank in range(3):
        stream = _stream(packs, num_replicas=3, rank=rank)
        stream.load_state_dict(state)
        served = [p for batch in _paths(stream, 2) for p in batch]
        assert len(stream) == len(served)
        lengths.add(len(served))
        after.update(served)
    assert len(lengths) == 1  # every rank the same number of samples
    whole = _stream(packs)
    expected = Counter(p for batch in _paths(whole, 0) for p in batch)
    left = 90 - 21
    padding = 3 * -(-left // 3) - left
    assert sum((before + after).values()) == 90 + padding
    assert not expected - (before + after)  # every position of the epoch served


def test_stream_state_refusals(packs) -> None:
    stream = _stream(packs)
    loader = DataLoader(stream, batch_size=7, num_workers=2)
    next(iter(loader))
    with pytest.raises(OptionsError, match="give position="):
        stream.state_dict()
    other = H5IterableDataset(
        H5ImageDataset([packs["a"], packs["b"]], weights=[1, 1]),
        EpochSpec(batch_size=7, seed=8, weights=(1.0, 1.0), epoch_samples=90),
    )
    with pytest.raises(OptionsError, match="does not match"):
        other.load_state_dict(stream.state_dict(position=7))
    sampler = ChunkBatchSampler([packs["a"], packs["b"]], 7, weights=[2, 1], epoch_samples=90)
    with pytest.raises(OptionsError, match="counts samples"):
        stream.load_state_dict(sampler.state_dict())


# -- torch.distributed ---------------------------------------------------------------------


def _rank_main(rank: int, world: int, sources: list[str], out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world
    )
    try:
        loader = make_loader(sources, 5, weights=[3, 1], num_workers=2, seed=5, return_path=True)
        loader.set_epoch(1)
        batches = [paths for _, _, paths in loader]
        Path(out, f"rank{rank}.json").write_text(json.dumps({"len": len(loader), "b": batches}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_shares_hold_under_torch_distributed(packs, tmp_path) -> None:
    sources = [str(packs["a"]), str(packs["c"])]
    mp.start_processes(
        _rank_main, args=(3, sources, str(tmp_path)), nprocs=3, join=True, start_method="fork"
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert len({r["len"] for r in results}) == 1
    assert all(len(r["b"]) == r["len"] for r in results)
    paths = [p for r in results for b in r["b"] for p in b]
    num = SIZES["a"] + SIZES["c"]
    padding = 3 * -(-num // 3) - num
    assert len(paths) == num + padding
    from_c = sum(p.startswith("c_") for p in paths)
    assert abs(from_c - shares([3, 1], num)[1]) <= padding


# -- the CLI and the docstrings ------------------------------------------------------------


def test_info_and_bench_show_a_mix(packs) -> None:
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    runner = CliRunner()
    sources = [str(packs["a"]), str(packs["c"])]
    result = runner.invoke(cli, ["info", *sources, "--weights", "1,3", "--epoch-samples", "100"])
    assert result.exit_code == 0, result.output
    assert "classes joined by name: cat, dog" in result.output
    rows = [line.split() for line in result.output.splitlines()[2:]]
    assert [row[3] for row in rows] == ["25", "75"]  # per epoch
    assert rows[1][5] == "2.50"  # c: 75 of 30 samples, 2.5 passes
    data = json.loads(runner.invoke(cli, ["info", *sources, "--weights", "1,3", "--json"]).output)
    assert [s["per_epoch"] for s in data["sources"]] == [32, 94]
    bad = runner.invoke(cli, ["info", *sources, "--weights", "1"])
    assert bad.exit_code == 2
    assert "one weight per source" in bad.output
    flags = ["--batch-size", "8", "--repeats", "1", "--warmup", "0", "--time-budget", "0.1"]
    bench = runner.invoke(
        cli, ["bench", *sources, "--weights", "3,1", *flags, "--workers", "0", "-q", "--json"]
    )
    assert bench.exit_code == 0, bench.output
    measured = json.loads(bench.output)
    assert sum(measured["served_last_epoch"].values()) == SIZES["a"] + SIZES["c"]
    assert measured["loads_per_sample"] is not None


def test_the_docstring_examples_of_the_mix() -> None:
    import doctest

    from h5pack.core.layout import ChunkMap
    from h5pack.read import mixture
    from h5pack.training import orders, weighted

    for module in (orders, weighted, mixture):
        assert doctest.testmod(module, extraglobs={"ChunkMap": ChunkMap}).failed == 0
