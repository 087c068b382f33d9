"""A command's progress and events, rendered with tqdm on stderr."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Progress:
    """Render a conversion's events and progress with tqdm (on stderr)."""

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
        """Handle a ``ConvertEvent`` or a ``CompareEvent``."""
        if event.kind == "skipped":
            self.note(f"Warning: {event.message}")
            return
        if event.kind in ("step", "status"):  # on the bar: a step done, or what runs now
            if self.bar is not None:
                self.bar.set_description_str(event.message)
                self.bar.update(int(event.kind == "step"))
            return
        self.close()  # every other event comes between phases
        if event.kind == "phase":
            if not self.quiet:
                unit = getattr(event, "unit", "img")
                self.bar = self._tqdm(
                    total=event.total, desc=event.message, unit=unit, file=sys.stderr
                )
        elif not self.quiet:
            self.note(event.message)

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
    """Lend a ``Progress`` (quiet or not) and close its bar at the end.

    Meanwhile the library's log records are not printed: they repeat the events that the
    ``Progress`` renders (``convert`` logs a summary of the files it skipped for callers
    that do not watch its events).
    """
    progress = Progress(quiet=quiet)
    library = logging.getLogger("h5pack")
    silence = logging.NullHandler()
    library.addHandler(silence)  # no last-resort handler printing them to stderr
    try:
        yield progress
    finally:
        library.removeHandler(silence)
        progress.close()
