"""Packs in S3-compatible buckets: the client's settings and ``S3Source`` (ranged GETs).

NOTE [ The S3 client ]

The client is botocore (the ``s3`` extra; docs/decisions/0017-s3-client-lean-get.md says
why, and why not obstore: its runtime does not survive ``fork``). Clients are made once per
process and options (keyed on the pid), read what the AWS CLI reads (profiles, SSO, roles),
and leave retries to ``S3Source.with_retries``: timeouts, resets, 5xx and SlowDown with
bounded exponential backoff, then one ``RemoteError`` naming the URL, the bytes and the
cause. The chunks' ranged GETs go through ``core.s3http`` (NOTE [ The lean ranged GET ]).

Trust: every GET after the first carries ``If-Match`` with the ETag seen at open, and each
answer's ETag and total size are checked (servers that ignore If-Match are caught too); a
body shorter than its range is never returned. ``environment_options`` is the one place
that reads the environment (``AWS_*``); ``storage_options`` override it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from h5pack.core import s3http
from h5pack.core.source import ByteSource, SourceChangedError, SourceIdentity
from h5pack.core.store import ObjectInfo, Store, missing_extra, split_url
from h5pack.errors import (
    H5PackError,
    OptionsError,
    PackNotFoundError,
    RemoteError,
    TargetExistsError,
    UnsupportedRequestError,
)

# environment variable -> storage option (what the AWS CLI and boto3 read)
ENVIRONMENT = {
    "AWS_ENDPOINT_URL": "endpoint",
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_DEFAULT_REGION": "region",
    "AWS_REGION": "region",  # after AWS_DEFAULT_REGION: it wins, as in the AWS CLI
    "AWS_PROFILE": "profile",
}
# Other spellings accepted in storage_options (fsspec's and boto3's names).
ALIASES = {
    "endpoint_url": "endpoint",
    "key": "access_key_id",
    "aws_access_key_id": "access_key_id",
    "secret": "secret_access_key",
    "aws_secret_access_key": "secret_access_key",
    "token": "session_token",
    "aws_session_token": "session_token",
    "region_name": "region",
    "profile_name": "profile",
}


@dataclass(frozen=True, kw_only=True)
class S3Options:
    """How to reach a bucket; every field may come from ``storage_options`` or the environment.

    Attributes:
        endpoint: An S3-compatible server (``http://127.0.0.1:9000``); None: AWS.
        region: The bucket's region (None: the profile's, else us-east-1).
        access_key_id: Credentials (None: the profile's or the AWS default chain's).
        secret_access_key: Its secret.
        session_token: A temporary credential's token.
        profile: A profile of ``~/.aws/config`` / ``~/.aws/credentials``.
        connect_timeout_s: Seconds to connect before the attempt counts as failed.
        read_timeout_s: Seconds without a byte before the attempt counts as failed.
        attempts: Tries of one request (timeouts, resets, 5xx, 503 SlowDown, short bodies).
        backoff_s: The first wait between tries; doubled each time (with jitter).
        max_backoff_s: The longest wait between tries.
        max_in_flight: Requests one process issues at once (``read_ranges``).
        ranged_gets: ``"lean"``: the chunks' ranged GETs are signed and sent by h5pack and
            read straight into their buffers (NOTE [ The lean ranged GET ]); ``"botocore"``:
            through botocore's ``get_object``, as every other request (for comparison).

    Raises:
        OptionsError: a count or duration is out of range.
    """

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    profile: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    attempts: int = 5
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    max_in_flight: int = 16
    ranged_gets: Literal["lean", "botocore"] = "lean"
    # Where ``endpoint`` was set, for messages (resolve_options); not an option itself.
    endpoint_source: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.ranged_gets not in ("lean", "botocore"):
            raise OptionsError(
                "ranged_gets should be 'lean' or 'botocore', but got "
                f"ranged_gets={self.ranged_gets!r}"
            )
        if self.attempts < 1:
            raise OptionsError(f"attempts should be >= 1, but got attempts={self.attempts}")
        if self.max_in_flight < 1:
            raise OptionsError(
                f"max_in_flight should be >= 1, but got max_in_flight={self.max_in_flight}"
            )
        for name in ("connect_timeout_s", "read_timeout_s", "backoff_s", "max_backoff_s"):
            if getattr(self, name) < 0:
                raise OptionsError(f"{name} should be >= 0, but got {name}={getattr(self, name)}")

    @classmethod
    def of(cls, storage_options: Mapping[str, Any]) -> S3Options:
        """Return the options of a ``storage_options`` mapping (values may be strings).

        Raises:
            OptionsError: an unknown key, or a value of the wrong kind.
        """
        kinds = {f.name: f.type for f in fields(cls) if f.compare}
        values: dict[str, Any] = {}
        for key, value in storage_options.items():
            name = ALIASES.get(key, key)
            if name not in kinds:
                known = ", ".join(sorted(kinds))
                raise OptionsError(f"unknown storage option {key!r}; known: {known}")
            if value is None or value == "":
                continue
            kind = str(kinds[name])
            try:
                if kind.startswith("int"):
                    values[name] = int(value)
                elif kind.startswith("float"):
                    values[name] = float(value)
                else:
                    values[name] = str(value)
            except ValueError as err:
                raise OptionsError(f"storage option {key}={value!r}: {err}") from err
        return cls(**values)


def environment_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the storage options the environment sets (the one place it is read)."""
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for variable, name in ENVIRONMENT.items():
        value = environ.get(variable)
        if value:
            found[name] = value
    return found


