"""Type aliases shared across h5pack."""

from __future__ import annotations

import os
from typing import TypeAlias

StrPath: TypeAlias = "str | os.PathLike[str]"
