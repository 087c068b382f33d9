"""Open a pack first in a child process under a time limit: damage reported, never hung on.

NOTE [ Probing a pack in a child ]

Some damage to HDF5's unchecksummed structures (the global heap of variable-length data,
which format 1.0 packs hold) makes HDF5 loop forever inside one C call: ``h5pack info``
and ``verify`` spun at 100% CPU on 4 of 20 damaged 1.0 packs. Such a loop cannot be
interrupted from inside the process (no signal handler runs while the call holds the
GIL), so ``info`` and ``verify`` first read everything a first open reads (attributes,
every small dataset, the paths, the chunk index) in a fresh interpreter (``subprocess``:
no HDF5 handle crosses a fork, and unlike multiprocessing's spawn the user's main module
is not imported again) and kill it after ``timeout_s``. Whatever the child could not do
(an error, a crash, the time limit) is reported as damage; when it succeeds, the same
reads in this process take the same path through HDF5 and finish too. It costs one
interpreter start (~0.4 s), so the CLI uses it and library calls choose it
(``timeout_s=``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from h5pack._types import StrPath
from h5pack.errors import FormatError, PackNotFoundError

# Seconds the CLI gives the child: reading the metadata of a pack of millions of samples
# over a network file system takes seconds, not minutes.
PROBE_TIMEOUT_S = 120.0

_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from h5pack.check.probe import probe_main; probe_main(sys.argv[2], sys.argv[3] == 'strict')"
)
# Where h5pack is imported from, so that the child imports the same code.
_ROOT = str(Path(__file__).resolve().parents[2])
_DAMAGED = "the pack is damaged: re-create it, or restore it from a copy"


def probe_main(path: str, strict: bool) -> None:
    """Read a pack's metadata, paths and chunk index; print one JSON line (the child's side)."""
    from h5pack.core import format as fmt

    result: dict[str, str]
    try:
        with fmt.open_h5(path) as handle:
            meta = fmt.read_meta(handle, path, check_digests=strict)
            fmt.read_paths(handle, meta, check=strict)
            with fmt.reading(path, "the images' chunk index"):
                images = handle[fmt.IMAGES]
                if images.chunks is not None:
                    images.id.chunk_iter(lambda info: None)
        result = {"kind": "ok", "message": ""}
    except PackNotFoundError as err:
        result = {"kind": "missing", "message": str(err)}
    except FormatError as err:
        # not strict: the caller meets the same error in its own process and reports it
        result = {"kind": "format" if strict else "ok", "message": str(err)}
    except Exception as err:  # anything else HDF5 raised on a damaged file is damage too
        result = {"kind": "other", "message": f"{type(err).__name__}: {err}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def probe_pack(path: StrPath, *, timeout_s: float = PROBE_TIMEOUT_S, strict: bool = True) -> None:
    """Read the pack's metadata in a child process; raise what it found wrong.

    See the note "Probing a pack in a child".

    Args:
        path: The pack.
        timeout_s: The child's time limit.
        strict: Raise what the child found wrong. ``False`` (``verify``, which reports
            damaged metadata itself) raises only when the child hung or crashed.

    Raises:
        FileNotFoundError: the pack does not exist.
        FormatError: the file is not a pack, or is damaged: the child reported an error,
            crashed, or did not finish within ``timeout_s``.
    """
    text = os.fspath(path)
    if not Path(text).exists():
        raise PackNotFoundError(f"{text}: no such pack")
    command = [sys.executable, "-c", _CHILD, _ROOT, text, "strict" if strict else "lenient"]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as err:
        raise FormatError(
            f"{text}: reading the pack's metadata did not finish within {timeout_s:g} s "
            f"(HDF5 loops on some damaged metadata); {_DAMAGED}"
        ) from err
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise FormatError(
            f"{text}: reading the pack's metadata crashed the process that tried (exit "
            f"{done.returncode}: {last[0]}); {_DAMAGED}"
        )
    kind, message = result.get("kind"), str(result.get("message", ""))
    if kind == "missing":
        raise PackNotFoundError(message)
    if kind == "format":
        raise FormatError(message)
    if kind != "ok":
        raise FormatError(f"{text}: the pack's metadata cannot be read ({message}); {_DAMAGED}")
