"""Retries by time, for every store's requests: ``RetryPolicy`` and ``retrying``.

NOTE [ Retries by time ]

A request that fails in a way worth trying again (a reset, a timeout, a 5xx, throttling)
is tried again until ``retry_timeout_s`` has passed since its first attempt, not a fixed
number of times: S3 throttles (503 SlowDown) for tens of seconds, and a count of tries
from a small backoff gives up in one or two. The model is the AWS SDKs' standard mode
(docs/decisions/0115-retries-and-checked-uploads.md):

- the wait before retry ``n`` (0 first) is full jitter, ``random() * min(max_backoff_s,
  base * 2**n)``, the base ``throttle_backoff_s`` after throttling, else ``backoff_s``;
- a server's ``Retry-After`` (or S3's ``x-amz-retry-after``) is waited at least;
- the last wait is cut to the deadline, so one attempt lands on it; past it, one
  ``RetriesExhaustedError`` says what was asked, how many attempts over how long, the
  last cause and the option that gives more time. ``max_attempts`` also caps the count.

A store's options class inherits ``RetryPolicy``, so its fields are settings of every store
(``--storage-option retry_timeout_s=120``); it names its other spellings (``ALIASES``) and
the environment variables it reads (``ENVIRONMENT``): ``of`` parses the user's settings over
the environment's, the one place either is read (``open_store`` calls it).
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
# The jitter's draws: from the system, so no process's random state is touched and forked
# workers never wait in step.
_JITTER = random.SystemRandom()

# Error codes and statuses that mean "too many requests: slow down" (S3, GCS, Azure, HTTP).
THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ServerBusy",
        "rateLimitExceeded",
        "503",
        "429",
    }
)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long and how a failing request is tried again (NOTE [ Retries by time ]).

    Attributes:
        retry_timeout_s: Seconds after a request's first attempt during which it is tried
            again (obstore's ``retry_timeout``); 0: one attempt.
        max_attempts: The most attempts of one request (``attempts``, ``retries``; as
            botocore's ``max_attempts``, the first included); None: as many as fit the time.
        backoff_s: The base of the waits after transient errors (resets, timeouts, 5xx).
        throttle_backoff_s: The base of the waits after throttling (503 SlowDown, 429).
        max_backoff_s: The longest wait the backoff draws (a Retry-After may ask more).

    Raises:
        OptionsError: a duration is negative or ``max_attempts`` is below 1.
    """

    # other spellings of the settings, and the environment variable -> setting read
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
        for name in ("retry_timeout_s", "backoff_s", "throttle_backoff_s", "max_backoff_s"):
            if getattr(self, name) < 0:
                raise OptionsError(f"{name} should be >= 0, but got {name}={getattr(self, name)}")

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
        """Return the wait before retry ``retry`` (0 first) after ``transient``.

        Args:
            retry: How many retries came before this one.
            transient: What failed.
            draw: A number in ``[0, 1)`` (the jitter).

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
    """A failure worth trying again (what a store's ``classify`` returns).

    Attributes:
        cause: What failed, for the final error (``HTTP 503 SlowDown``, ``timeout``...).
        throttled: The server asked to slow down (the waits grow from ``throttle_backoff_s``).
        retry_after_s: The server's ``Retry-After``, in seconds (None: none).
    """

    cause: str
    throttled: bool = False
    retry_after_s: float | None = None


class RetriesExhaustedError(RemoteError):
    """A request still failed when its retries ran out (time or ``max_attempts``).

    Attributes:
        attempts: How many attempts were made.
        elapsed_s: Seconds from the first attempt to the last failure.
        cause: The last failure.
    """

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

    Args:
        policy: How long, and with which waits.
        attempt: One try of the request.
        classify: Returns the ``Transient`` of an exception worth trying again, None to
            raise it as it is; it may raise a final error of its own instead.
        what: The request, for the final error (``s3://b/k: bytes 0..9 from http://...``),
            or a function returning it (called only then).
        clock: Seconds, monotonic (injected by tests with ``sleep``).
        sleep: The wait between attempts.
        draw: The jitter, in ``[0, 1)``.

    Raises:
        RetriesExhaustedError: still failing at the deadline or after ``max_attempts``.
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
        out_of_time = now >= deadline or (
            transient.retry_after_s is not None and now + transient.retry_after_s > deadline
        )
        capped = policy.max_attempts is not None and attempts >= policy.max_attempts
        if out_of_time or capped:
            limit = f"retry_timeout_s={policy.retry_timeout_s:g}: raise it to wait longer"
            if capped and not out_of_time:
                limit = f"max_attempts={policy.max_attempts}"
            asked = ""
            if transient.retry_after_s is not None:
                asked = f"; the server asked to wait {transient.retry_after_s:g} s"
            request = what if isinstance(what, str) else what()
            plural = "s" * (attempts != 1)
            raise RetriesExhaustedError(
                f"{request}: gave up after {attempts} attempt{plural} over {now - started:.1f} s "
                f"(storage option {limit}){asked}; last cause: {transient.cause}",
                attempts=attempts,
                elapsed_s=now - started,
                cause=transient.cause,
            ) from None
        sleep(min(wait, deadline - now))


def retry_after_s(value: str | None, *, milliseconds: str | None = None) -> float | None:
    """Return the wait an answer asks for, in seconds; None when it asks none.

    Args:
        value: A ``Retry-After`` header: seconds, or an HTTP date.
        milliseconds: S3's ``x-amz-retry-after`` header (milliseconds); wins when set.

    Example:
        >>> retry_after_s("3"), retry_after_s(None, milliseconds="1500"), retry_after_s("soon")
        (3.0, 1.5, None)
    """
    if milliseconds and milliseconds.strip().isdigit():
        return int(milliseconds) / 1000
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())
