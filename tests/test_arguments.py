"""h5pack.core.arguments: one message shape for bad arguments, naming the parameter."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from h5pack.core import arguments
from h5pack.core.arguments import check_bool, check_int, check_optional_int, check_seed
from h5pack.errors import OptionsError


def test_docstring_examples() -> None:
    assert doctest.testmod(arguments, optionflags=doctest.ELLIPSIS).failed == 0


def test_integers_numpy_included_and_nothing_else() -> None:
    assert check_int("n", np.int64(3), minimum=1) == 3
    assert check_optional_int("n", None, minimum=1) is None
    for bad in (2.5, "8", None, True, np.float32(2)):
        with pytest.raises(OptionsError, match=r"n should be an integer >= 1, but got n="):
            check_int("n", bad, minimum=1)
    with pytest.raises(OptionsError, match=r"n should be an integer in 1\.\.3 or None"):
        check_optional_int("n", 4, minimum=1, maximum=3)


def test_seeds_torch_takes() -> None:
    assert check_seed("seed", 2**64 - 1) == 2**64 - 1
    assert check_seed("seed", -(2**63)) == -(2**63)
    for bad in (2**64, -(2**63) - 1, 1.0, "1"):
        with pytest.raises(OptionsError, match="seed should be an integer in"):
            check_seed("seed", bad)


def test_bools() -> None:
    check_bool("flag", True)
    check_bool("flag", None, optional=True)
    with pytest.raises(OptionsError, match="flag should be True or False, but got flag=1"):
        check_bool("flag", 1)
