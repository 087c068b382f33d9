"""label_mixing: how well chunks mix labels, ~1 for a shuffled pack, low for a sorted one."""

from __future__ import annotations

import doctest
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5pack.core.format import load_meta
from h5pack.core.layout import ChunkMap
from h5pack.errors import OptionsError
from h5pack.training import mixing as mixing_module
from h5pack.training.mixing import MIXING_THRESHOLD, MixingWarning, label_mixing, mean_entropy
from h5pack.write.convert import convert, write_arrays
from h5pack.write.options import ConvertOptions

CLASSES = ("ant", "bee", "cat", "dog")
PER_CLASS = 24
CHUNK = 8


def image_folder(root: Path) -> Path:
    """Write an ImageFolder tree: ``root/<class>/<i>.png``, PER_CLASS tiny images per class."""
    rng = np.random.default_rng(7)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            pixels = rng.integers(0, 32, (6, 7, 3), dtype=np.uint8) + 40 * c
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i:02d}.png")
    return root


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A shuffled and a ``--no-shuffle`` pack of the same ImageFolder tree."""
    folder = tmp_path_factory.mktemp("mixing")
    root = image_folder(folder / "images")
    shuffled = convert(root, folder / "shuffled.h5", ConvertOptions(chunk_samples=CHUNK, workers=1))
    unshuffled = convert(
        root,
        folder / "unshuffled.h5",
        ConvertOptions(chunk_samples=CHUNK, workers=1, shuffle_samples=False),
    )
    return {"shuffled": shuffled.path, "unshuffled": unshuffled.path}


def test_a_shuffled_pack_of_an_image_folder_mixes(packs: dict[str, Path]) -> None:
    report = label_mixing(load_meta(packs["shuffled"]))
    assert report.figure == pytest.approx(1.0, abs=0.1)
    assert not report.exempt
    assert not report.warns
    assert report.window_needed == 1
    assert report.path == str(packs["shuffled"])


def test_a_no_shuffle_pack_of_an_image_folder_is_caught(packs: dict[str, Path]) -> None:
    report = label_mixing(load_meta(packs["unshuffled"]), window_chunks=2)
    assert report.figure < 0.1  # chunks of 8 in a tree of 24 per class: one class each
    assert report.window_figure < MIXING_THRESHOLD
    assert report.warns
    # the message says what to do, with the figures
    assert "--no-shuffle" in report.message
    assert f"window_chunks >= {report.window_needed}" in report.message
    assert str(packs["unshuffled"]) in report.message
    # the window it asks for does reach the threshold
    assert report.window_needed is not None
    assert report.window_needed > 2
    wider = label_mixing(load_meta(packs["unshuffled"]), window_chunks=report.window_needed)
    assert not wider.window_unmixed
    assert wider.warns  # the chunks still do not mix: the warning says what the window costs
    assert "re-convert" in wider.message


def test_unlabelled_packs_are_exempt(tmp_path: Path) -> None:
    samples = [np.full((4, 4, 3), i, dtype=np.uint8) for i in range(20)]
    write_arrays(tmp_path / "u.h5", samples, [-1] * 20, options=ConvertOptions(chunk_samples=4))
    report = label_mixing(load_meta(tmp_path / "u.h5"), window_chunks=1)
    assert report.exempt
    assert not report.warns
    assert math.isnan(report.figure)
    assert report.window_needed is None


def test_one_class_is_exempt_and_unlabelled_samples_are_left_out() -> None:
    cmap = ChunkMap.regular(400, 8)
    assert label_mixing(np.zeros(400, dtype=np.int64), cmap).exempt
    labels = np.repeat([0, 1], 200)
    with_unlabelled = labels.copy()
    with_unlabelled[::2] = -1  # half unlabelled: the others are still sorted by class
    assert label_mixing(with_unlabelled, cmap).warns
    shuffled = np.random.default_rng(0).permutation(with_unlabelled)
    assert label_mixing(shuffled, cmap).figure > 0.8
    assert not label_mixing(shuffled, cmap).warns


@pytest.mark.parametrize("chunk_samples", [1, 7, 55])
def test_figure_is_one_for_shuffled_labels_whatever_the_classes(chunk_samples: int) -> None:
    # 1,000 classes in chunks of 55: a chunk cannot hold the pack's entropy, the figure is
    # measured against the shuffled expectation and stays ~1
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 1000, 50_000)
    report = label_mixing(labels, ChunkMap.regular(labels.size, chunk_samples), window_chunks=3)
    assert report.figure == pytest.approx(1.0, abs=0.02)
    assert report.window_figure == pytest.approx(1.0, abs=0.02)


def test_sorted_labels_grow_with_the_window() -> None:
    labels = np.repeat(np.arange(5), 512)  # the benchmark's unmixed pack: 5 classes
    cmap = ChunkMap.regular(labels.size, 64)
    figures = [label_mixing(labels, cmap, window_chunks=k).window_figure for k in (1, 2, 8, 40)]
    assert figures == sorted(figures)
    assert figures[0] < 0.1
    assert figures[-1] == pytest.approx(1.0)  # one window: the whole pack


def test_irregular_chunks_and_a_window_past_the_pack() -> None:
    labels = np.repeat([0, 1, 2], 10)
    cmap = ChunkMap(np.array([0, 3, 10, 11, 20, 30]))
    report = label_mixing(labels, cmap, window_chunks=50)
    assert report.window_figure == pytest.approx(1.0)
    assert not report.window_unmixed


def test_mean_entropy_by_hand() -> None:
    groups = np.array([0, 0, 1, 1, 1, 1])
    labels = np.array([0, 1, 2, 2, 2, 2])
    # group 0: 1 bit over 2 samples, group 1: 0 bits over 4 samples
    assert mean_entropy(groups, labels, 3) == pytest.approx(2 / 6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_chunks": 0}, "window_chunks should be >= 1"),
        ({"threshold": 0.0}, "threshold should be in"),
        ({"threshold": 1.5}, "threshold should be in"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        label_mixing(np.arange(8) % 2, ChunkMap.regular(8, 2), **kwargs)  # type: ignore[arg-type]


def test_labels_need_the_chunk_map_of_their_length() -> None:
    with pytest.raises(OptionsError, match="needs the chunk map"):
        label_mixing(np.arange(8) % 2)
    with pytest.raises(OptionsError, match="one entry per sample"):
        label_mixing(np.arange(8) % 2, ChunkMap.regular(9, 2))


def _python_calls(labels: np.ndarray) -> tuple[int, bool]:
    """Python function calls ``label_mixing`` makes on ``labels`` (chunks of 55), and warns."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        report = label_mixing(labels, ChunkMap.regular(labels.size, 55), window_chunks=4)
    finally:
        sys.setprofile(None)
    return calls, report.warns


