"""Checks of user arguments, in one message shape: ``x should be ..., but got x=...``."""

from __future__ import annotations

import operator
from typing import SupportsIndex

from h5pack.errors import OptionsError


def _bounds(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in {minimum}..{maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    return f" <= {maximum}" if maximum is not None else ""


def check_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Return ``value`` (an int or numpy integer) as an int, or raise naming ``name``."""
    what = f"an integer{_bounds(minimum, maximum)}"
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise OptionsError(f"{name} should be {what}, but got {name}={value!r}")
    number = operator.index(value)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise OptionsError(f"{name} should be {what}, but got {name}={value!r}")
    return number


def check_optional_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """Return None for None, else ``check_int(name, value, ...)`` (the message says "or None")."""
    if value is None:
        return None
    try:
        return check_int(name, value, minimum=minimum, maximum=maximum)
    except OptionsError:
        what = f"an integer{_bounds(minimum, maximum)} or None"
        raise OptionsError(f"{name} should be {what}, but got {name}={value!r}") from None


def check_bool(name: str, value: object, *, optional: bool = False) -> None:
    """Raise ``OptionsError`` naming ``name`` unless ``value`` is a bool (or None if allowed)."""
    if not isinstance(value, bool) and not (value is None and optional):
        what = "True or False" + (" or None" if optional else "")
        raise OptionsError(f"{name} should be {what}, but got {name}={value!r}")


def check_seed(name: str, value: object) -> int:
    """Return the seed ``value`` as an int in torch.Generator's range, or raise naming ``name``."""
    try:
        return check_int(name, value, minimum=-(2**63), maximum=2**64 - 1)
    except OptionsError:
        raise OptionsError(
            f"{name} should be an integer in -2**63 .. 2**64 - 1, but got {name}={value!r} "
            "(torch.Generator takes no other)"
        ) from None
