"""``S3Source``: one object in a bucket, read by ranged GETs (import it from ``core.s3``)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

from h5pack.core import s3http
from h5pack.core.ranged import RangedSource, per_process
from h5pack.core.retry import Transient, retry_after_s
from h5pack.core.s3options import LeanGet, S3Options, boto_modules, lean_get, make_client
from h5pack.core.secrets import scrub
from h5pack.core.store import split_url
from h5pack.errors import PackNotFoundError, RemoteError, UnsupportedRequestError

# BadDigest, XAmzContentSHA256Mismatch: a body arrived other than it was sent
_RETRIED_CODES = {"BadDigest", "XAmzContentSHA256Mismatch", "RequestTimeout"}
_RETRIED_CODES |= {"RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "500"}
_THROTTLING_CODES = {"SlowDown", "Throttling", "ThrottlingException", "ThrottledException"}
_THROTTLING_CODES |= {"RequestThrottled", "RequestLimitExceeded", "TooManyRequests", "503"}
_THROTTLING_CODES |= {"TooManyRequestsException", "ServerBusy", "rateLimitExceeded", "429"}
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}
_DENIED_CODES |= {"ExpiredToken", "403", "401"}


class UploadVanishedError(PackNotFoundError):
    """The server no longer has a multipart upload (NoSuchUpload): aborted, or dropped."""


class _Unsatisfiable(Exception):
    """HTTP 416: a suffix range longer than the object, which some servers refuse."""


class S3Source(RangedSource):
    """One object in an S3-compatible bucket, read by ranged GETs (NOTE [ The S3 client ]).

    Its ETag is its identity; its chunks' GETs go the lean way (NOTE [ The lean ranged
    GET ]), else through botocore's ``get_object`` (``ranged_gets="botocore"``, a proxy).
    """

    options: S3Options
    ENDPOINT_HINT = "AWS_ENDPOINT_URL or storage option endpoint"
    CREDENTIALS_HINT = (
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or storage options "
        "access_key_id / secret_access_key"
    )

    def __init__(self, url: str, options: S3Options, **identity: Any) -> None:
        super().__init__(url, options, **identity)
        _, self.bucket, self.key = split_url(url)
        self._lean: LeanGet | None = None
        self._lean_pid = -1

    def client(self) -> Any:
        """Return this process's botocore client (NOTE [ The S3 client ])."""
        return per_process(make_client, self.options)[0]

    def _lean_path(self) -> LeanGet | None:
        """Return this process's lean GET of this object, or None where botocore's is used."""
        if self._lean_pid != os.getpid():
            lean = None
            if self.options.ranged_gets == "lean":
                lean = lean_get(self.options, self.bucket, self.key)
            with self._lock:
                self._lean, self._lean_pid = lean, os.getpid()
        return self._lean

    def _stat(self) -> tuple[str, int]:
        answer = self.client().head_object(Bucket=self.bucket, Key=self.key)
        return str(answer.get("ETag", "")), int(answer["ContentLength"])

    def _get(self, header: str | None) -> tuple[memoryview, int, int, str]:
        """Return one botocore GET's body, its first byte, the object's size and ETag."""
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Key": self.key}
        if header:
            arguments["Range"] = header
        if self.tag:
            arguments["IfMatch"] = self.tag
        answer = self.client().get_object(**arguments)
        with contextlib.closing(answer["Body"]) as body:
            data = body.read()
        start, total = 0, len(data)  # the whole object, without a Content-Range
        if span := answer.get("ContentRange"):
            first, _, size = span.removeprefix("bytes ").partition("/")
            start, total = int(first.partition("-")[0]), int(size)
        return memoryview(data), start, total, str(answer.get("ETag", ""))

    def _fetch_into(self, view: memoryview, start: int) -> tuple[str, int]:
        lean = self._lean_path()
        if lean is None:
            return super()._fetch_into(view, start)
        answer = s3http.get_into(view, start, *lean, etag=self.tag)
        return answer.headers.get("ETag") or "", answer.total

    def _fetch(self, start: int, end: int) -> tuple[memoryview, str, int]:
        data, first, total, tag = self._get(f"bytes={start}-{end - 1}")
        if first != start:
            raise ValueError(f"asked for bytes from {start}, got bytes from {first}")
        return data, tag, total

    def read_tail(self, nbytes: int) -> tuple[memoryview, int]:
        """Return the last ``nbytes`` bytes and their offset: one GET, no size needed.

        A server that refuses a suffix longer than the object (416: rclone) is asked for
        the first ``nbytes`` instead, which it answers with the whole object.
        """

        def attempt(header: str) -> tuple[memoryview, int]:
            lean = self._lean_path()
            if lean is not None and header.startswith("bytes=-"):
                buffer = np.empty(nbytes, dtype=np.uint8)
                answer = s3http.get_into(buffer.data, None, *lean, etag=self.tag)
                self.learn(answer.headers.get("ETag") or "", answer.total)
                return buffer.data[: answer.nbytes], answer.first
            data, first, total, tag = self._get(header)
            self.learn(tag, total)
            return data, first

        try:
            return self.with_retries(
                f"its last {nbytes} bytes", lambda: attempt(f"bytes=-{nbytes}")
            )
        except _Unsatisfiable:
            first = f"bytes=0-{nbytes - 1}"
            return self.with_retries(f"its first {nbytes} bytes", lambda: attempt(first))

    def read_all(self) -> bytes:
        """Return the whole object (one GET): a manifest."""

        def attempt() -> bytes:
            data, _, total, tag = self._get(None)
            self.learn(tag, total)
            return bytes(data)

        return self.with_retries("the object", attempt)

    def cause(self, err: Exception, what: str) -> Transient | None:
        """Return why ``err`` is worth a retry, or raise the final error it means."""
        _, _, errors = boto_modules()
        if isinstance(err, errors.ClientError):
            return self._answer(err, what)
        if isinstance(err, ValueError):  # an answer holding other bytes than asked
            raise RemoteError(f"{self.url}: {what}: {err}") from None
        if isinstance(err, errors.NoCredentialsError | errors.PartialCredentialsError):
            raise RemoteError(
                f"{self.url}: no credentials ({scrub(str(err))}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or give the storage options "
                "access_key_id and secret_access_key"
            ) from None
        if isinstance(err, errors.BotoCoreError | OSError):
            return Transient(scrub(f"{type(err).__name__}: {err}"))
        return None

    def _answer(self, err: Any, what: str) -> Transient:
        """Return the cause of a retried error answer; raise the final ones."""
        info = err.response.get("Error", {})
        code = str(info.get("Code", ""))
        meta = err.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode", 0))
        if status == 412 or code == "PreconditionFailed":
            raise self.replaced() from None
        if code == "NoSuchBucket":
            raise self.missing(self.bucket, whole=True) from None
        if code == "NoSuchUpload":
            raise UploadVanishedError(
                f"{self.url}: {what}: the server no longer has the multipart upload (NoSuchUpload)"
            ) from None
        if code in ("NoSuchKey", "NotFound", "404") or status == 404:
            raise self.missing(self.bucket) from None
        if code in _DENIED_CODES or status in (401, 403):
            raise self.denied(code or status) from None
        if status == 416 and what.startswith("its last"):
            raise _Unsatisfiable() from None
        if status == 501 or code == "NotImplemented":
            raise UnsupportedRequestError(
                f"{self.url}: {what}: the server does not implement it (HTTP {status} {code})"
            ) from None
        throttled = code in _THROTTLING_CODES or status == 429
        if throttled or code in _RETRIED_CODES or status >= 500:
            headers = meta.get("HTTPHeaders", {})
            wait = retry_after_s(
                headers.get("retry-after"), milliseconds=headers.get("x-amz-retry-after")
            )
            return Transient(
                f"HTTP {status} {code}".strip(), throttled=throttled, retry_after_s=wait
            )
        raise RemoteError(
            f"{self.url}: {what}: the server answered HTTP {status} {code} "
            f"({scrub(str(info.get('Message', '')))})"
        ) from None

    def where(self) -> str:
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