def test_cheap_for_a_million_samples() -> None:
    # No wall clock (a timed bound flakes on a busy machine): the Python work must not grow
    # with the pack, whose 18,182 chunks a per-chunk or per-sample loop would show; the
    # arrays do the rest (~0.5 s for a million samples on the 2-core VM).
    rng = np.random.default_rng(2)
    _python_calls(rng.integers(0, 1000, 1_000))  # lazy imports and caches, not counted
    small, small_warns = _python_calls(rng.integers(0, 1000, 10_000))
    large, large_warns = _python_calls(rng.integers(0, 1000, 1_000_000))
    assert not large_warns
    assert not small_warns
    assert large <= 2 * small + 100


def test_docstring_examples() -> None:
    assert doctest.testmod(mixing_module).failed == 0


def test_the_message_is_a_warning(packs: dict[str, Path]) -> None:
    report = label_mixing(load_meta(packs["unshuffled"]), window_chunks=1)
    with pytest.warns(MixingWarning, match="Re-convert with the write-time shuffle"):
        warnings.warn(report.message, MixingWarning, stacklevel=1)


def test_make_loader_warns_once_on_an_unmixed_pack_and_not_on_a_shuffled_one(tmp_path):
    import warnings as _warnings

    from h5pack import make_loader
    from h5pack.training.mixing import MixingWarning
    from h5pack.write.convert import write_arrays
    from h5pack.write.options import ConvertOptions

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (4, 4, 3), dtype=np.uint8) for _ in range(400)]
    labels = [i // 100 for i in range(400)]  # class folders, in order
    ordered = tmp_path / "ordered.h5"
    write_arrays(
        ordered, images, labels, options=ConvertOptions(chunk_samples=20, shuffle_samples=False)
    )
    with pytest.warns(MixingWarning, match="shuffle"):
        make_loader(ordered, 16, num_workers=0)
    shuffled = tmp_path / "shuffled.h5"
    write_arrays(shuffled, images, labels, options=ConvertOptions(chunk_samples=20))
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        make_loader(shuffled, 16, num_workers=0)
