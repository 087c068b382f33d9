"""Errors raised by h5pack; each also inherits the matching built-in."""

from __future__ import annotations

import shlex
from pathlib import Path

# ``h5pack`` on the package index is an unrelated audio tool (docs/decisions/0100).
DISTRIBUTION = "h5pack-images"


def install_line(extra: str) -> str:
    """Return the command that installs ``extra`` into the environment running this h5pack.

    From a checkout (the project is not on the package index yet), the checkout's own path.
    """
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        return f"pip install -e {shlex.quote(f'{checkout}[{extra}]')}"
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class H5PackError(Exception):
    """Base class of every error h5pack raises on purpose."""


class SourceError(H5PackError, FileNotFoundError):
    """The image source is missing, empty or unreadable."""


class DecodeError(H5PackError, ValueError):
    """An image file could not be decoded (corrupt, truncated, unsupported, too large)."""


class FormatError(H5PackError, ValueError):
    """A file is not a valid h5pack pack, or is of an unsupported format version."""


class OptionsError(H5PackError, ValueError):
    """A combination of options is impossible; the message says what to do instead."""


class TargetExistsError(H5PackError, FileExistsError):
    """The target file exists and overwriting was not asked for."""


class VerifyError(H5PackError, ValueError):
    """A pack failed verification."""


class PackNotFoundError(FormatError, FileNotFoundError):
    """The pack's path does not exist."""


class PackReplacedError(FormatError):
    """The path names another file than the one opened first (replaced, rewritten)."""


class CacheClosedError(H5PackError, ValueError):
    """A decoded cache was closed in this process, or its owner closed it or exited."""


class RemoteError(H5PackError, OSError):
    """A remote object cannot be read: missing, denied, or the network failed after retries."""


class UnsupportedRequestError(RemoteError):
    """The server does not implement a request (HTTP 501 NotImplemented): never retried."""
