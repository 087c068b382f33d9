"""Packs served over plain HTTP(S) (``https://host/p.h5``), read-only: ``HTTPStore``.

NOTE [ The HTTP store ]

Any server that answers ``Range`` requests (nginx, a CDN, S3/GCS/Azure public URLs) serves
a pack: a HEAD gives its size and its identity (the ETag, else Last-Modified), each chunk is
one ranged GET carrying ``If-Match`` (``If-Unmodified-Since`` without an ETag), and every
answer must be 206 with the asked range and the same ETag and total size. ``http.client``
of the standard library, one keep-alive connection per thread and process (no extra to
install). The storage option ``headers`` (fsspec's name) is sent with every request (an
``Authorization``, say; never in a repr or message). Nothing is written: convert or merge
into a local path or a bucket, then serve it.
"""

from __future__ import annotations

import atexit
import http.client
import os
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from h5pack.core.ranged import RangedSource, throttled_or_not
from h5pack.core.retry import RetryPolicy, Transient
from h5pack.core.source import readable
from h5pack.core.store import ObjectInfo, Store
from h5pack.errors import H5PackError, PackNotFoundError, RemoteError


@dataclass(frozen=True, kw_only=True)
class HTTPOptions(RetryPolicy):
    """How to reach an HTTP(S) server.

    Attributes:
        headers: Sent with every request (a mapping, kept as sorted ``(name, value)`` pairs).
        connect_timeout_s: Seconds to connect.
        read_timeout_s: Seconds without a byte.
        max_in_flight: Requests one process issues at once.
    """

    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    max_in_flight: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "headers", tuple(sorted(dict(self.headers).items())))


class _Answer(Exception):
    """An answer other than the one asked for (its status)."""

    def __init__(self, answer: Any) -> None:
        super().__init__(f"HTTP {answer.status} {answer.reason}")
        self.status, self.headers = int(answer.status), answer.headers


_CONTEXT: list[ssl.SSLContext] = []
# Idle keep-alive connections per (process, scheme, host): a forked child never uses its
# parent's sockets; closed at exit.
_IDLE: dict[tuple[int, str, str], list[http.client.HTTPConnection]] = {}
_LOCK = threading.Lock()


@atexit.register
def _close_idle() -> None:
    with _LOCK:
        mine = [c for key, idle in _IDLE.items() if key[0] == os.getpid() for c in idle]
        _IDLE.clear()
    for connection in mine:
        connection.close()


class HTTPSource(RangedSource):
    """One file on an HTTP(S) server (NOTE [ The HTTP store ])."""

    def __init__(self, url: str, options: HTTPOptions, **identity: Any) -> None:
        super().__init__(url, options, options.max_in_flight, **identity)
        parts = urlsplit(url)
        self.scheme, self.netloc = parts.scheme.lower(), parts.netloc
        self.target = parts.path + (f"?{parts.query}" if parts.query else "")
        self.options = options

    def _request(self, method: str, headers: dict[str, str]) -> tuple[Any, bytes]:
        """Return one answer and its body, on an idle keep-alive connection of this process."""
        key = (os.getpid(), self.scheme, self.netloc)
        connection = None
        while connection is None:
            with _LOCK:
                idle = _IDLE.setdefault(key, [])
                connection = idle.pop() if idle else None
            if connection is None:
                break
            if connection.sock is None or readable(connection.sock):
                connection.close()  # closed by the server while idle (it reads as its EOF)
                connection = None
        if connection is None:
            timeout = self.options.connect_timeout_s
            if self.scheme == "https":
                if not _CONTEXT:
                    _CONTEXT.append(ssl.create_default_context())
                connection = http.client.HTTPSConnection(
                    self.netloc, timeout=timeout, context=_CONTEXT[0]
                )
            else:
                connection = http.client.HTTPConnection(self.netloc, timeout=timeout)
        try:
            if connection.sock is None:
                connection.connect()
                assert connection.sock is not None  # connected just now
                connection.sock.settimeout(self.options.read_timeout_s)
            every = {**dict(self.options.headers), **headers}
            connection.request(method, self.target, headers=every)
            answer = connection.getresponse()
            body = answer.read()  # a HEAD's too: the connection is then free again
        except (OSError, http.client.HTTPException):
            connection.close()  # a dropped keep-alive connection costs one try
            raise
        if answer.will_close:
            connection.close()
        else:
            with _LOCK:
                _IDLE[key].append(connection)
        return answer, body

    def _identity(self, answer: Any) -> str:
        etag = answer.getheader("ETag") or ""
        return etag or f"modified {answer.getheader('Last-Modified') or ''}"

    def _stat(self) -> tuple[str, int]:
        answer, _ = self._request("HEAD", {})
        if answer.status != 200:
            raise _Answer(answer)
        length = answer.getheader("Content-Length")
        if length is None:
            raise RemoteError(f"{self.url}: the server does not say the file's size (HEAD)")
        return self._identity(answer), int(length)

    def _fetch(self, start: int, end: int) -> tuple[bytes, str, int]:
        headers = {"Range": f"bytes={start}-{end - 1}"}
        if self.tag and self.tag.startswith("modified "):
            headers["If-Unmodified-Since"] = self.tag.removeprefix("modified ")
        elif self.tag and not self.tag.startswith("W/"):
            headers["If-Match"] = self.tag
        answer, body = self._request("GET", headers)
        if answer.status == 200:
            raise RemoteError(
                f"{self.url}: the server answered a Range request with the whole file (HTTP "
                "200): it does not serve byte ranges, which remote packs need"
            )
        if answer.status != 206:
            raise _Answer(answer)
        span, _, total = (answer.getheader("Content-Range") or "").partition("/")
        first = span.removeprefix("bytes ").partition("-")[0]
        if first != str(start):
            raise RemoteError(
                f"{self.url}: asked for bytes {start}..{end - 1}, got Content-Range "
                f"{answer.getheader('Content-Range')!r}"
            )
        return body, self._identity(answer), int(total) if total.isdigit() else -1

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

    def stat(self, path: str) -> ObjectInfo | None:
        """Return the file at ``path`` (one HEAD), or None when there is none."""
        source = self.source(path)
        try:
            tag, size = source.with_retries("its size (HEAD)", source._stat)
        except PackNotFoundError:
            return None
        return ObjectInfo(path, size, tag)

    def _read_only(self, path: str) -> H5PackError:
        return H5PackError(
            f"{path}: HTTP(S) URLs are read-only; write into a local path or a bucket "
            "(s3://, gs://, az://) and serve that"
        )

    def put(self, path: str, data: bytes) -> None:
        """Refuse: HTTP(S) is read-only."""
        raise self._read_only(path)

    def publish(self, local: Path, path: str, *, if_absent: bool) -> ObjectInfo:
        """Refuse: HTTP(S) is read-only."""
        raise self._read_only(path)

    def delete(self, path: str) -> None:
        """Refuse: HTTP(S) is read-only."""
        raise self._read_only(path)

    def sweep(self, paths: Sequence[str]) -> list[str]:
        """Refuse: HTTP(S) is read-only (a writer sweeps before it writes: it stops there)."""
        raise self._read_only(paths[0] if paths else "http(s)://")
