"""write/builder.py: the pack's metadata datasets."""

from h5pack.read.reader import PackReader
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import random_arrays


def test_paths_are_written_in_slabs(tmp_path, monkeypatch):
    from h5pack.core import format as fmt
    from h5pack.core import names

    monkeypatch.setattr(fmt, "PATH_SLAB", 4)  # the writer's slabs (core.record)
    monkeypatch.setattr(names, "PATH_SLAB", 4)  # the reader's (core.readmeta)
    names = [f"dir/{'x' * (i % 3)}{i}.png" for i in range(10)]
    options = ConvertOptions(shuffle_samples=False)
    report = write_arrays(
        tmp_path / "p.h5", random_arrays(10), [0] * 10, paths=names, options=options
    )
    with PackReader(report.path) as reader:
        assert reader.paths == names
