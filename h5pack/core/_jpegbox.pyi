"""The C half of :mod:`h5pack.core.jpegbox` (``_jpegbox.c``)."""

import numpy as np
from typing_extensions import Buffer

def load(path: str, /) -> None: ...
def decode_box(
    data: Buffer | np.ndarray,
    image_height: int,
    image_width: int,
    top: int,
    left: int,
    height: int,
    width: int,
    channels: int,
    out: Buffer | np.ndarray,
    reduction: int = 1,
    canvas: bool = False,
    /,
) -> tuple[int, int]: ...
