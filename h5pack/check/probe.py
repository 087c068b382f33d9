"""Open a pack first in a child process under a time limit: damage reported, never hung on.

NOTE [ Probing a pack in a child ]: some damage to HDF5's unchecksummed structures (the
global heap of format 1.0 packs) makes HDF5 spin forever inside one C call. So ``info`` and
``verify`` first read what a first open reads in a fresh interpreter (no HDF5 handle crosses
a fork) and kill it once it has spent ``timeout_s`` of CPU time (not the clock: a busy
machine cannot make a good pack look damaged) on one pack. An error, a crash or the limit is
reported as damage. A set's shards share one child; one that hangs it gets a fresh child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psutil

from h5pack._types import StrPath
from h5pack.core.source import readable
from h5pack.errors import FormatError, H5PackError, PackNotFoundError

PROBE_TIMEOUT_S = 120.0  # CPU seconds the CLI gives the child on a pack
_POLL_S = 0.1  # how often the parent looks at the child's CPU time

# The child of ``probe_packs``: pack paths on stdin (JSON), one result line per pack.
_CHILD_MANY = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from h5pack.check.probe import probe_many_main; probe_many_main(sys.argv[2] == 'strict')"
)
_ROOT = str(Path(__file__).resolve().parents[2])
_DAMAGED = "the pack is damaged: re-create it, or restore it from a copy"


def probe_many_main(strict: bool) -> None:
    """Probe each pack of the JSON list on stdin in turn; print one JSON line per pack."""
    for path in json.loads(sys.stdin.read()):
        sys.stdout.write(json.dumps(_probe_here(str(path), strict)) + "\n")
        sys.stdout.flush()


def _probe_here(path: str, strict: bool) -> dict[str, str]:
    """Read a pack's metadata, paths and chunk index in this process; say what went wrong."""
    from h5pack.core import format as fmt

    try:
        with fmt.open_h5(path) as handle:
            meta = fmt.read_meta(handle, path, check_digests=strict)
            fmt.read_paths(handle, meta, check=strict)
            with fmt.reading(path, "the images' chunk index"):
                images = handle[fmt.IMAGES]
                if images.chunks is not None:
                    images.id.chunk_iter(lambda info: None)
    except PackNotFoundError as err:
        return {"kind": "missing", "message": str(err)}
    except FormatError as err:
        # not strict: the caller meets the same error in its own process and reports it
        return {"kind": "format" if strict else "ok", "message": str(err)}
    except Exception as err:  # anything else HDF5 raised on a damaged file is damage too
        return {"kind": "other", "message": f"{type(err).__name__}: {err}"}
    return {"kind": "ok", "message": ""}


def probe_pack(path: StrPath, *, timeout_s: float = PROBE_TIMEOUT_S, strict: bool = True) -> None:
    """Read the pack's metadata in a child process; raise what it found wrong.

    ``timeout_s`` is CPU time; ``strict=False`` (``verify``) raises only when the child hung
    or crashed.
    """
    (error,) = probe_packs([path], timeout_s=timeout_s, strict=strict)
    if error is not None:
        raise error


def probe_packs(
    paths: Sequence[StrPath], *, timeout_s: float = PROBE_TIMEOUT_S, strict: bool = True
) -> list[H5PackError | None]:
    """Return what ``probe_pack`` would raise for each pack (or None), probed in one child."""
    texts = [os.fspath(p) for p in paths]
    errors: list[H5PackError | None] = [None] * len(texts)
    pending = []
    for index, text in enumerate(texts):
        if Path(text).exists():
            pending.append(index)
        else:
            errors[index] = PackNotFoundError(f"{text}: no such pack")
    while pending:
        reported = _probe_in_child([texts[i] for i in pending], timeout_s, strict)
        for index, error in zip(pending, reported, strict=False):
            errors[index] = error
        pending = pending[len(reported) :]
    return errors


def _probe_in_child(texts: list[str], timeout_s: float, strict: bool) -> list[H5PackError | None]:
    """Probe ``texts`` in one child until one hangs or crashes it (that one is reported last)."""
    results: list[H5PackError | None] = []
    with tempfile.TemporaryDirectory(prefix="h5pack-probe-") as work:
        listing = Path(work, "packs.json")
        listing.write_text(json.dumps(texts), encoding="utf-8")
        stderr_path = Path(work, "stderr")
        with open(listing, "rb") as stdin, open(stderr_path, "wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD_MANY, _ROOT, "strict" if strict else "lenient"],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        assert child.stdout is not None
        process = psutil.Process(child.pid)
        buffer = b""
        try:
            for text in texts:
                limit_s = _cpu_s(process) + timeout_s
                while b"\n" not in buffer:
                    if not readable(child.stdout, _POLL_S):
                        if _cpu_s(process) < limit_s:
                            continue
                        return [
                            *results,
                            FormatError(
                                f"{text}: reading the pack's metadata did not finish within "
                                f"{timeout_s:g} s of CPU time (HDF5 loops on some damaged "
                                f"metadata); {_DAMAGED}"
                            ),
                        ]
                    data = os.read(child.stdout.fileno(), 1 << 16)
                    if not data:  # the child died on this pack
                        code = child.wait()
                        lines = stderr_path.read_text(errors="replace").strip().splitlines()
                        last = (lines[-1:] or ["no output"])[0]
                        crashed = f"crashed the process that tried (exit {code}: {last})"
                        message = f"{text}: reading the pack's metadata {crashed}; {_DAMAGED}"
                        return [*results, FormatError(message)]
                    buffer += data
                line, buffer = buffer.split(b"\n", 1)
                results.append(_error_of(text, line))
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
            child.stdout.close()
    return results


def _cpu_s(process: psutil.Process) -> float:
    """The CPU seconds ``process`` has spent; 0 once it has exited."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _error_of(text: str, line: bytes) -> H5PackError | None:
    """Return the error the child's result ``line`` on pack ``text`` stands for, or None."""
    try:
        result = json.loads(line)
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        return FormatError(f"{text}: the process reading its metadata answered {line[:80]!r}")
    kind, message = result.get("kind"), str(result.get("message", ""))
    if kind == "missing":
        return PackNotFoundError(message)
    if kind == "format":
        return FormatError(message)
    if kind != "ok":
        return FormatError(f"{text}: the pack's metadata cannot be read ({message}); {_DAMAGED}")
    return None
