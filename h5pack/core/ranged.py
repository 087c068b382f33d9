"""What the GCS, Azure and HTTP stores share: ``RangedSource``.

NOTE [ Ranged sources ]

A remote object read by ranged GETs (``core.gcs``, ``core.azure``, ``core.http``): its size
and identity (a generation, an ETag) come from the first answer or one metadata request,
and every later answer is checked against them (``learn``); each read is one request,
several in flight at once on this process's threads; a client is made once per process
(keyed on the pid: a forked DataLoader worker makes its own, never uses its parent's).
Every request goes through ``with_retries`` (``core.retry``: NOTE [ Retries by time ]):
``cause`` turns a client's exception into the final error (not found, denied, replaced)
or a ``Transient`` (5xx, 429 and 503 throttling with their Retry-After, resets).
"""

from __future__ import annotations

import os
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import numpy as np

from h5pack.core.retry import RetryPolicy, Transient, retry_after_s, retrying
from h5pack.core.source import ByteSource, SourceChangedError, SourceIdentity
from h5pack.errors import H5PackError

T = TypeVar("T")


class Retry(Exception):
    """An attempt that failed in a way worth trying again (its cause)."""


def throttled_or_not(cause: str, status: int, headers: Any) -> Transient:
    """Return the ``Transient`` of an answer of ``status`` (429, 503: throttled)."""
    wait = retry_after_s(headers.get("Retry-After") if headers is not None else None)
    return Transient(cause, throttled=status in (429, 503), retry_after_s=wait)


class RangedSource(ByteSource):
    """One remote object read by ranged requests (NOTE [ Ranged sources ]).

    Args:
        url: The object's URL.
        policy: How its requests are retried (the store's options).
        max_in_flight: Requests issued at once by ``read_ranges``.
        tag: Its identity (generation, ETag) when it was first opened; None: learned.
        size: Its size when it was first opened.
    """

    def __init__(
        self,
        url: str,
        policy: RetryPolicy,
        max_in_flight: int,
        *,
        tag: str | None = None,
        size: int | None = None,
    ) -> None:
        self.url = url
        self.policy, self.max_in_flight = policy, max_in_flight
        self.tag, self._size = tag, size
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self.requests = 0  # requests this process issued (tries included)

    @property
    def remote(self) -> bool:
        """True: every read is a request."""
        return True

    # -- what a store's source says ---------------------------------------------------------
    @abstractmethod
    def _stat(self) -> tuple[str, int]:
        """Return the object's identity and size (one metadata request)."""

    @abstractmethod
    def _fetch(self, start: int, end: int) -> tuple[bytes | memoryview, str, int]:
        """Return the bytes ``[start, end)`` with the answer's identity and object size.

        An empty identity or a size of -1: the answer did not say (not checked).
        """

    @abstractmethod
    def cause(self, err: Exception, what: str) -> Transient:
        """Return why ``err`` is worth a retry, or raise the final error it means."""

    @abstractmethod
    def where(self) -> str:
        """Return the endpoint requests go to (for messages)."""

    # -- identity ---------------------------------------------------------------------------
    def size(self) -> int:
        """Return the object's size (one metadata request if no answer told it yet)."""
        if self._size is None:
            self.learn(*self.with_retries("its size", self._stat))
        assert self._size is not None  # set by learn
        return self._size

    def identity(self) -> SourceIdentity:
        """Return the object's size and generation or ETag."""
        size = self.size()
        return SourceIdentity(size, self.tag or "")

    def learn(self, tag: str, size: int) -> None:
        """Record or check the identity and size seen in an answer."""
        if self.tag is None:
            self.tag, self._size = tag, size
            return
        if (tag and tag != self.tag) or (
            size >= 0 and self._size is not None and size != self._size
        ):
            raise SourceChangedError(
                f"{self.url} was replaced since it was opened ({self.tag}, {self._size} bytes "
                f"then; {tag}, {size} bytes now); rebuild the loader (a dataset never mixes "
                "the labels of one object with the images of another)"
            )

    def replaced(self) -> SourceChangedError:
        """Return the error of a refused conditional read (HTTP 412)."""
        return SourceChangedError(
            f"{self.url} was replaced since it was opened (it is no longer {self.tag}); "
            "rebuild the loader"
        )

    # -- reading ----------------------------------------------------------------------------
    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="h5pack-get")
            return self._pool

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Return the bytes of each ``[start, end)`` range: one request each, concurrently."""
        if self.tag is None and ranges:
            self.size()  # the identity the answers are checked against
        if len(ranges) <= 1 or self.max_in_flight == 1:
            return [self._range(start, end) for start, end in ranges]
        return list(self._executor().map(lambda r: self._range(*r), ranges))

    def _range(self, start: int, end: int) -> memoryview:
        if end <= start:
            return memoryview(b"")
        what = f"bytes {start}..{end - 1}"

        def attempt() -> memoryview:
            data, tag, total = self._fetch(start, end)
            self.learn(tag, total)
            if len(data) != end - start:
                raise Retry(f"a body of {len(data)} bytes for {end - start} (cut short)")
            return memoryview(data).cast("B")

        found: memoryview = self.with_retries(what, attempt)
        return found

    def read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill the contiguous uint8 ``buffer`` with the bytes at ``offset`` (one request)."""
        if buffer.nbytes:
            data = self._range(offset, offset + buffer.nbytes)
            buffer.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)

    def with_retries(self, what: str, attempt: Callable[[], T]) -> T:
        """Return ``attempt()``, tried again by time (NOTE [ Retries by time ])."""

        def counted() -> T:
            self.requests += 1
            return attempt()

        def classify(err: Exception) -> Transient | None:
            if isinstance(err, H5PackError):
                return None
            if isinstance(err, Retry):
                return Transient(str(err))
            return self.cause(err, what)

        return retrying(
            self.policy, counted, classify, what=lambda: f"{self.url}: {what} from {self.where()}"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.policy, "tag": self.tag, "size": self._size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # every store's source is made as ``(url, options, tag=, size=)``
        init = cast("Callable[..., None]", type(self).__init__)
        init(self, state["url"], state["options"], tag=state["tag"], size=state["size"])

    def close(self) -> None:
        """Stop this process's request threads."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown()
        self._pool = None
