"""Packs served over plain HTTP(S) (``https://host/p.h5``), read-only: ``HTTPStore``.

NOTE [ The HTTP store ]

Any server that answers ``Range`` requests (nginx, a CDN, S3/GCS/Azure public URLs) serves
a pack: a HEAD gives its size and identity (the ETag, else Last-Modified), each chunk is
one ranged GET carrying ``If-Match`` (``If-Unmodified-Since`` without an ETag), and every
answer must be 206 with the asked range, read into its buffer (``read_range``, also the S3
chunks' GETs'). ``http.client`` of the standard library, on ``Connections`` kept alive per
process: no extra to install.
The setting ``headers`` (fsspec's name) is sent with every request (an ``Authorization``,
never in a repr or message). Nothing is written: write into a path or a bucket, serve that.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from h5pack.core.ranged import RangedSource, RemoteOptions, per_process, throttled_or_not
from h5pack.core.retry import Transient
from h5pack.core.source import readable
from h5pack.core.store import Store
from h5pack.errors import H5PackError, PackNotFoundError, RemoteError

_ERROR_BYTES = 1 << 16  # the most of an error answer's body read (an S3 error's code)


class Connections:
    """Idle keep-alive connections to ``scheme://netloc``, for the threads of one process.

    HTTPS is verified against ``cafile`` (None: the system's); ``keep`` idle ones are kept.
    """

    def __init__(
        self,
        scheme: str,
        netloc: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        cafile: str | None = None,
        keep: int = 16,
    ) -> None:
        self.scheme, self.netloc, self.cafile, self.keep = scheme, netloc, cafile, keep
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None

    def take(self) -> http.client.HTTPConnection:
        """Return an idle connection still open, or a new one (connected).

        One the server closed while idle reads as readable (its EOF): it is skipped, as
        urllib3 does, rather than failing a request and costing a try.
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
                self._context = ssl.create_default_context(cafile=self.cafile)
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

    def give(self, connection: http.client.HTTPConnection) -> None:
        """Keep ``connection`` for the next request (its answer read to the end)."""
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _dropped(sock: socket.socket) -> bool:
    try:
        return readable(sock)
    except (OSError, ValueError):  # closed meanwhile
        return True


def connections(key: tuple[str, str, float, float, str | None]) -> Connections:
    """Return connections to ``(scheme, netloc, connect_timeout_s, read_timeout_s, cafile)``.

    Each process makes its own (``per_process``): a forked child never uses its parent's.
    """
    scheme, netloc, connect, read, ca = key
    return Connections(scheme, netloc, connect_timeout_s=connect, read_timeout_s=read, cafile=ca)


class ShortBody(OSError):
    """The connection ended before the whole body arrived (retried)."""


class Answer(NamedTuple):
    """What a ranged GET said besides its body."""

    first: int  # the body's first byte in the object
    total: int  # the object's size (-1: unsaid)
    nbytes: int  # the body's, written into the buffer
    headers: Any  # the answer's (its ETag...)


def exchange(pool: Connections, method: str, path: str, headers: dict[str, str], read: Any) -> Any:
    """Return ``read(answer)`` (to its end) of one request on a connection of ``pool``."""
    connection = pool.take()
    try:
        connection.request(method, path, headers=headers)
        answer = connection.getresponse()
        found = read(answer)
    except http.client.HTTPException as err:  # a status line or headers cut short
        connection.close()
        raise ConnectionError(f"{type(err).__name__}: {err}") from err
    except BaseException:
        connection.close()
        raise
    if answer.will_close:
        connection.close()
    else:
        pool.give(connection)
    return found


def byte_range(start: int | None, nbytes: int) -> str:
    """Return the ``Range`` of ``nbytes`` bytes from ``start`` (None: the last ``nbytes``)."""
    return f"bytes=-{nbytes}" if start is None else f"bytes={start}-{start + nbytes - 1}"


def read_range(
    buffer: memoryview,
    start: int | None,
    pool: Connections,
    path: str,
    headers: dict[str, str],
    refused: Callable[[http.client.HTTPResponse, bytes], Exception],
) -> Answer:
    """Fill ``buffer`` with the bytes a ranged GET asks for (``start`` None: a suffix range).

    Raises ``refused(answer, body)`` for an answer neither 200 nor 206, ``ShortBody`` or
    ``OSError`` (retried), ``ValueError`` when it holds other bytes than asked.
    """
    want = len(buffer)

    def read(response: http.client.HTTPResponse) -> Answer:
        if response.status not in (200, 206):
            raise refused(response, response.read(_ERROR_BYTES))
        said = response.getheader("Content-Range") or ""
        span, _, size = said.removeprefix("bytes ").partition("/")
        first, total = int(span.partition("-")[0] or -1), int(size) if size.isdigit() else -1
        length = response.length
        if start is None:
            fits = length is not None and length <= want and first >= 0 and first + length == total
        else:
            fits = first == start and length == want
        if not fits or length is None:
            raise ValueError(
                f"asked for {byte_range(start, want)}, got HTTP {response.status}, {length} bytes "
                f"at {first} (Content-Range {said!r})"
                + (
                    ""
                    if said
                    else ": the server does not serve byte ranges, which remote packs need"
                )
            )
        got = 0
        while got < length:
            count = response.readinto(buffer[got:length])
            if not count:
                raise ShortBody(f"a body of {got} bytes for {length} (cut short)")
            got += count
        return Answer(first, total, length, response.headers)

    found: Answer = exchange(pool, "GET", path, headers, read)
    return found


@dataclass(frozen=True, kw_only=True)
class HTTPOptions(RemoteOptions):
    """How to reach an HTTP(S) server.

    Attributes:
        headers: Sent with every request (a mapping, kept as sorted ``(name, value)`` pairs).
    """

    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "headers", tuple(sorted(dict(self.headers).items())))


