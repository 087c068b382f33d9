"""Damage a pack at many offsets and classify what h5pack does with each copy.

The corpus of ``tests/test_damage.py``. Every case runs in one long-lived child process
(``python -m tests.damage_cases``) that reads cases and prints one JSON line per outcome;
the parent gives each case a limit of CPU seconds and, when the child spends more on one,
records a hang, kills the child and starts a fresh one for the remaining cases. So a case
that made HDF5 loop costs its limit, not the whole test run, and the others cost no
interpreter start. The limit counts the child's CPU time, not the clock: a busy machine
gives the child a small share of a core and slows every case, but a loop is still the only
case that spends seconds of CPU (a case takes ~0.1 CPU-s).
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import numpy as np
import psutil

BLOCK = 4096
REPO = Path(__file__).resolve().parents[1]


def image_ranges(path: Path) -> list[tuple[int, int]]:
    """Return the byte ranges of the images dataset's data (chunks, or the contiguous run)."""
    with h5py.File(path, "r") as handle:
        images = handle["images"]
        if images.chunks is None:
            start = images.id.get_offset()
            return [(start, start + images.id.get_storage_size())]
        ranges = []
        for i in range(images.id.get_num_chunks()):
            info = images.id.get_chunk_info(i)
            ranges.append((info.byte_offset, info.byte_offset + info.size))
        return sorted(ranges)


def metadata_offsets(path: Path, count: int) -> list[int]:
    """Return ``count`` offsets spread evenly over everything that is not image data."""
    size = path.stat().st_size
    is_data = np.zeros(size, dtype=bool)
    for start, stop in image_ranges(path):
        is_data[start:stop] = True
    candidates = np.flatnonzero(~is_data)
    picks = np.linspace(0, candidates.size - 1, count).round().astype(int)
    return sorted({int(candidates[i]) for i in picks})


def expected_of(path: Path) -> dict[str, object]:
    """Return what a reader should serve from the undamaged ``path``."""
    from h5pack.read.reader import PackReader

    with PackReader(path) as reader:
        stored = reader.read_stored(np.arange(len(reader)))
        return {
            "samples": [s.tobytes().hex() for s in stored],
            "labels": reader.meta.labels.tolist(),
            "paths": list(reader.paths),
        }


def _outcome(function) -> str:  # type: ignore[no-untyped-def]
    from h5pack.errors import FormatError

    try:
        return function()
    except FormatError as err:
        return "format" if str(err).startswith(_CASE_PATH) else f"format-unnamed: {err}"
    except Exception as err:  # the corpus exists to find these
        return f"other: {type(err).__name__}: {err}"


_CASE_PATH = ""


def run_case(pack: Path, offset: int, work: Path, expected: dict[str, object]) -> dict[str, str]:
    """Zero ``BLOCK`` bytes of a copy of ``pack`` at ``offset``; report each reader's outcome."""
    global _CASE_PATH
    from h5pack.check import pack_info, verify_pack
    from h5pack.read.reader import PackReader

    damaged = work / "damaged.h5"
    shutil.copyfile(pack, damaged)
    _CASE_PATH = str(damaged)
    with open(damaged, "r+b") as raw:
        raw.seek(offset)
        raw.write(b"\0" * BLOCK)

    def info() -> str:
        pack_info(damaged)
        return "ok"

    def verify() -> str:
        report = verify_pack(damaged)
        return "ok" if report.ok else "problems"

    def read() -> str:
        with PackReader(damaged) as reader:
            stored = reader.read_stored(np.arange(len(reader)))
            got = {
                "samples": [s.tobytes().hex() for s in stored],
                "labels": reader.meta.labels.tolist(),
                "paths": list(reader.paths),
            }
        return "correct" if got == expected else "wrong"

    return {"info": _outcome(info), "verify": _outcome(verify), "read": _outcome(read)}


def child_main() -> None:
    """The child's loop: ``pack work expected.json`` in argv, offsets on stdin, JSON out."""
    pack, work, expected_file = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    expected = json.loads(expected_file.read_text())
    for line in sys.stdin:
        offset = int(line)
        print(json.dumps({"offset": offset, **run_case(pack, offset, work, expected)}), flush=True)


def run_corpus(
    pack: Path, offsets: list[int], work: Path, *, limit_cpu_s: float
) -> list[dict[str, object]]:
    """Run every case in a child process, ``limit_cpu_s`` of CPU each; past it: ``hang``."""
    expected_file = work / "expected.json"
    expected_file.write_text(json.dumps(expected_of(pack)))
    results: list[dict[str, object]] = []
    pending = list(offsets)
    while pending:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.damage_cases", str(pack), str(work), str(expected_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        pump = threading.Thread(target=_pump, args=(child.stdout, lines), daemon=True)
        pump.start()
        started = False
        try:
            while pending:
                offset = pending[0]
                child.stdin.write(f"{offset}\n")
                child.stdin.flush()
                # the first case also pays the interpreter's start and imports
                outcome = _wait(child, lines, limit_cpu_s + (0 if started else 10))
                started = True
                pending.pop(0)
                results.append({"offset": offset, **outcome})
                if "outcome" in outcome:  # hung or crashed: a fresh child for the rest
                    break
            else:
                child.stdin.close()
        except BrokenPipeError:
            results.append({"offset": pending.pop(0), "outcome": "crash: the child exited"})
        finally:
            child.kill()
            child.wait()
            pump.join(timeout=10)
            for stream in (child.stdin, child.stdout, child.stderr):
                if stream is not None and not stream.closed:
                    with contextlib.suppress(BrokenPipeError):
                        stream.close()
    return results


def _pump(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)


def _cpu_s(process: psutil.Process) -> float:
    with contextlib.suppress(psutil.Error):  # exited: the caller sees it through poll()
        times = process.cpu_times()
        return times.user + times.system
    return 0.0


def _wait(
    child: subprocess.Popen[str], lines: queue.Queue[str], limit_cpu_s: float
) -> dict[str, str]:
    """Return the child's outcome of the current case, or ``hang`` / ``crash``."""
    process = psutil.Process(child.pid)
    budget = _cpu_s(process) + limit_cpu_s
    while _cpu_s(process) < budget:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if child.poll() is not None:
                error = child.stderr.read() if child.stderr else ""
                return {"outcome": f"crash: exit {child.returncode}: {error[-300:]}"}
            continue
        try:
            outcome: dict[str, str] = json.loads(line)
        except json.JSONDecodeError:
            continue  # something the libraries printed
        outcome.pop("offset", None)
        return outcome
    return {"outcome": "hang"}


if __name__ == "__main__":
    child_main()
