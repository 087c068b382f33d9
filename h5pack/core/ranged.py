"""What every remote store's source shares: ``RangedSource``, and clients made once per process.

NOTE [ Ranged sources ]

A remote object (``core.s3``, ``core.gcs``, ``core.azure``, ``core.http``) is read by ranged
GETs, each into its caller's buffer, several in flight on this process's threads. Its size
and identity (an ETag, a generation) come from the first answer or one metadata request;
every later answer is checked against them (``learn``) and carries them as a condition
(``If-Match``), so a replaced object is refused, never mixed. Every request goes through
``with_retries`` (NOTE [ Retries by time ]): ``cause`` turns a client's exception into the
final error (not found, denied, replaced) or a ``Transient`` (5xx, throttling, resets).
Clients and threads are made once per process (keyed on the pid: a forked DataLoader worker
makes its own, never uses its parent's).
"""

from __future__ import annotations

import os
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from h5pack.core.retry import RetryPolicy, Transient, retry_after_s, retrying
from h5pack.core.source import ByteSource, SourceChangedError, SourceIdentity
from h5pack.errors import H5PackError, OptionsError, PackNotFoundError, RemoteError

T = TypeVar("T")

_MADE: dict[tuple[int, Hashable, Hashable], Any] = {}
_MADE_LOCK = threading.Lock()


def per_process(make: Callable[[Any], T], options: Hashable) -> T:
    """Return this process's ``make(options)`` (a client), made once."""
    key = (os.getpid(), make, options)
    with _MADE_LOCK:
        if key not in _MADE:
            _MADE[key] = make(options)
        found: T = _MADE[key]
        return found


@dataclass(frozen=True, kw_only=True)
class RemoteOptions(RetryPolicy):
    """What every remote store's options hold besides the retries.

    Attributes:
        connect_timeout_s: Seconds to connect.
        read_timeout_s: Seconds without a byte.
        max_in_flight: Requests one process issues at once.
    """

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    max_in_flight: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_in_flight < 1:
            raise OptionsError(
                f"max_in_flight should be >= 1, but got max_in_flight={self.max_in_flight}"
            )


class Retry(Exception):
    """An answer wrong in a way worth trying again (a short body, a damaged upload)."""


def throttled_or_not(cause: str, status: int, headers: Any) -> Transient:
    """Return the ``Transient`` of an answer of ``status`` (429, 503: throttled)."""
    wait = retry_after_s(headers.get("Retry-After") if headers is not None else None)
    return Transient(cause, throttled=status in (429, 503), retry_after_s=wait)


