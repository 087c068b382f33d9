"""The hot path's ranged GET: signed here (SigV4), sent with ``http.client``, read in place.

NOTE [ The lean ranged GET ]

botocore's ``get_object`` spends most of a chunk's GET in its own machinery, so the
chunks' ranged GETs are issued here (docs/decisions/0017-s3-client-lean-get.md):

- botocore still gives the credentials (refreshable ones are frozen at every request), the
  object's URL and signing region (``target_of``), and makes every other request;
- ``Signer``: SigV4 in headers, the day's signing key kept per (secret, day, region);
- ``Connections``: ``http.client`` connections per process (keyed on the pid), TCP_NODELAY,
  the options' timeouts, a dropped keep-alive connection skipped; HTTPS verified against
  botocore's CA bundle; an endpoint behind an ``HTTP(S)_PROXY`` keeps botocore's path;
- ``get_into``: the body read straight into the caller's buffer, its length, Content-Range,
  ETag and size checked. Error answers become botocore's ``ClientError`` (one mapping in
  ``S3Source``); resets, timeouts and short bodies are ``OSError`` (retried by the caller).
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import hmac
import http.client
import os
import re
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from h5pack.core.source import readable

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UTC = datetime.timezone.utc  # not datetime.UTC: Python 3.11+, and 3.10 is supported
_ERROR_BYTES = 1 << 16  # the most of an error answer's body read (its XML code)


class ShortBody(OSError):
    """The connection ended before the whole body arrived (retried)."""


@dataclass(frozen=True)
class Target:
    """Where one object's GETs go, as botocore would send them.

    Attributes:
        scheme: ``http`` or ``https``.
        netloc: ``host[:port]``, also the signed Host header.
        path: The URL-encoded path (with the bucket in path style).
        region: The region the signature is scoped to.
    """

    scheme: str
    netloc: str
    path: str
    region: str


def target_of(client: Any, bucket: str, key: str) -> Target:
    """Return where ``client`` sends the GETs of ``bucket/key`` (one presigned URL, no request).

    Raises:
        botocore.exceptions.NoCredentialsError: no credentials to sign with.
    """
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60
    )
    parts = urlsplit(url)
    scope = parse_qs(parts.query).get("X-Amz-Credential", [""])[0].split("/")
    region = scope[2] if len(scope) == 5 else str(client.meta.region_name)
    return Target(parts.scheme, parts.netloc, parts.path or "/", region)


def uses_proxy(target: Target) -> bool:
    """Return whether botocore would reach ``target`` through a proxy of the environment."""
    from botocore.utils import get_environ_proxies

    return bool(get_environ_proxies(f"{target.scheme}://{target.netloc}{target.path}"))


class Signer:
    """AWS Signature Version 4 of bodiless S3 requests, in headers.

    Args:
        credentials: Returns ``(access_key, secret_key, token)`` now (botocore's
            ``get_frozen_credentials``, which refreshes temporary credentials).
        clock: The time of a signature (injected by tests).
    """

    def __init__(
        self,
        credentials: Callable[[], tuple[str, str, str | None]],
        *,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(UTC),
    ) -> None:
        self.credentials = credentials
        self.clock = clock
        self._keys: dict[tuple[str, str, str], bytes] = {}

    def _key(self, secret: str, day: str, region: str) -> bytes:
        found = self._keys.get((secret, day, region))
        if found is None:
            found = hmac.new(f"AWS4{secret}".encode(), day.encode(), hashlib.sha256).digest()
            for part in (region, "s3", "aws4_request"):
                found = hmac.new(found, part.encode(), hashlib.sha256).digest()
            self._keys = {(secret, day, region): found}  # yesterday's key is of no more use
        return found

    def headers(self, method: str, target: Target, extra: dict[str, str]) -> dict[str, str]:
        """Return the headers of a signed request: ``extra`` (lower-case names) and auth."""
        access_key, secret_key, token = self.credentials()
        stamp = self.clock().strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        signed = {
            **extra,
            "host": target.netloc,
            "x-amz-content-sha256": EMPTY_SHA256,
            "x-amz-date": stamp,
        }
        if token:
            signed["x-amz-security-token"] = token
        names = sorted(signed)
        canonical = "\n".join(
            [
                method,
                target.path,
                "",
                "".join(f"{name}:{signed[name].strip()}\n" for name in names),
                ";".join(names),
                EMPTY_SHA256,
            ]
        )
        scope = f"{day}/{target.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = self._key(secret_key, day, target.region)
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        signed["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        del signed["host"]  # http.client sends it
        return signed


class Connections:
    """Idle keep-alive connections to one endpoint, for the threads of one process.

    Args:
        scheme: ``http`` or ``https``.
        netloc: ``host[:port]``.
        connect_timeout_s: Seconds to connect.
        read_timeout_s: Seconds without a byte once connected.
        keep: The most idle connections kept.
    """

    def __init__(
        self,
        scheme: str,
        netloc: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keep: int = 16,
    ) -> None:
        self.scheme, self.netloc = scheme, netloc
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.keep = keep
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None

    def take(self) -> http.client.HTTPConnection:
        """Return an idle connection still open, or a new one (connected).

        An idle connection the server has closed meanwhile (servers drop keep-alive
        connections after a while: between epochs, say) reads as readable (its EOF): it is
        closed and skipped, as urllib3 does, rather than failing a request and costing a try.
        """
        while True:
            with self._lock:
                if not self._idle:
                    break
                idle = self._idle.pop()
            if idle.sock is not None and not _dropped(idle.sock):
                return idle
            idle.close()
        connection: http.client.HTTPConnection
        if self.scheme == "https":
            if self._context is None:
                from botocore.httpsession import get_cert_path

                self._context = ssl.create_default_context(cafile=get_cert_path(True))
            connection = http.client.HTTPSConnection(
                self.netloc, timeout=self.connect_timeout_s, context=self._context
            )
        else:
            connection = http.client.HTTPConnection(self.netloc, timeout=self.connect_timeout_s)
        connection.connect()
        assert connection.sock is not None  # connected just now
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.sock.settimeout(self.read_timeout_s)
        return connection

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def give(self, connection: http.client.HTTPConnection) -> None:
        """Keep ``connection`` for the next request (its answer read to the end)."""
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(connection)
                return
        connection.close()


def _dropped(sock: socket.socket) -> bool:
    """Return whether an idle connection's socket has something to read (EOF: closed)."""
    try:
        return readable(sock)
    except (OSError, ValueError):  # closed meanwhile
        return True


