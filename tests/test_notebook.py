"""notebooks/compare_layouts.ipynb runs from top to bottom on tiny data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "compare_layouts.ipynb"
KERNEL = "h5pack-test"

TINY_PARAMETERS = """
NUM_IMAGES = 24
IMAGE_SIZE = (48, 48)
SOURCE = None
VARIANTS = ("raw-contig", "raw-c8-gzip", "encoded-64k")
REPEATS = 1
BATCH_SIZE = 8
TRAIN_SIZE = None
KEEP = False
"""


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernel spec running this interpreter (so the kernel sees this h5pack)."""
    folder = tmp_path / "jupyter" / "kernels" / KERNEL
    folder.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "h5pack tests",
        "language": "python",
    }
    (folder / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    return KERNEL


def test_notebook_is_committed_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == []
            assert cell.execution_count is None
    assert "parameters" in notebook.cells[1].metadata.get("tags", [])


@pytest.mark.slow  # a kernel and the whole notebook
def test_notebook_runs_on_tiny_data(kernel: str) -> None:
    before = NOTEBOOK.read_bytes()
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells[1].source = TINY_PARAMETERS.strip()
    # no time limit of a cell's (the tests' own one guards against a hang); the kernel's
    # start is an event waited for generously: a busy machine starts it slowly
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=kernel,
        timeout=None,
        startup_timeout=600,
        resources={"metadata": {"path": "/tmp"}},
    )
    client.execute()
    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    ]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Use " in text  # the recommendation
    assert "img/s" in text  # bench_loader
    # the last words name nothing the notebook deleted (issue 20.18)
    last = [o for o in outputs if o.output_type == "stream"][-1].text.strip().splitlines()[-1]
    assert "removed" in text
    assert "KEEP = True keeps them" in text
    assert "to build it from your own folder: h5pack convert YOUR_FOLDER out.h5" in last
    assert "h5pack-notebook-" not in last
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(images) >= 2  # the plots
    assert NOTEBOOK.read_bytes() == before  # outputs never written back