class RangedSource(ByteSource):
    """One remote object read by ranged requests (NOTE [ Ranged sources ]).

    ``tag`` and ``size``: what it was when first opened (a worker gets them pickled); None:
    learned from the first answer. ``sleep`` and ``clock``: the retries', injected by tests.
    """

    # the settings that name the endpoint, and those that give credentials (for messages)
    ENDPOINT_HINT: ClassVar[str] = ""
    CREDENTIALS_HINT: ClassVar[str] = ""

    def __init__(
        self,
        url: str,
        options: RemoteOptions,
        *,
        tag: str | None = None,
        size: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url, self.options = url, options
        self.tag, self._size = tag, size
        self._sleep, self._clock = sleep, clock
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self.requests = 0  # requests this process issued (tries included)

    @property
    def remote(self) -> bool:
        """True: every read is a request."""
        return True

    @abstractmethod
    def _stat(self) -> tuple[str, int]:
        """Return the object's identity and size (one metadata request)."""

    def _fetch(self, start: int, end: int) -> tuple[bytes | memoryview, str, int]:
        """Return the bytes ``[start, end)``, the answer's identity and the object's size."""
        raise NotImplementedError

    def _fetch_into(self, view: memoryview, start: int) -> tuple[str, int]:
        """Fill ``view`` from ``start``; return the answer's identity and size ("", -1: unsaid)."""
        data, tag, total = self._fetch(start, start + len(view))
        if len(data) != len(view):
            raise Retry(f"a body of {len(data)} bytes for {len(view)} (cut short)")
        view[:] = memoryview(data).cast("B")
        return tag, total

    @abstractmethod
    def cause(self, err: Exception, what: str) -> Transient | None:
        """Return why ``err`` is worth a retry, raise the final error it means, or None."""

    @abstractmethod
    def where(self) -> str:
        """Return the endpoint requests go to (for messages)."""

    def size(self) -> int:
        """Return the object's size (one metadata request if no answer told it yet)."""
        if self._size is None:
            self.learn(*self.with_retries("its size", self._stat))
        assert self._size is not None  # set by learn
        return self._size

    def identity(self) -> SourceIdentity:
        """Return the object's size and ETag or generation."""
        if self.tag is None or self._size is None:
            self.learn(*self.with_retries("its size", self._stat))
        return SourceIdentity(self.size(), self.tag or "")

    def learn(self, tag: str, size: int) -> None:
        """Record or check the identity and size an answer told."""
        if (tag and self.tag and tag != self.tag) or (
            size >= 0 and self._size is not None and size != self._size
        ):
            raise SourceChangedError(
                f"{self.url} was replaced since it was opened ({self.tag}, {self._size} bytes "
                f"then; {tag}, {size} bytes now); rebuild the loader (a dataset never mixes "
                "the labels of one object with the images of another)"
            )
        self.tag = self.tag or tag or None
        if self._size is None and size >= 0:
            self._size = size

    def missing(self, bucket: str, *, whole: bool = False) -> PackNotFoundError:
        """Return the error of a missing object (``whole``: its bucket is missing)."""
        if whole:
            return PackNotFoundError(
                f"{self.url}: no bucket {bucket!r} at {self.where()}; check its name and "
                f"the endpoint ({self.ENDPOINT_HINT})"
            )
        return PackNotFoundError(
            f"{self.url}: no such object in bucket {bucket!r} at {self.where()}; check the "
            "key (a pack set: its prefix, ending in /)"
        )

    def denied(self, why: object) -> RemoteError:
        """Return the error of refused credentials."""
        return RemoteError(
            f"{self.url}: access denied ({why}) at {self.where()}; check the credentials "
            f"({self.CREDENTIALS_HINT}) and the bucket's permissions"
        )

    def replaced(self) -> SourceChangedError:
        """Return the error of a refused conditional read (HTTP 412)."""
        return SourceChangedError(
            f"{self.url} was replaced since it was opened (it is no longer {self.tag}); "
            "rebuild the loader"
        )

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._pool = ThreadPoolExecutor(
                    self.options.max_in_flight, thread_name_prefix="h5pack-get"
                )
            return self._pool

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Return the bytes of each ``[start, end)`` range: one GET each, concurrently."""

        def one(span: tuple[int, int]) -> memoryview:
            buffer = np.empty(span[1] - span[0], dtype=np.uint8)
            self._get_into(buffer.data, span[0])
            return buffer.data

        if len(ranges) <= 1 or self.options.max_in_flight == 1:
            return [one(span) for span in ranges]
        first = [one(ranges[0])] if self.tag is None else []  # it fixes the identity
        return first + list(self._executor().map(one, ranges[len(first) :]))

    def read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill the contiguous uint8 ``buffer`` with the bytes at ``offset`` (one GET)."""
        self._get_into(buffer.reshape(-1).view(np.uint8).data, offset)

    def _get_into(self, view: memoryview, start: int) -> None:
        if not len(view):
            return

        def attempt() -> None:
            self.learn(*self._fetch_into(view, start))

        self.with_retries(f"bytes {start}..{start + len(view) - 1}", attempt)

    def with_retries(self, what: str, attempt: Callable[[], T]) -> T:
        """Return ``attempt()``, tried again by time (NOTE [ Retries by time ])."""

        def counted() -> T:
            self.requests += 1
            return attempt()

        def classify(err: Exception) -> Transient | None:
            if isinstance(err, Retry):
                return Transient(str(err))
            return None if isinstance(err, H5PackError) else self.cause(err, what)

        return retrying(
            self.options,
            counted,
            classify,
            what=lambda: f"{self.url}: {what} from {self.where()}",
            clock=self._clock,
            sleep=self._sleep,
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options, "tag": self.tag, "size": self._size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(
            self, state["url"], state["options"], tag=state["tag"], size=state["size"]
        )

    def close(self) -> None:
        """Stop this process's request threads."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown()
        self._pool = None
