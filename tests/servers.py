"""Local GCS, Azure and HTTP servers on 127.0.0.1 for the store tests, behind counting proxies.

- ``GCSServer``: ``gcp-storage-emulator`` (pip, in the dev extra), in memory.
- ``AzuriteServer``: Azurite's blob service (npm: ``.ci/run`` installs it into
  ``.ci/node``; ``npm install --no-save --prefix .ci/node azurite@3``), in memory, no
  telemetry.
- ``RangeServer``: a folder over HTTP/1.1 with ``Range``, ``ETag`` and ``If-Match``
  (``http.server`` has no ranges).
- ``Place``: one bucket (container, folder) of one of them reached through a
  ``FaultProxy``, with the interface of ``h5pack.bench.s3local.Bucket`` (``url``, ``put``,
  ``put_tree``, ``storage_options``, ``proxy``), so one test serves every store.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

from h5pack.core import azure, gcs
from h5pack.core.ranged import per_process
from h5pack.core.store import open_store
from tests.s3local import FaultProxy, free_port, stop, wait_listening

REPO = Path(__file__).resolve().parents[1]
# Azurite's documented development account (public, the same in every installation)
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_ACCOUNT = "devstoreaccount1"


def azurite_binary() -> str | None:
    """Return Azurite's blob service executable (``.ci/node`` or the PATH), or None."""
    local = REPO / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


def gcs_emulator_binary() -> str | None:
    """Return ``gcp-storage-emulator`` beside this Python, or on the PATH, or None."""
    beside = Path(sys.executable).parent / "gcp-storage-emulator"
    return str(beside) if beside.exists() else shutil.which("gcp-storage-emulator")


class Server:
    """A server process on a free port of 127.0.0.1; a context manager."""

    def __init__(self, command: list[str], port: int, cwd: Path) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self._process = subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            wait_listening(self._process, port, command[0], timeout_s=60)
        except RuntimeError:
            self.close()
            raise

    def close(self) -> None:
        """Stop the server."""
        stop(self._process)

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class GCSServer(Server):
    """``gcp-storage-emulator`` in memory."""

    def __init__(self, cwd: Path) -> None:
        binary = gcs_emulator_binary()
        if binary is None:
            raise RuntimeError("the GCS tests need gcp-storage-emulator: pip install it")
        port = free_port()
        command = [binary, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
        super().__init__(command, port, cwd)


class AzuriteServer(Server):
    """Azurite's blob service in memory, no telemetry, any API version."""

    def __init__(self, cwd: Path) -> None:
        binary = azurite_binary()
        if binary is None:
            raise RuntimeError(
                "the Azure tests need Azurite: npm install --no-save --prefix .ci/node azurite@3"
            )
        port = free_port()
        command = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port)]
        command += ["--disableTelemetry", "--inMemoryPersistence", "--skipApiVersionCheck"]
        super().__init__([*command, "--loose"], port, cwd)

    def connection_string(self, endpoint: str | None = None) -> str:
        """Return the connection string of the development account here (or at ``endpoint``)."""
        return self.connection_string_at(endpoint or self.endpoint)

    @staticmethod
    def connection_string_at(endpoint: str) -> str:
        """Return the connection string of Azurite's development account at ``endpoint``."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
        )


class RangeServer:
    """``root`` over HTTP/1.1 with single ranges, ETags and ``If-Match``; a context manager."""

    def __init__(self, root: Path) -> None:
        self.root = root

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _serve(self, *, body: bool) -> None:
                path = root / self.path.lstrip("/").split("?")[0]
                if not path.is_file():
                    self._answer(404, {}, b"")
                    return
                data = path.read_bytes()
                found = path.stat()
                etag = f'"{found.st_ino:x}-{found.st_mtime_ns:x}-{found.st_size:x}"'
                wanted = self.headers.get("If-Match")
                if wanted and wanted != etag:
                    self._answer(412, {}, b"")
                    return
                headers = {"ETag": etag, "Accept-Ranges": "bytes"}
                span = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
                if span is None:
                    self._answer(200, headers, data, body=body)
                    return
                first, last = span.groups()
                start = int(first) if first else max(0, len(data) - int(last))
                end = min(len(data), int(last) + 1) if first and last else len(data)
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
                self._answer(206, headers, data[start:end], body=body)

            def _answer(
                self, status: int, headers: dict[str, str], data: bytes, *, body: bool = True
            ) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop the server."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> RangeServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Place:
    """A fresh bucket of ``server`` reached through ``proxy`` (``s3local.Bucket``'s API).

    Objects are put through a store that goes straight to the server: the proxy counts
    only what the code under test asks.
    """

    def __init__(
        self, server: GCSServer | AzuriteServer | RangeServer, name: str, proxy: FaultProxy
    ) -> None:
        self.name, self.proxy = name, proxy
        self._root: Path | None = None
        options: dict[str, object]
        if isinstance(server, GCSServer):
            self.scheme = "gs"
            options, direct = {"endpoint_url": proxy.endpoint}, {"endpoint_url": server.endpoint}
            self._direct = open_store("gs://x", direct)
            per_process(gcs.make_client, gcs.GCSStore.of(direct).options).create_bucket(name)
        elif isinstance(server, AzuriteServer):
            self.scheme = "az"
            options = {"connection_string": server.connection_string(proxy.endpoint)}
            direct = {"connection_string": server.connection_string()}
            self._direct = open_store("az://x", direct)
            per_process(azure.make_client, azure.AzureStore.of(direct).options).create_container(
                name
            )
        else:
            self.scheme, options, self._root = "http", {}, server.root
            self._direct = open_store("http://x/y")
        self.storage_options: dict[str, object] = {
            **options,
            "backoff_s": 0.0,
            "throttle_backoff_s": 0.0,
            "max_attempts": 5,
            "read_timeout_s": 15.0,
        }

    def url(self, key: str = "") -> str:
        """Return ``scheme://NAME/key`` (``http://proxy/NAME/key``)."""
        if self.scheme == "http":
            return f"{self.proxy.endpoint}/{self.name}/{key}"
        return f"{self.scheme}://{self.name}/{key}"

    def put(self, local: os.PathLike[str] | str, key: str) -> str:
        """Upload the local file ``local`` under ``key``; return its URL."""
        if self._root is not None:  # the HTTP server's folder
            target = self._root / self.name / key
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            shutil.copyfile(local, partial)
            os.replace(partial, target)
        else:
            self._direct.publish(Path(local), self.url(key), if_absent=False)
        return self.url(key)

    def put_tree(self, local: os.PathLike[str] | str, prefix: str) -> str:
        """Upload every file under the local folder ``local`` to ``prefix/``; return its URL."""
        root = Path(local)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(path, f"{prefix.rstrip('/')}/{path.relative_to(root).as_posix()}")
        return self.url(prefix.rstrip("/") + "/")


def demo_bucket(gcs_server: GCSServer, azurite_server: AzuriteServer, name: str = "demo") -> None:
    """Make the bucket and the container ``name`` (docs/object-storage.md's), if absent."""
    client = per_process(
        gcs.make_client, gcs.GCSStore.of({"endpoint_url": gcs_server.endpoint}).options
    )
    if client.lookup_bucket(name) is None:
        client.create_bucket(name)
    options = azure.AzureStore.of({"connection_string": azurite_server.connection_string()})
    container = per_process(azure.make_client, options.options).get_container_client(name)
    if not container.exists():
        container.create_container()
