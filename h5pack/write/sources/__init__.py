"""Where a conversion's samples come from: one ``SampleSource`` per kind of input.

Adding a kind of input is one module (a ``SampleSource`` subclass with ``kind``,
``matches`` and ``find``), one line in ``KINDS`` (which ``--from`` offers), and its test.
"""

from __future__ import annotations

from pathlib import Path

from h5pack._types import StrPath
from h5pack.errors import OptionsError
from h5pack.write.sources.arrays import ArraySource
from h5pack.write.sources.base import (
    FileRange,
    Listing,
    PathSource,
    Sample,
    SampleSource,
    SizeHint,
)
from h5pack.write.sources.folder import FolderSource
from h5pack.write.sources.tar import TarSource

__all__ = [
    "KINDS",
    "ArraySource",
    "FileRange",
    "FolderSource",
    "Listing",
    "PathSource",
    "Sample",
    "SampleSource",
    "SizeHint",
    "TarSource",
    "sample_source",
]

KINDS: dict[str, type[PathSource]] = {
    "folder": FolderSource,
    "tar": TarSource,
}
"""The sources a path can name, by ``--from`` name; detection tries them in this order."""


def sample_source(
    source: StrPath | SampleSource, *, kind: str = "auto", labels_csv: StrPath | None = None
) -> SampleSource:
    """Return the source that ``source`` names (a ``SampleSource`` is returned as it is).

    Args:
        source: A path (a folder...), or a source.
        kind: One of ``KINDS``, or ``"auto"``: the first kind that ``matches`` the path
            (a folder when none does, which then says what is wrong with the path).
        labels_csv: A labels CSV for the source's samples.

    Raises:
        OptionsError: ``kind`` is not known.
    """
    if isinstance(source, SampleSource):
        return source
    if kind == "auto":
        path = Path(source)
        kind = next((name for name, cls in KINDS.items() if cls.matches(path)), "folder")
    if kind not in KINDS:
        raise OptionsError(f"--from should be one of auto, {', '.join(KINDS)}, but got {kind!r}")
    return KINDS[kind](source, labels_csv=labels_csv)
