"""The C half of :mod:`h5pack.read.checkedcopy` (``_checkedcopy.c``; NOTE [ Checked as copied ])."""

import numpy as np
from typing_extensions import Buffer

def copy(
    source: Buffer | np.ndarray,
    out: Buffer | np.ndarray,
    starts: Buffer | np.ndarray,
    rows: Buffer | np.ndarray,
    sample_bytes: int,
    recorded: Buffer | np.ndarray | None = None,
    /,
) -> int: ...
def digest(data: Buffer | np.ndarray, /) -> int: ...