class _Answer(Exception):
    """An answer other than the one asked for (its status)."""

    def __init__(self, answer: Any, body: bytes = b"") -> None:
        super().__init__(f"HTTP {answer.status} {answer.reason}")
        self.status, self.headers = int(answer.status), answer.headers


class HTTPSource(RangedSource):
    """One file on an HTTP(S) server (NOTE [ The HTTP store ])."""

    options: HTTPOptions

    def __init__(self, url: str, options: HTTPOptions, **identity: Any) -> None:
        super().__init__(url, options, **identity)
        parts = urlsplit(url)
        self.scheme, self.netloc = parts.scheme.lower(), parts.netloc
        self.target = parts.path + (f"?{parts.query}" if parts.query else "")

    def _connections(self) -> Connections:
        timeouts = (self.options.connect_timeout_s, self.options.read_timeout_s)
        return per_process(connections, (self.scheme, self.netloc, *timeouts, None))

    def _identity(self, headers: Any) -> str:
        return headers.get("ETag") or f"modified {headers.get('Last-Modified') or ''}"

    def _stat(self) -> tuple[str, int]:
        def read(answer: http.client.HTTPResponse) -> Any:
            answer.read()
            if answer.status != 200:
                raise _Answer(answer)
            return answer.headers

        headers = exchange(
            self._connections(), "HEAD", self.target, dict(self.options.headers), read
        )
        if headers.get("Content-Length") is None:
            raise RemoteError(f"{self.url}: the server does not say the file's size (HEAD)")
        return self._identity(headers), int(headers["Content-Length"])

    def _fetch_into(self, view: memoryview, start: int) -> tuple[str, int]:
        headers = {**dict(self.options.headers), "Range": byte_range(start, len(view))}
        if self.tag and self.tag.startswith("modified "):
            headers["If-Unmodified-Since"] = self.tag.removeprefix("modified ")
        elif self.tag and not self.tag.startswith("W/"):
            headers["If-Match"] = self.tag
        answer = read_range(view, start, self._connections(), self.target, headers, _Answer)
        return self._identity(answer.headers), answer.total

    def cause(self, err: Exception, what: str) -> Transient:
        """Return why ``err`` is worth a retry, or raise the final error it means."""
        status = err.status if isinstance(err, _Answer) else 0
        if status in (404, 410):
            raise PackNotFoundError(f"{self.url}: no such file on the server (HTTP {status})")
        if status == 412:
            raise self.replaced()
        if status in (401, 403):
            raise RemoteError(
                f"{self.url}: access denied (HTTP {status}); check the storage option headers"
            )
        if isinstance(err, _Answer) and (status >= 500 or status == 429):
            return throttled_or_not(str(err), status, err.headers)
        if isinstance(err, OSError | http.client.HTTPException):
            return Transient(f"{type(err).__name__}: {err}")
        raise RemoteError(f"{self.url}: {what}: {err}")

    def where(self) -> str:
        """Return the server."""
        return f"{self.scheme}://{self.netloc}"


class HTTPStore(Store):
    """Files on HTTP(S) servers, read-only (NOTE [ The HTTP store ])."""

    options_type = HTTPOptions
    options: HTTPOptions

    def source(self, path: str) -> HTTPSource:
        """Return the file at the URL ``path`` (its ETag fixed at the first answer)."""
        return HTTPSource(path, self.options)

    def read_only(self, path: str) -> H5PackError:
        """Return the error of a write: HTTP(S) is read-only."""
        return H5PackError(
            f"{path}: HTTP(S) URLs are read-only; write into a local path or a bucket "
            "(s3://, gs://, az://) and serve that"
        )

    def sweep(self, paths: Sequence[str]) -> list[str]:
        """Refuse: a writer sweeps before it writes, so it stops there."""
        raise self.read_only(paths[0] if paths else "http(s)://")
