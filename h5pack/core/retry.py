"""Retries by time, for every store's requests: ``RetryPolicy`` and ``retrying``.

NOTE [ Retries by time ]

A request that fails in a way worth trying again (a reset, a timeout, a 5xx, throttling)
is tried again until ``retry_timeout_s`` has passed since its first attempt, not a fixed
number of times: S3 throttles (503 SlowDown) for tens of seconds. As the AWS SDKs' standard
mode (docs/decisions/0115-retries-and-checked-uploads.md), the wait before retry ``n`` is
full jitter, ``random() * min(max_backoff_s, base * 2**n)`` (base ``throttle_backoff_s``
after throttling, else ``backoff_s``), at least a server's ``Retry-After``; the last wait is
cut to the deadline. Past it (or ``max_attempts``), one ``RetriesExhaustedError`` names the
request, the attempts, the last cause and the option that gives more time.

Every store's options class is a ``RetryPolicy``: it names the other spellings of its
settings (``ALIASES``) and the environment variables it reads (``ENVIRONMENT``), and ``of``
parses the user's settings over the environment's, the one place either is read.
"""

from __future__ import annotations

import email.utils
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from h5pack.core.secrets import redacted
from h5pack.errors import OptionsError, RemoteError

T = TypeVar("T")
P = TypeVar("P", bound="RetryPolicy")
# From the system: no process's random state is touched, forked workers never wait in step.
_JITTER = random.SystemRandom()


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long and how a failing request is tried again (NOTE [ Retries by time ]).

    Attributes:
        retry_timeout_s: Seconds after a request's first attempt during which it is tried
            again; 0: one attempt.
        max_attempts: The most attempts of one request, the first included; None: as many
            as fit the time.
        backoff_s: The base of the waits after transient errors (resets, timeouts, 5xx).
        throttle_backoff_s: The base of the waits after throttling (503 SlowDown, 429).
        max_backoff_s: The longest wait the backoff draws (a Retry-After may ask more).

    Raises:
        OptionsError: a duration is negative or ``max_attempts`` is below 1.
    """

    ALIASES: ClassVar[Mapping[str, str]] = {
        "attempts": "max_attempts",
        "retries": "max_attempts",
        "retry_timeout": "retry_timeout_s",
    }
    ENVIRONMENT: ClassVar[Mapping[str, str]] = {}

    retry_timeout_s: float = 60.0
    max_attempts: int | None = None
    backoff_s: float = 0.05
    throttle_backoff_s: float = 1.0
    max_backoff_s: float = 20.0

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise OptionsError(
                f"max_attempts should be >= 1, but got max_attempts={self.max_attempts}"
            )
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.endswith("_s") and value < 0:
                raise OptionsError(f"{item.name} should be >= 0, but got {item.name}={value}")

    @classmethod
    def of(cls: type[P], settings: Mapping[str, Any]) -> P:
        """Return the environment's settings overridden by ``settings``, typed.

        Keys may be spelled as ``ALIASES`` says; a value of None or ``""`` is not set.

        Raises:
            OptionsError: an unknown key, or a value of the wrong kind.
        """
        kinds = {f.name: str(f.type) for f in fields(cls) if f.init}
        values: dict[str, Any] = {}
        for key, value in [*cls.from_environment().items(), *settings.items()]:
            name = cls.ALIASES.get(key, key)
            if name not in kinds:
                known = ", ".join(sorted(kinds))
                raise OptionsError(f"unknown storage option {key!r}; known: {known}")
            values.pop(name, None)
            if value is None or value == "":
                continue
            try:
                if kinds[name].startswith("int"):
                    value = int(value)
                elif kinds[name].startswith("float"):
                    value = float(value)
                elif kinds[name].startswith("bool") and isinstance(value, str):
                    value = value.lower() in ("1", "true", "yes")
            except ValueError as err:
                shown = (redacted({key: value}) or {})[key]
                raise OptionsError(f"storage option {key}={shown!r}: {err}") from None
            values[name] = value
        return cls(**values)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return the settings the environment (``ENVIRONMENT``) sets."""
        environ = os.environ if environ is None else environ
        return {name: environ[v] for v, name in cls.ENVIRONMENT.items() if environ.get(v)}

    def wait_s(self, retry: int, transient: Transient, draw: float) -> float:
        """Return the wait before retry ``retry`` (0 first) after ``transient``; ``draw`` in [0, 1).

        Example:
            >>> policy = RetryPolicy(backoff_s=0.05, throttle_backoff_s=1.0)
            >>> policy.wait_s(3, Transient("HTTP 503 SlowDown", throttled=True), 0.5)
            4.0
            >>> policy.wait_s(0, Transient("reset", retry_after_s=2.5), 0.5)
            2.5
        """
        base = self.throttle_backoff_s if transient.throttled else self.backoff_s
        wait = draw * min(self.max_backoff_s, base * 2 ** min(retry, 62))
        return max(float(wait), transient.retry_after_s or 0.0)