# One pool per (process, endpoint, timeouts): a forked child makes its own and never uses
# (nor closes) the sockets it inherited, which its parent may still be using.
_POOLS: dict[tuple[int, str, str, float, float], Connections] = {}
_POOLS_LOCK = threading.Lock()


@atexit.register
def _close_pools() -> None:
    """Close this process's idle connections at exit (never a parent's, inherited)."""
    with _POOLS_LOCK:
        mine = [pool for key, pool in _POOLS.items() if key[0] == os.getpid()]
    for pool in mine:
        pool.close()


def connections(target: Target, connect_timeout_s: float, read_timeout_s: float) -> Connections:
    """Return this process's connections to ``target``'s endpoint."""
    key = (os.getpid(), target.scheme, target.netloc, connect_timeout_s, read_timeout_s)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = Connections(
                target.scheme,
                target.netloc,
                connect_timeout_s=connect_timeout_s,
                read_timeout_s=read_timeout_s,
            )
        return pool


@dataclass(frozen=True)
class Answer:
    """What a ranged GET said besides its body.

    Attributes:
        etag: The object's ETag.
        first: The first byte of the body in the object.
        total: The object's size.
        nbytes: The body's bytes (those written into the buffer).
    """

    etag: str
    first: int
    total: int
    nbytes: int


def get_into(
    buffer: memoryview,
    start: int | None,
    target: Target,
    signer: Signer,
    pool: Connections,
    *,
    etag: str | None,
) -> Answer:
    """Fill ``buffer`` with the object's bytes from ``start``: one signed ranged GET.

    Args:
        buffer: Where the body goes (``len(buffer)`` bytes asked for).
        start: The first byte; None: the object's last ``len(buffer)`` bytes (a suffix
            range: all of a smaller object, at the front of ``buffer``).
        target: Where the GET goes.
        signer: Its signature.
        pool: Its connection.
        etag: Sent as ``If-Match`` (None: the first request, which learns it).

    Raises:
        botocore.exceptions.ClientError: an error answer (its code and status).
        ShortBody: the body ended early; OSError: reset, timeout.
        ValueError: the answer holds other bytes than asked (no Content-Range, wrong start).
    """
    want = len(buffer)
    if start is None:
        extra = {"range": f"bytes=-{want}"}
    else:
        extra = {"range": f"bytes={start}-{start + want - 1}"}
    if etag:
        extra["if-match"] = etag
    headers = signer.headers("GET", target, extra)
    connection = pool.take()
    try:
        connection.request("GET", target.path, headers=headers)
        response = connection.getresponse()
        if response.status not in (200, 206):
            body = response.read(_ERROR_BYTES)
            connection.close()
            raise _client_error(response, body)
        first, total = _content_range(response.getheader("Content-Range"))
        length = response.length
        if start is None:
            fits = length is not None and length <= want and first >= 0 and first + length == total
        else:
            fits = first == start and length == want
        if not fits or length is None:
            connection.close()
            raise ValueError(
                f"asked for {extra['range']}, the answer holds {length} bytes at {first} "
                f"(Content-Range {response.getheader('Content-Range')!r})"
            )
        got = 0
        while got < length:
            count = response.readinto(buffer[got:length])
            if not count:
                connection.close()
                raise ShortBody(f"a body of {got} bytes for {length} (cut short)")
            got += count
        answer = Answer(response.getheader("ETag") or "", first, total, length)
    except http.client.HTTPException as err:  # a status line or headers cut short
        connection.close()
        raise ConnectionError(f"{type(err).__name__}: {err}") from err
    except BaseException:
        connection.close()
        raise
    if response.will_close:
        connection.close()
    else:
        pool.give(connection)
    return answer


def _content_range(header: str | None) -> tuple[int, int]:
    """Return ``(first byte, object size)`` of ``bytes a-b/size``; (-1, -1) without one."""
    if not header:
        return -1, -1
    span, _, total = header.removeprefix("bytes ").partition("/")
    return int(span.partition("-")[0]), int(total) if total.isdigit() else -1


def _client_error(response: http.client.HTTPResponse, body: bytes) -> Exception:
    from botocore.exceptions import ClientError

    text = body.decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    error: Exception = ClientError(
        {
            "Error": {
                "Code": code.group(1) if code else str(response.status),
                "Message": message.group(1) if message else response.reason,
            },
            "ResponseMetadata": {
                "HTTPStatusCode": response.status,
                "HTTPHeaders": {
                    name: value
                    for name in ("retry-after", "x-amz-retry-after")
                    if (value := response.getheader(name)) is not None
                },
            },
        },
        "GetObject",
    )
    return error
