"""The C half of :mod:`h5pack.read.batchplan` (``_batchplan.c``)."""

import numpy as np
from typing_extensions import Buffer

def raw_outputs(
    before: Buffer | np.ndarray,
    indices: Buffer | np.ndarray,
    after: Buffer | np.ndarray,
    out: Buffer | np.ndarray,
    /,
) -> None: ...
