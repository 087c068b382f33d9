"""``S3Source``: one object in a bucket, read by ranged GETs with bounded retries.

Import it from ``core.s3`` (NOTE [ The S3 client ] is there).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from h5pack.core import s3http
from h5pack.core.retry import THROTTLING_CODES, Transient, retry_after_s, retrying
from h5pack.core.s3options import LeanGet, S3Options, boto_modules, lean_get, shared_client
from h5pack.core.secrets import scrub
from h5pack.core.source import ByteSource, SourceChangedError, SourceIdentity
from h5pack.core.store import split_url
from h5pack.errors import PackNotFoundError, RemoteError, UnsupportedRequestError

# BadDigest, XAmzContentSHA256Mismatch: a body arrived other than it was sent (retried)
_RETRIED_CODES = {"BadDigest", "XAmzContentSHA256Mismatch", "RequestTimeout"}
_RETRIED_CODES |= {"RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "500"}
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}
_DENIED_CODES |= {"ExpiredToken", "403", "401"}


class RetryableAnswer(Exception):
    """An answer that was wrong in a way worth trying again (a short body, a damaged upload)."""


class UploadVanishedError(PackNotFoundError):
    """The server no longer has a multipart upload (NoSuchUpload): aborted, or dropped."""


class _Unsatisfiable(Exception):
    """HTTP 416: a suffix range longer than the object, which some servers refuse."""


class S3Source(ByteSource):
    """One object in an S3-compatible bucket, read by ranged GETs (NOTE [ The S3 client ]).

    Args:
        url: ``s3://bucket/key``.
        options: How to reach the bucket.
        etag: The object's ETag when it was first opened (a dataset's workers get it
            pickled): reads of another object under the key are refused.
        size: The object's size when it was first opened.
        sleep: The wait between tries (injected by tests).
        clock: Seconds, monotonic: the retries' deadline (injected by tests with ``sleep``).
    """

    def __init__(
        self,
        url: str,
        options: S3Options,
        *,
        etag: str | None = None,
        size: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _, self.bucket, self.key = split_url(url)
        self.url = url
        self.options = options
        self.etag, self._size = etag, size
        self._sleep, self._clock = sleep, clock
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1  # of the request threads
        self._client_pid = -1
        self._lean: LeanGet | None = None
        self._lean_pid = -1
        self._lock = threading.Lock()
        self.requests = 0  # requests this process issued (tries included)

    @property
    def remote(self) -> bool:
        """True: every read is a request."""
        return True

    # -- the client, once per process ---------------------------------------------------
    def client(self) -> Any:
        """Return this process's botocore client (NOTE [ The S3 client ])."""
        if self._client is None or self._client_pid != os.getpid():
            with self._lock:
                if self._client is None or self._client_pid != os.getpid():
                    self._client = shared_client(self.options)
                    self._client_pid = os.getpid()
        return self._client

    def _lean_path(self) -> LeanGet | None:
        """Return this process's lean GET of this object, or None where botocore's is used."""
        if self._lean_pid != os.getpid():
            lean = None
            if self.options.ranged_gets == "lean":
                lean = lean_get(self.options, self.bucket, self.key)
            with self._lock:
                self._lean, self._lean_pid = lean, os.getpid()
        return self._lean

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._pool = ThreadPoolExecutor(
                    self.options.max_in_flight, thread_name_prefix="h5pack-s3"
                )
            return self._pool

    # -- what the object is ----------------------------------------------------------------
    def size(self) -> int:
        """Return the object's size (one HEAD request if no GET told it yet)."""
        if self._size is None:
            self._head()
        assert self._size is not None  # set by _head
        return self._size

    def identity(self) -> SourceIdentity:
        """Return the object's size and ETag."""
        size = self.size()
        assert self.etag is not None  # known with the size
        return SourceIdentity(size, self.etag)

    def _head(self) -> None:
        answer = self.with_retries(
            "its size (HEAD)",
            lambda: self.client().head_object(Bucket=self.bucket, Key=self.key),
        )
        self._learn(str(answer.get("ETag", "")), int(answer["ContentLength"]))

    def _learn(self, etag: str, size: int) -> None:
        """Record or check the object's ETag and size seen in an answer."""
        if self.etag is None:
            self.etag, self._size = etag, size
            return
        if (etag and etag != self.etag) or (self._size is not None and size != self._size):
            raise SourceChangedError(
                f"{self.url} was replaced since it was opened (ETag {self.etag}, "
                f"{self._size} bytes then; ETag {etag}, {size} bytes now); rebuild the "
                "loader (a dataset never mixes the labels of one object with the images "
                "of another)"
            )

    # -- reading ---------------------------------------------------------------------------
    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Return the bytes of each ``[start, end)`` range: one GET each, concurrently."""
        if len(ranges) <= 1 or self.options.max_in_flight == 1:
            return [self._get_range(start, end) for start, end in ranges]
        if self.etag is None:  # the first answer fixes the identity the others check
            first = self._get_range(*ranges[0])
            return [first, *self._executor().map(lambda r: self._get_range(*r), ranges[1:])]
        return list(self._executor().map(lambda r: self._get_range(*r), ranges))

    def read_tail(self, nbytes: int) -> tuple[memoryview, int]:
        """Return the last ``nbytes`` bytes and their offset: one GET, no size needed.

        S3 answers a suffix longer than the object with the whole object; servers that
        refuse it (416: rclone) are asked for the first ``nbytes`` instead, which they
        answer with the whole object too (a second request, for small objects only).
        """
        what = f"its last {nbytes} bytes"

        def attempt() -> tuple[memoryview, int]:
            lean = self._lean_path()
            if lean is None:
                return self._botocore_get(f"bytes=-{nbytes}", None, what)
            buffer = np.empty(nbytes, dtype=np.uint8)
            try:
                answer = s3http.get_into(
                    buffer.data, None, lean.target, lean.signer, lean.pool, etag=self.etag
                )
            except ValueError as err:
                raise RemoteError(f"{self.url}: {what}: {err}") from None
            self._learn(answer.etag, answer.total)
            return buffer.data[: answer.nbytes], answer.first

        try:
            found: tuple[memoryview, int] = self.with_retries(what, attempt)
            return found
        except _Unsatisfiable:
            return self._get(f"bytes=0-{nbytes - 1}", None, f"its first {nbytes} bytes")

    def _get_range(self, start: int, end: int) -> memoryview:
        if end <= start:
            return memoryview(b"")
        buffer = np.empty(end - start, dtype=np.uint8)
        self._get_into(buffer.data, start)
        return buffer.data

    def read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill the contiguous uint8 ``buffer`` with the bytes at ``offset`` (one GET)."""
        if buffer.nbytes:
            self._get_into(buffer.reshape(-1).view(np.uint8).data, offset)

    def _get_into(self, view: memoryview, start: int) -> None:
        """Fill ``view`` with the object's bytes from ``start``: one ranged GET (and retries)."""
        end = start + len(view)
        what = f"bytes {start}..{end - 1}"

        def attempt() -> None:
            lean = self._lean_path()
            if lean is None:
                data, _ = self._botocore_get(f"bytes={start}-{end - 1}", (start, end), what)
                view[:] = data
                return
            try:
                answer = s3http.get_into(
                    view, start, lean.target, lean.signer, lean.pool, etag=self.etag
                )
            except ValueError as err:
                raise RemoteError(f"{self.url}: {what}: {err}") from None
            self._learn(answer.etag, answer.total)

        self.with_retries(what, attempt)

    def _get(self, header: str, span: tuple[int, int] | None, what: str) -> tuple[memoryview, int]:
        """Return one GET's body and its first byte, through botocore, with the retries."""
        found: tuple[memoryview, int] = self.with_retries(
            what, lambda: self._botocore_get(header, span, what)
        )
        return found

    def _botocore_get(
        self, header: str, span: tuple[int, int] | None, what: str
    ) -> tuple[memoryview, int]:
        """One try of ``_get``."""
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Key": self.key, "Range": header}
        if self.etag:
            arguments["IfMatch"] = self.etag
        answer = self.client().get_object(**arguments)
        body = answer["Body"]
        try:
            data = body.read()
        finally:
            body.close()
        start, total = _content_range(answer.get("ContentRange"), len(data))
        self._learn(str(answer.get("ETag", "")), total)
        expected = (span[1] - span[0]) if span is not None else total - start
        if span is not None and start != span[0]:
            raise RemoteError(f"{self.url}: asked for {what}, got bytes from {start}")
        if len(data) != expected:
            raise RetryableAnswer(f"a body of {len(data)} bytes for {expected} (cut short)")
        return memoryview(data), start

    def with_retries(self, what: str, attempt: Callable[[], Any]) -> Any:
        """Return ``attempt()``, tried again under the options' ``RetryPolicy``.

        NOTE [ Retries by time ] (``core.retry``): resets, timeouts, 5xx, throttling and
        short bodies are tried again until ``retry_timeout_s``; the final errors (no such
        object, denied, replaced) at once.

        Raises:
            RetriesExhaustedError: still failing when the time ran out.
        """
        _, _, errors = boto_modules()

        def counted() -> Any:
            self.requests += 1
            return attempt()

        def classify(err: Exception) -> Transient | None:
            if isinstance(err, RetryableAnswer):
                return Transient(str(err))
            if isinstance(err, errors.ClientError):
                return self._client_error(err, what)
            if isinstance(err, (errors.NoCredentialsError, errors.PartialCredentialsError)):
                raise RemoteError(
                    f"{self.url}: no credentials ({scrub(str(err))}); set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or give the storage options "
                    "access_key_id and secret_access_key"
                ) from None
            if isinstance(err, (errors.BotoCoreError, OSError)) and not isinstance(
                err, RemoteError
            ):
                return Transient(scrub(f"{type(err).__name__}: {err}"))
            return None

        return retrying(
            self.options,
            counted,
            classify,
            what=lambda: f"{self.url}: {what} from {self._where()}",
            clock=self._clock,
            sleep=self._sleep,
        )

    def _client_error(self, err: Any, what: str) -> Transient:
        """Return the cause of a retried error answer; raise the final ones."""
        info = err.response.get("Error", {})
        code = str(info.get("Code", ""))
        status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if status == 412 or code == "PreconditionFailed":
            raise SourceChangedError(
                f"{self.url} was replaced since it was opened (its ETag is no longer "
                f"{self.etag}: If-Match failed); rebuild the loader"
            ) from None
        if code == "NoSuchBucket":
            raise PackNotFoundError(
                f"{self.url}: no bucket {self.bucket!r} at {self._where()}; check the "
                "bucket's name and the endpoint (AWS_ENDPOINT_URL or storage option endpoint)"
            ) from None
        if code == "NoSuchUpload":
            raise UploadVanishedError(
                f"{self.url}: {what}: the server no longer has the multipart upload (NoSuchUpload)"
            ) from None
        if code in ("NoSuchKey", "NotFound", "404") or status == 404:
            raise PackNotFoundError(
                f"{self.url}: no such object in bucket {self.bucket!r} at {self._where()}; "
                "check the key (a pack set: its prefix, ending in /)"
            ) from None
        if code in _DENIED_CODES or status in (401, 403):
            raise RemoteError(
                f"{self.url}: access denied ({code or status}) at {self._where()}; check "
                "the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                "or storage options access_key_id / secret_access_key) and the bucket's "
                "permissions"
            ) from None
        if status == 416 and what.startswith("its last"):
            raise _Unsatisfiable() from None
        if status == 501 or code == "NotImplemented":
            raise UnsupportedRequestError(
                f"{self.url}: {what}: the server does not implement it (HTTP {status} {code})"
            ) from None
        if code in _RETRIED_CODES or code in THROTTLING_CODES or status >= 500 or status == 429:
            headers = err.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            return Transient(
                f"HTTP {status} {code}".strip(),
                throttled=code in THROTTLING_CODES or status == 429,
                retry_after_s=retry_after_s(
                    headers.get("retry-after"), milliseconds=headers.get("x-amz-retry-after")
                ),
            )
        raise RemoteError(
            f"{self.url}: {what}: the server answered HTTP {status} {code} "
            f"({scrub(str(info.get('Message', '')))})"
        ) from None

    def _where(self) -> str:
        """Return the endpoint requests go to and where it was set."""
        endpoint = self.options.endpoint
        if not endpoint:
            profile = self.options.profile
            named = f"profile {profile!r}" if profile else "the default profile"
            endpoint = str(self.client().meta.endpoint_url)
            source = f"no AWS_ENDPOINT_URL or storage option endpoint: {named}'s, else AWS's"
        elif S3Options.from_environment().get("endpoint") == endpoint:
            source = "set by AWS_ENDPOINT_URL"
        else:
            source = "set by the storage option endpoint (--storage-option endpoint=...)"
        return f"{endpoint} ({source})"

    def read_all(self) -> bytes:
        """Return the whole object (one GET): a manifest."""

        def attempt() -> bytes:
            answer = self.client().get_object(Bucket=self.bucket, Key=self.key)
            body = answer["Body"]
            try:
                data: bytes = body.read()
            finally:
                body.close()
            if len(data) != int(answer.get("ContentLength", len(data))):
                raise RetryableAnswer("a body cut short")
            self._learn(str(answer.get("ETag", "")), len(data))
            return data

        found: bytes = self.with_retries("the object", attempt)
        return found

    def close(self) -> None:
        """Stop this process's request threads."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown()
        self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "options": self.options,
            "etag": self.etag,
            "size": self._size,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(
            self, state["url"], state["options"], etag=state["etag"], size=state["size"]
        )


def _content_range(header: str | None, length: int) -> tuple[int, int]:
    """Return ``(first byte, object size)`` of a ``Content-Range: bytes a-b/size`` header."""
    if not header:
        return 0, length  # the whole object
    span, _, total = header.removeprefix("bytes ").partition("/")
    first = span.partition("-")[0]
    return int(first), int(total)