def resolve_options(storage_options: Mapping[str, Any] | None) -> S3Options:
    """Return the environment's options overridden by ``storage_options``."""
    merged: dict[str, Any] = environment_options()
    source = "set by AWS_ENDPOINT_URL" if merged.get("endpoint") else ""
    for key, value in (storage_options or {}).items():
        merged[ALIASES.get(key, key)] = value
        if ALIASES.get(key, key) == "endpoint" and value:
            source = "set by the storage option endpoint (--storage-option endpoint=...)"
    options = S3Options.of(merged)
    if not options.endpoint:
        profile = f"profile {options.profile!r}" if options.profile else "the default profile"
        source = f"no AWS_ENDPOINT_URL or storage option endpoint: {profile}'s, else AWS's"
    return replace(options, endpoint_source=source)


_RETRIED_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
}
_DENIED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "403",
    "401",
}


class _Retry(Exception):
    """An attempt that failed in a way worth trying again."""


class _Unsatisfiable(Exception):
    """HTTP 416: a suffix range longer than the object, which some servers refuse."""


def _clients() -> Any:
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError as err:
        raise missing_extra("s3", err) from err
    return boto3, botocore.config, botocore.exceptions


class S3Source(ByteSource):
    """One object in an S3-compatible bucket, read by ranged GETs (NOTE [ The S3 client ]).

    Args:
        url: ``s3://bucket/key``.
        options: How to reach the bucket.
        etag: The object's ETag when it was first opened (a dataset's workers get it
            pickled): reads of another object under the key are refused.
        size: The object's size when it was first opened.
        sleep: The wait between tries (injected by tests).
    """

    def __init__(
        self,
        url: str,
        options: S3Options,
        *,
        etag: str | None = None,
        size: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        _, self.bucket, self.key = split_url(url)
        self.url = url
        self.options = options
        self.etag, self._size = etag, size
        self._sleep = sleep
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1  # of the request threads
        self._client_pid = -1
        self._lean: _Lean | None = None
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

    def _lean_path(self) -> _Lean | None:
        """Return this process's lean GET of this object, or None where botocore's is used."""
        if self._lean_pid != os.getpid():
            lean = None
            if self.options.ranged_gets == "lean":
                lean = _lean_get(self.options, self.bucket, self.key)
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
            raise _Retry(f"a body of {len(data)} bytes for {expected} (cut short)")
        return memoryview(data), start

    def with_retries(self, what: str, attempt: Callable[[], Any]) -> Any:
        """Return ``attempt()``, tried up to ``options.attempts`` times (NOTE [ The S3 client ])."""
        _, _, errors = _clients()
        last = ""
        for number in range(self.options.attempts):
            if number:
                wait = min(self.options.max_backoff_s, self.options.backoff_s * 2 ** (number - 1))
                self._sleep(wait * (0.5 + random.random() / 2))
            self.requests += 1
            try:
                return attempt()
            except _Retry as err:
                last = str(err)
            except errors.ClientError as err:
                last = self._client_error(err, what)
            except (errors.NoCredentialsError, errors.PartialCredentialsError) as err:
                raise RemoteError(
                    f"{self.url}: no credentials ({err}); set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or give the storage options "
                    "access_key_id and secret_access_key"
                ) from None
            except (errors.BotoCoreError, OSError) as err:
                if isinstance(err, RemoteError):
                    raise
                last = f"{type(err).__name__}: {err}"
        raise RemoteError(
            f"{self.url}: {what} could not be read after {self.options.attempts} attempts "
            f"from {self._where()}; last cause: {last}"
        )

    def _client_error(self, err: Any, what: str) -> str:
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
        if code in _RETRIED_CODES or status >= 500 or status == 429:
            return f"HTTP {status} {code}".strip()
        raise RemoteError(
            f"{self.url}: {what}: the server answered HTTP {status} {code} "
            f"({info.get('Message', '')})"
        ) from None

    def _where(self) -> str:
        """Return the endpoint requests go to and where it was set."""
        endpoint = self.options.endpoint or str(self.client().meta.endpoint_url)
        source = self.options.endpoint_source
        return f"{endpoint} ({source})" if source else endpoint

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
                raise _Retry("a body cut short")
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


# One client per process and options: creating one loads botocore's service model (~0.5 s),
# and a client is thread-safe. Keyed on the pid: a forked child makes its own.
_CLIENTS: dict[tuple[int, S3Options], tuple[Any, Any]] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(options: S3Options) -> Any:
    """Return this process's client for ``options`` (made once, see ``make_client``)."""
    return _shared(options)[0]


def shared_credentials(options: S3Options) -> Any:
    """Return the botocore credentials this process's client signs with (None: none found)."""
    return _shared(options)[1]


def _shared(options: S3Options) -> tuple[Any, Any]:
    key = (os.getpid(), options)
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            found = _CLIENTS[key] = make_client(options)
        return found


def make_client(options: S3Options) -> tuple[Any, Any]:
    """Return a botocore S3 client for ``options`` (no retries of its own) and its credentials.

    The credentials are the options' keys, else the session's chain (profiles, SSO,
    instance roles: possibly refreshable), the very object the client signs with.
    """
    boto3, config, errors = _clients()
    try:
        session = boto3.session.Session(profile_name=options.profile)
    except errors.ProfileNotFound as err:
        raise RemoteError(
            f"{err}: check AWS_PROFILE (or the storage option profile) against the profiles "
            "of ~/.aws/config and ~/.aws/credentials"
        ) from None
    settings = config.Config(
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.read_timeout_s,
        retries={"total_max_attempts": 1},
        max_pool_connections=max(10, options.max_in_flight),
        s3={"addressing_style": "path"} if options.endpoint else None,
        # A ranged GET has no whole-object checksum to check; rclone sends the one stored
        # with an upload's checksum anyway and botocore would refuse every range of it.
        response_checksum_validation="when_required",
    )
    client = session.client(
        "s3",
        endpoint_url=options.endpoint,
        region_name=options.region or session.region_name or "us-east-1",
        aws_access_key_id=options.access_key_id,
        aws_secret_access_key=options.secret_access_key,
        aws_session_token=options.session_token,
        config=settings,
    )
    if options.access_key_id and options.secret_access_key:
        from botocore.credentials import Credentials

        return client, Credentials(
            options.access_key_id, options.secret_access_key, options.session_token
        )
    return client, session.get_credentials()


@dataclass(frozen=True)
class _Lean:
    """One object's lean ranged GET in this process (NOTE [ The lean ranged GET ])."""

    target: s3http.Target
    signer: s3http.Signer
    pool: s3http.Connections


# Where each object's GETs go (scheme, host, path, region: data, the same in every process):
# kept across fork, so a forked DataLoader worker given explicit keys never builds a botocore
# client (~0.15 s of CPU per worker and epoch) to read its chunks.
_TARGETS: dict[tuple[S3Options, str, str], s3http.Target] = {}


def _lean_get(options: S3Options, bucket: str, key: str) -> _Lean | None:
    """Return the lean GET of ``bucket/key``, or None where a proxy would carry it.

    Raises:
        botocore.exceptions.NoCredentialsError: no credentials (``with_retries`` says so).
    """
    _, _, errors = _clients()
    target = _TARGETS.get((options, bucket, key))
    if target is None:
        target = _TARGETS[(options, bucket, key)] = s3http.target_of(
            shared_client(options), bucket, key
        )
    if s3http.uses_proxy(target):
        return None
    if options.access_key_id and options.secret_access_key:
        from botocore.credentials import Credentials

        credentials = Credentials(
            options.access_key_id, options.secret_access_key, options.session_token
        )
    else:
        credentials = shared_credentials(options)
    if credentials is None:
        raise errors.NoCredentialsError()

    def frozen() -> tuple[str, str, str | None]:
        now = credentials.get_frozen_credentials()  # refreshed by botocore when due
        return str(now.access_key), str(now.secret_key), now.token

    pool = s3http.connections(target, options.connect_timeout_s, options.read_timeout_s)
    return _Lean(target, s3http.Signer(frozen), pool)


def _content_range(header: str | None, length: int) -> tuple[int, int]:
    """Return ``(first byte, object size)`` of a ``Content-Range: bytes a-b/size`` header."""
    if not header:
        return 0, length  # the whole object
    span, _, total = header.removeprefix("bytes ").partition("/")
    first = span.partition("-")[0]
    return int(first), int(total)


# -- the store: the bucket's write side beside its sources ---------------------------------

logger = logging.getLogger("h5pack")
MIB = 2**20
# Bytes of one part of a multipart upload (each part is one PUT; a file of at most one part
# is one PUT). S3 allows 10,000 parts of 5 MiB to 5 GiB; 16 MiB parts reach 160 GB with few
# requests, ``UPLOAD_CONCURRENCY`` of them in memory at once (the tests use smaller parts).
PART_BYTES = 16 * MIB
MAX_PARTS = 10_000
UPLOAD_CONCURRENCY = 8


def part_bytes(size: int) -> int:
    """Return the part size of a multipart upload of ``size`` bytes (a whole number of MiB).

    Example:
        >>> part_bytes(10 * 2**20) // 2**20, part_bytes(400 * 2**30) // 2**20
        (16, 41)
    """
    needed = -(-size // MAX_PARTS)
    return PART_BYTES if needed <= PART_BYTES else -(-needed // MIB) * MIB


@dataclass(frozen=True)
class PendingUpload:
    """An incomplete multipart upload (what ``ListMultipartUploads`` returns).

    Attributes:
        url: The object it would complete into.
        upload_id: Its upload id.
    """

    url: str
    upload_id: str


class S3Store(Store):
    """Objects in S3-compatible buckets, reached with ``options`` (NOTE [ The S3 client ]).

    Every request goes through ``S3Source.with_retries`` (bounded backoff, one-line errors
    naming the URL). NOTE [ Publishing in a bucket ] (``write/upload.py``) says why an
    upload is the atomic publish of a pack.

    Args:
        options: How to reach the buckets.
        sleep: The wait between tries (injected by tests).
    """

    def __init__(self, options: S3Options, *, sleep: Callable[[float], None] = time.sleep):
        self.options = options
        self._sleep = sleep
        # whether the server may implement If-None-Match (NOTE [ Conditional final PUT ])
        self._conditional = True

    @classmethod
    def of(cls, storage_options: Mapping[str, Any]) -> S3Store:
        """Return the store of the environment's settings overridden by ``storage_options``."""
        return cls(resolve_options(storage_options))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Store) and other.options == self.options

    def __hash__(self) -> int:
        return hash(self.options)

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["options"])

    def source(self, path: str) -> S3Source:
        """Return the object at the URL ``path``; its first answer fixes its size and ETag."""
        return S3Source(path, self.options, sleep=self._sleep)

    def _call(self, url: str, what: str, name: str, **arguments: Any) -> Any:
        """Return the client's ``name(Bucket=..., Key=..., **arguments)``, with the retries.

        Raises:
            PackNotFoundError: no such object (or bucket).
            RemoteError: denied, or failed after the retries (naming the URL and the cause).
        """
        source = self.source(url)
        _, bucket, key = split_url(url)
        call = getattr(source.client(), name)
        return source.with_retries(what, lambda: call(Bucket=bucket, Key=key, **arguments))

    def stat(self, path: str) -> ObjectInfo | None:
        """Return the object at ``path`` (one HEAD), or None when there is none."""
        try:
            answer = self._call(path, "its size (HEAD)", "head_object")
        except PackNotFoundError as err:
            if "no bucket" in str(err):
                raise
            return None
        return ObjectInfo(path, int(answer["ContentLength"]), str(answer["ETag"]))

    def put(self, path: str, data: bytes) -> None:
        """Write the small object ``path`` (one PUT: it appears whole or not at all)."""
        self._call(path, "the upload (PUT)", "put_object", Body=data)

    def delete(self, path: str) -> None:
        """Delete ``path`` (no error when it is gone)."""
        with contextlib.suppress(PackNotFoundError):
            self._call(path, "its removal (DELETE)", "delete_object")

    def _put_final(
        self, url: str, what: str, name: str, *, if_absent: bool, **arguments: Any
    ) -> Any:
        """Return the request that makes ``url`` appear, conditional when ``if_absent``.

        NOTE [ Conditional final PUT ]: with ``if_absent``, the PUT (or the multipart
        upload's completion) carries ``If-None-Match: *``, so a server that implements it
        (AWS S3, MinIO...) refuses atomically to replace an object that appeared under the
        key since the HEAD that checked it. A server that answers 501 NotImplemented is
        asked again without the header (and not asked with it again); one that ignores the
        header (rclone serve s3) cannot be told apart: the HEAD just before is the guard.

        Raises:
            TargetExistsError: the server refused: an object exists under ``url``.
        """
        if if_absent and self._conditional:
            try:
                return self._call(url, what, name, IfNoneMatch="*", **arguments)
            except SourceChangedError:  # 412 Precondition Failed: the key is taken
                raise TargetExistsError(
                    f"{url} appeared during the conversion; not replaced"
                ) from None
            except UnsupportedRequestError:
                self._conditional = False
        return self._call(url, what, name, **arguments)

    def publish(
        self, local: Path, path: str, *, if_absent: bool, part_size: int | None = None
    ) -> ObjectInfo:
        """Upload the finished file ``local`` under ``path`` (NOTE [ Publishing in a bucket ]).

        A file of at most one part is one PUT; a larger one a multipart upload of
        ``part_bytes(size)`` parts, ``UPLOAD_CONCURRENCY`` in flight, each retried; any
        error (Ctrl-C and SIGTERM too) aborts it before it is raised again.

        Raises:
            TargetExistsError: ``if_absent`` and the server refused: an object exists.
            RemoteError: the upload failed; nothing is left under ``path``.
        """
        size = local.stat().st_size
        part = part_size or part_bytes(size)
        if size <= part:
            what = f"the upload of {size} bytes (PUT)"
            answer = self._put_final(
                path, what, "put_object", if_absent=if_absent, Body=local.read_bytes()
            )
            return ObjectInfo(path, size, str(answer.get("ETag", "")))
        created = self._call(path, "the start of a multipart upload", "create_multipart_upload")
        upload = PendingUpload(path, str(created["UploadId"]))
        count = -(-size // part)
        pool = ThreadPoolExecutor(UPLOAD_CONCURRENCY, thread_name_prefix="h5pack-upload")
        try:
            with open(local, "rb", buffering=0) as file:

                def send(number: int) -> dict[str, Any]:
                    start = (number - 1) * part
                    data = os.pread(file.fileno(), min(part, size - start), start)
                    what = f"part {number} of {count} (bytes {start}..{start + len(data) - 1})"
                    answer = self._call(
                        path,
                        what,
                        "upload_part",
                        UploadId=upload.upload_id,
                        PartNumber=number,
                        Body=data,
                    )
                    return {"ETag": answer["ETag"], "PartNumber": number}

                parts = list(pool.map(send, range(1, count + 1)))
            answer = self._put_final(
                path,
                "the completion of the multipart upload",
                "complete_multipart_upload",
                if_absent=if_absent,
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            self.abort(upload)
            raise
        pool.shutdown()
        return ObjectInfo(path, size, str(answer.get("ETag", "")))

    def pending(self, prefix_url: str) -> list[PendingUpload]:
        """Return the incomplete multipart uploads whose URL starts with ``prefix_url``.

        Raises:
            RemoteError: the listing failed.
        """
        scheme, bucket, prefix = split_url(prefix_url)
        source = self.source(prefix_url)
        found: list[PendingUpload] = []
        markers: dict[str, str] = {}
        while True:
            try:
                page = source.with_retries(
                    f"the incomplete uploads under {prefix!r}",
                    lambda: source.client().list_multipart_uploads(
                        Bucket=bucket,
                        Prefix=prefix,
                        **markers,  # noqa: B023  (called at once)
                    ),
                )
            except PackNotFoundError as err:
                # rclone serve s3 answers 404 NoSuchUpload for a bucket that never had an
                # upload (S3 answers an empty list): none
                if "no bucket" in str(err):
                    raise
                return found
            found += [
                PendingUpload(f"{scheme}://{bucket}/{item['Key']}", str(item["UploadId"]))
                for item in page.get("Uploads", [])
            ]
            if not page.get("IsTruncated"):
                return found
            markers = {
                "KeyMarker": str(page.get("NextKeyMarker", "")),
                "UploadIdMarker": str(page.get("NextUploadIdMarker", "")),
            }

    def abort(self, upload: PendingUpload) -> None:
        """Abort ``upload`` (its parts are deleted). Never raises: a failure is logged."""
        try:
            what = "the abort of an incomplete upload"
            self._call(upload.url, what, "abort_multipart_upload", UploadId=upload.upload_id)
        except PackNotFoundError:
            return  # aborted or completed meanwhile
        except H5PackError as err:
            logger.warning(
                "could not abort the upload %s of %s: %s", upload.upload_id, upload.url, err
            )

    def sweep(self, paths: Sequence[str]) -> list[str]:
        """Abort the incomplete multipart uploads under ``paths``; return their URLs.

        NOTE [ Publishing in a bucket ]. A sweep that fails is logged (the parts stay until
        a later run, or the bucket's lifecycle rule, removes them).

        Raises:
            PackNotFoundError: the bucket does not exist.
        """
        if not paths:
            return []
        wanted = set(paths)
        # a prefix of the keys' text, as S3 compares keys (not of path components)
        prefix = os.path.commonprefix(sorted(wanted))  # noqa: RUF071
        try:
            pending = [u for u in self.pending(prefix) if u.url in wanted]
        except PackNotFoundError:
            raise  # no such bucket: said before anything is converted
        except H5PackError as err:
            logger.warning("could not list the incomplete uploads under %s: %s", prefix, err)
            return []
        for upload in pending:
            self.abort(upload)
        return [u.url for u in pending]
