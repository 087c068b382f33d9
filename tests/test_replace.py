"""A pack replaced under a reader: a FormatError, never the new pixels with the old labels.

Issue 9.1. Each sample's pixels encode its identity, so a served (image, label) pair can
be checked against the pack the loader was built on.
"""

import shutil

import numpy as np
import pytest

from h5pack.core import format as fmt
from h5pack.errors import FormatError
from h5pack.read.reader import PackReader
from h5pack.training.dataset import H5ImageDataset
from h5pack.training.loader import make_loader
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions

NUM = 96
SHAPE = (6, 5, 3)


def _samples():
    rng = np.random.default_rng(5)
    return [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(NUM)]


def _write(path, *, seed, num=NUM, shift=0, **options):
    samples = _samples()[:num]
    labels = [(i + shift) % 4 for i in range(num)]
    options.setdefault("chunk_samples", 16)
    options = ConvertOptions(seed=seed, **options)
    write_arrays(path, samples, labels, options=options, overwrite=True)
    return path


def _truth():
    """Image bytes -> label, of the pack the loaders are built on (shift 0)."""
    return {s.tobytes(): i % 4 for i, s in enumerate(_samples())}


def _replace(path, tmp_path, **kwargs):
    """Publish another pack at ``path`` (os.replace: a new inode): other labels, order."""
    kwargs.setdefault("shift", 1)
    _write(tmp_path / "other.h5", seed=kwargs.pop("seed", 99), **kwargs)
    (tmp_path / "other.h5").replace(path)


def _served_pairs(loader):
    pairs = []
    for images, labels in loader:
        hwc = images.permute(0, 2, 3, 1).contiguous().numpy()
        pairs.extend(zip((x.tobytes() for x in hwc), labels.tolist(), strict=True))
    return pairs


def _check_or_refused(loader):
    """Every pair served is right, or the epoch ends in a FormatError; return which."""
    truth = _truth()
    try:
        pairs = _served_pairs(loader)
    except FormatError as err:
        message = str(err)
        refused = "was replaced since the dataset was created" in message
        return "refused" if refused and "rebuild the loader" in message else message
    assert all(truth[image] == label for image, label in pairs)
    return "served"


def test_a_reader_refuses_a_file_that_is_not_the_one_expected(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    before = fmt.load_meta(path).identity
    assert before is not None
    assert before.pack_id is not None
    assert len(before.pack_id) == 32
    with PackReader(path, expected=before):
        pass
    _replace(path, tmp_path)
    with pytest.raises(FormatError, match=r"p\.h5 was replaced since the dataset was created"):
        PackReader(path, expected=before)


def test_a_copy_written_in_place_is_refused_too(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    dataset = H5ImageDataset(path, output="hwc")
    other = _write(tmp_path / "other.h5", seed=1, shift=1)
    shutil.copyfile(other, path)  # same inode, other bytes and pack id
    with pytest.raises(FormatError, match=r"pack id \w+ then, \w+ now"):
        dataset[0]


def test_every_pack_gets_its_own_id(tmp_path):
    first = fmt.load_meta(_write(tmp_path / "a.h5", seed=0)).pack_id
    second = fmt.load_meta(_write(tmp_path / "b.h5", seed=0)).pack_id
    assert first != second


def test_a_smaller_replacement_is_a_format_error_not_an_index_error(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    dataset = H5ImageDataset(path, output="hwc")
    _replace(path, tmp_path, num=10)
    with pytest.raises(FormatError, match="was replaced"):
        dataset[NUM - 1]
    with pytest.raises(FormatError, match="was replaced"):
        dataset.__getitems__([0, 50, NUM - 1])


def test_main_process_loader_built_before_the_replace_refuses_after(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    loader = make_loader(path, 16, num_workers=0, seed=3)
    _replace(path, tmp_path)
    assert _check_or_refused(loader) == "refused"


def test_an_open_reader_keeps_reading_the_file_it_opened(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    loader = make_loader(path, 16, num_workers=0, seed=3)
    assert _check_or_refused(loader) == "served"  # the main process's reader is open now
    _replace(path, tmp_path)
    assert _check_or_refused(loader) == "served"  # still the first file: its own labels


def test_non_persistent_workers_refuse_a_replaced_pack(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    loader = make_loader(path, 16, num_workers=2, persistent_workers=False, seed=3)
    assert _check_or_refused(loader) == "served"
    _replace(path, tmp_path)
    for _ in range(2):  # every epoch starts workers that open the path again
        assert _check_or_refused(loader) == "refused"


def test_persistent_workers_never_mix_two_files(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    loader = make_loader(path, 16, num_workers=2, persistent_workers=True, seed=3)
    assert _check_or_refused(loader) == "served"
    _replace(path, tmp_path)
    # Workers that kept the first file open serve it (its own labels); a worker that
    # opens the path now refuses. Never the new pixels with the old labels.
    for _ in range(2):
        assert _check_or_refused(loader) in ("served", "refused")


def test_workers_started_after_the_replace_refuse(tmp_path):
    path = _write(tmp_path / "p.h5", seed=0)
    loader = make_loader(path, 16, num_workers=2, persistent_workers=True, seed=3)
    _replace(path, tmp_path)
    assert _check_or_refused(loader) == "refused"
