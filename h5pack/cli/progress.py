"""A command's progress and events, rendered with tqdm on stderr."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Progress:
    """Render a command's events (``ConvertEvent``, ``CompareEvent``) and progress bar."""

    def __init__(self, *, quiet: bool) -> None:
        from tqdm import tqdm

        tqdm.monitor_interval = 0  # no monitor thread (the writer forks its workers)
        self._tqdm = tqdm
        self.quiet = quiet
        self.bar: Any = None

    def note(self, message: str) -> None:
        """Print a line without breaking the bar."""
        self._tqdm.write(message, file=sys.stderr)

    def event(self, event: Any) -> None:
        """Show an event: a warning, a step on the bar, a new phase's bar, or a note."""
        if event.kind == "skipped":
            self.note(f"Warning: {event.message}")
        elif event.kind in ("step", "status"):  # a step done, or what runs now
            if self.bar is not None:
                self.bar.set_description_str(event.message)
                self.bar.update(int(event.kind == "step"))
        elif event.kind == "phase":
            self.phase(event.message, event.total, getattr(event, "unit", "img"))
        else:  # between phases
            self.close()
            if not self.quiet:
                self.note(event.message)

    def phase(self, message: str, total: int | None, unit: str = "img") -> None:
        """Start a bar of ``total`` steps (None: unknown), unless quiet."""
        self.close()
        if not self.quiet:
            self.bar = self._tqdm(total=total, desc=message, unit=unit, file=sys.stderr)

    def advance(self, count: int) -> None:
        """Advance the bar."""
        if self.bar is not None:
            self.bar.update(count)

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@contextmanager
def progress_for(quiet: bool) -> Iterator[Progress]:
    """Lend a ``Progress``, closing its bar at the end; the library's logs (the events) muted."""
    progress = Progress(quiet=quiet)
    library = logging.getLogger("h5pack")
    silence = logging.NullHandler()
    library.addHandler(silence)  # no last-resort handler printing them to stderr
    try:
        yield progress
    finally:
        library.removeHandler(silence)
        progress.close()
