"""The target file of a conversion: checks, a hidden temporary name, publishing, signals.

A pack is written to ``.<name>.<pid>.tmp`` beside the target and published only when
complete; until then nothing exists under the target's name, so a killed conversion
(SIGKILL included) never leaves a half-written pack there. See docs/ARCHITECTURE.md,
"Conversion pipeline".
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.errors import OptionsError, TargetExistsError


def check_target(target: StrPath, *, overwrite: bool) -> Path:
    """Return the target path, refusing an existing one unless ``overwrite``.

    Raises:
        TargetExistsError: the target exists and ``overwrite`` is False.
        OptionsError: the target is a directory, or its directory does not exist.
    """
    path = Path(target)
    if path.is_dir():
        raise OptionsError(f"{path} is a directory; give the pack's file name, e.g. {path}/out.h5")
    if not path.parent.is_dir():
        raise OptionsError(f"{path.parent} is not a directory; create it first")
    if path.exists() and not overwrite:
        raise TargetExistsError(f"{path} already exists; pass --overwrite to replace it")
    return path


def temp_path(target: Path, tag: str = "") -> Path:
    """Return the hidden temporary name beside ``target`` for this process."""
    return target.parent / f".{target.name}.{os.getpid()}{tag}.tmp"


class TempFiles:
    """Temporary files of one conversion, removed unless published."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def add(self, path: Path) -> Path:
        """Track ``path``; return it."""
        self.paths.append(path)
        return path

    def remove_all(self) -> None:
        """Remove every tracked file that still exists."""
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def publish(temp: Path, target: Path, *, overwrite: bool) -> None:
    """Move the finished file into place (atomically; without overwrite, never clobbering)."""
    if overwrite:
        os.replace(temp, target)
        return
    try:
        os.link(temp, target)  # fails if the target appeared meanwhile
    except FileExistsError as err:
        raise TargetExistsError(f"{target} appeared during the conversion; not replaced") from err
    except OSError:  # no hard links on this file system
        if target.exists():
            raise TargetExistsError(
                f"{target} appeared during the conversion; not replaced"
            ) from None
        os.replace(temp, target)
        return
    temp.unlink()


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(143)`` so that ``finally`` blocks clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