@dataclass(frozen=True)
class Transient:
    """A failure worth trying again: its cause, whether throttled, the server's Retry-After."""

    cause: str
    throttled: bool = False
    retry_after_s: float | None = None


class RetriesExhaustedError(RemoteError):
    """A request still failed when its retries ran out: ``attempts``, ``elapsed_s``, ``cause``."""

    def __init__(self, message: str, *, attempts: int, elapsed_s: float, cause: str) -> None:
        super().__init__(message)
        self.attempts, self.elapsed_s, self.cause = attempts, elapsed_s, cause


def retrying(
    policy: RetryPolicy,
    attempt: Callable[[], T],
    classify: Callable[[Exception], Transient | None],
    *,
    what: str | Callable[[], str],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    draw: Callable[[], float] = _JITTER.random,
) -> T:
    """Return ``attempt()``, tried again under ``policy`` while ``classify`` says transient.

    ``classify`` returns the ``Transient`` of an exception worth trying again, None to raise
    it as it is, or raises a final error of its own; ``what`` names the request for the
    final ``RetriesExhaustedError``; ``clock``, ``sleep`` and ``draw`` are injected by tests.
    """
    started = clock()
    deadline = started + policy.retry_timeout_s
    attempts = 0
    while True:
        attempts += 1
        try:
            return attempt()
        except Exception as err:
            transient = classify(err)
            if transient is None:
                raise
        now = clock()
        wait = policy.wait_s(attempts - 1, transient, draw())
        asked = transient.retry_after_s
        out_of_time = now >= deadline or (asked is not None and now + asked > deadline)
        capped = policy.max_attempts is not None and attempts >= policy.max_attempts
        if out_of_time or capped:
            limit = f"retry_timeout_s={policy.retry_timeout_s:g}: raise it to wait longer"
            if capped and not out_of_time:
                limit = f"max_attempts={policy.max_attempts}"
            said = "" if asked is None else f"; the server asked to wait {asked:g} s"
            request = what if isinstance(what, str) else what()
            plural = "s" * (attempts != 1)
            raise RetriesExhaustedError(
                f"{request}: gave up after {attempts} attempt{plural} over {now - started:.1f} s "
                f"(storage option {limit}){said}; last cause: {transient.cause}",
                attempts=attempts,
                elapsed_s=now - started,
                cause=transient.cause,
            ) from None
        sleep(min(wait, deadline - now))


def retry_after_s(value: str | None, *, milliseconds: str | None = None) -> float | None:
    """Return the wait a ``Retry-After`` header (seconds or a date) asks for; None: none.

    ``milliseconds``: S3's ``x-amz-retry-after``, which wins when set.

    Example:
        >>> retry_after_s("3"), retry_after_s(None, milliseconds="1500"), retry_after_s("soon")
        (3.0, 1.5, None)
    """
    if milliseconds and milliseconds.strip().isdigit():
        return int(milliseconds) / 1000
    value = (value or "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return None if when.tzinfo is None else max(0.0, when.timestamp() - time.time())
