"""Type aliases shared across h5pack."""

from __future__ import annotations

import os
from typing import TypeAlias, TypeVar

StrPath: TypeAlias = "str | os.PathLike[str]"

Choice = TypeVar("Choice", bound=str)


def parse_choice(value: object, choices: tuple[Choice, ...]) -> Choice | None:
    """Return the member of ``choices`` equal to ``value`` (typed as the choice), else None."""
    for choice in choices:
        if choice == value:
            return choice
    return None
