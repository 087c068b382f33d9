"""Packs in Google Cloud Storage (``gs://bucket/key``): ``GCSStore``, ``GCSOptions``, ``GCSSource``.

NOTE [ The GCS client ]

The client is google-cloud-storage (the ``gcs`` extra; docs/decisions/0031-gcs-azure-http-
stores.md says why), made once per process and options, with no retries of its own (ours:
NOTE [ Ranged sources ]). A chunk is one ranged media GET carrying ``ifGenerationMatch``
(the generation seen at open), and the answer's generation is checked where the server
says it. Settings are named as gcsfs names them: ``project``, ``token`` (``"anon"``,
``"google_default"``, ``"cloud"``, or a credentials file), ``endpoint_url``; the
environment gives ``STORAGE_EMULATOR_HOST`` and ``GOOGLE_CLOUD_PROJECT`` (the default
credentials read ``GOOGLE_APPLICATION_CREDENTIALS`` themselves). A publish is one upload with
``ifGenerationMatch=0`` when it must not replace (GCS refuses atomically: 412), its CRC32C
sent for the server to check and compared with the stored object's (one that differs is
removed and sent again); an interrupted upload leaves no object (nothing to sweep).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from h5pack.core.ranged import RangedSource, Retry, throttled_or_not
from h5pack.core.retry import RetryPolicy, Transient
from h5pack.core.store import ObjectInfo, Store, missing_extra, split_url
from h5pack.errors import PackNotFoundError, RemoteError, TargetExistsError

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


@dataclass(frozen=True, kw_only=True)
class GCSOptions(RetryPolicy):
    """How to reach Google Cloud Storage (names as gcsfs's).

    Attributes:
        project: The project (listings and bucket creation need one).
        token: ``None`` or ``"google_default"``: the default credentials (anonymous on an
            emulator); ``"anon"``; ``"cloud"``: the metadata server; else a JSON file of
            credentials (service account or user).
        endpoint_url: Another server than Google's (an emulator: ``http://127.0.0.1:9023``).
        connect_timeout_s: Seconds to connect.
        read_timeout_s: Seconds without a byte.
        max_in_flight: Requests one process issues at once.
    """

    ALIASES: ClassVar[Mapping[str, str]] = {**RetryPolicy.ALIASES, "endpoint": "endpoint_url"}
    ENVIRONMENT: ClassVar[Mapping[str, str]] = {
        "STORAGE_EMULATOR_HOST": "endpoint_url",
        "GOOGLE_CLOUD_PROJECT": "project",
    }

    project: str | None = None
    token: str | None = None
    endpoint_url: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    max_in_flight: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.endpoint_url and "://" not in self.endpoint_url:  # as the SDK reads it
            object.__setattr__(self, "endpoint_url", "http://" + self.endpoint_url)


def storage_modules() -> Any:
    """Return ``google.cloud.storage`` (the ``gcs`` extra)."""
    try:
        from google.cloud import storage
    except ImportError as err:
        raise missing_extra("gs", err) from err
    return storage


_CLIENTS: dict[tuple[int, GCSOptions], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(options: GCSOptions) -> Any:
    """Return this process's client for ``options`` (made once; a forked child makes its own)."""
    key = (os.getpid(), options)
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = make_client(options)
        return _CLIENTS[key]


def untyped(function: Any) -> Callable[..., Any]:
    """Return ``function`` as mypy sees a typed call (google's auth and CRC modules are not)."""
    return cast("Callable[..., Any]", function)


def make_client(options: GCSOptions) -> Any:
    """Return a ``google.cloud.storage.Client`` of ``options``."""
    storage = storage_modules()
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    token = options.token
    project = options.project
    if token == "anon" or (token is None and options.endpoint_url):
        credentials: Any = untyped(AnonymousCredentials)()
        project = project or "h5pack"  # an emulator wants one, and checks none
    elif token in (None, "google_default"):
        credentials, found = google.auth.default(scopes=[SCOPE])
        project = project or found
    elif token == "cloud":
        from google.auth import compute_engine

        credentials = untyped(compute_engine.Credentials)()
    else:
        credentials, found = untyped(google.auth.load_credentials_from_file)(token, scopes=[SCOPE])
        project = project or found
    client_options = {"api_endpoint": options.endpoint_url} if options.endpoint_url else None
    client = storage.Client(project=project, credentials=credentials, client_options=client_options)
    # Since 3.x the client fetches each bucket's metadata for its traces on a background
    # thread: one more request per bucket, and a thread that may hold a lock at a fork.
    client._bucket_metadata_cache = None
    return client


def file_crc32c(path: Path) -> str:
    """Return the CRC32C of the file at ``path`` as GCS writes it (base64, big-endian)."""
    import google_crc32c

    checksum: Any = untyped(google_crc32c.Checksum)()
    with open(path, "rb") as file:
        while block := file.read(8 * 2**20):
            checksum.update(block)
    return base64.b64encode(checksum.digest()).decode()


class GCSSource(RangedSource):
    """One object in a GCS bucket (NOTE [ The GCS client ]); its generation is its identity."""

    def __init__(self, url: str, options: GCSOptions, **identity: Any) -> None:
        super().__init__(url, options, options.max_in_flight, **identity)
        _, self.bucket, self.key = split_url(url)
        self.options = options
        self._timeout = (options.connect_timeout_s, options.read_timeout_s)

    def blob(self) -> Any:
        """Return a new handle of the object (a handle holds one answer's properties)."""
        return shared_client(self.options).bucket(self.bucket).blob(self.key)

    def _stat(self) -> tuple[str, int]:
        blob = self.blob()
        blob.reload(retry=None, timeout=self._timeout)
        return str(blob.generation), int(blob.size)

    def _fetch(self, start: int, end: int) -> tuple[bytes, str, int]:
        blob = self.blob()
        data: bytes = blob.download_as_bytes(
            start=start,
            end=end - 1,
            raw_download=True,
            checksum=None,
            retry=None,
            timeout=self._timeout,
            if_generation_match=int(self.tag) if self.tag else None,
        )
        return data, str(blob.generation or ""), -1

    def cause(self, err: Exception, what: str) -> Transient:
        """Return why ``err`` is worth a retry, or raise the final error it means."""
        import urllib3
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        if isinstance(err, api.NotFound):
            bucket = shared_client(self.options).bucket(self.bucket)
            if not self.with_retries("its bucket", lambda: bucket.exists(retry=None)):
                raise PackNotFoundError(
                    f"{self.url}: no bucket {self.bucket!r} at {self.where()}; check the "
                    "bucket's name and the endpoint (STORAGE_EMULATOR_HOST or storage option "
                    "endpoint_url)"
                ) from None
            raise PackNotFoundError(
                f"{self.url}: no such object in bucket {self.bucket!r} at {self.where()}; "
                "check the key (a pack set: its prefix, ending in /)"
            ) from None
        if isinstance(err, api.PreconditionFailed):
            raise self.replaced() from None
        if isinstance(err, api.BadRequest) and re.search(r"(CRC32C|MD5).*match", str(err)):
            return Transient(f"{err.code}: a body damaged on the way, refused")
        if isinstance(err, api.Forbidden | api.Unauthorized | auth.RefreshError):
            raise RemoteError(
                f"{self.url}: access denied ({err.__class__.__name__}) at {self.where()}; "
                "check the credentials (GOOGLE_APPLICATION_CREDENTIALS, or storage option "
                "token) and the bucket's permissions"
            ) from None
        if isinstance(err, auth.DefaultCredentialsError):
            raise RemoteError(
                f"{self.url}: no credentials ({err}); set GOOGLE_APPLICATION_CREDENTIALS, or "
                "give the storage option token (a credentials file, or 'anon')"
            ) from None
        cause = f"{type(err).__name__}: {err}"
        if isinstance(err, api.TooManyRequests | api.ServerError):
            headers = getattr(getattr(err, "response", None), "headers", None)
            return throttled_or_not(cause, int(err.code or 0), headers)
        if isinstance(err, auth.TransportError | OSError | urllib3.exceptions.HTTPError):
            return Transient(cause)
        raise RemoteError(f"{self.url}: {what}: {type(err).__name__}: {err}") from None

    def where(self) -> str:
        """Return the endpoint requests go to."""
        return self.options.endpoint_url or "https://storage.googleapis.com"


class GCSStore(Store):
    """Objects in Google Cloud Storage buckets (NOTE [ The GCS client ])."""

    options_type = GCSOptions
    options: GCSOptions

    def source(self, path: str) -> GCSSource:
        """Return the object at the URL ``path`` (its generation fixed at the first answer)."""
        return GCSSource(path, self.options)

    def _call(self, path: str, what: str, call: Any) -> Any:
        source = self.source(path)
        return source.with_retries(what, lambda: call(source.blob(), source._timeout))

    def objects(self, prefix: str) -> list[ObjectInfo]:
        """Return the objects under the URL ``prefix``, sorted (one listing request a page)."""
        scheme, bucket, key = split_url(prefix)
        source = self.source(prefix)

        def listing() -> list[ObjectInfo]:
            client = shared_client(self.options)
            blobs = client.list_blobs(bucket, prefix=key, retry=None, timeout=source._timeout)
            url = f"{scheme}://{bucket}/"
            return [ObjectInfo(url + b.name, int(b.size), str(b.generation)) for b in blobs]

        return sorted(source.with_retries("the listing", listing), key=lambda o: o.url)

    def stat(self, path: str) -> ObjectInfo | None:
        """Return the object at ``path`` (one metadata GET), or None when there is none."""
        try:
            blob = self._call(path, "its size", lambda b, t: b.reload(retry=None, timeout=t) or b)
        except PackNotFoundError as err:
            if "no bucket" in str(err):
                raise
            return None
        return ObjectInfo(path, int(blob.size), str(blob.generation))

    def put(self, path: str, data: bytes) -> None:
        """Write the small object ``path`` (one upload: whole or not at all)."""
        self._call(
            path,
            "the upload",
            lambda b, t: b.upload_from_string(data, retry=None, timeout=t, checksum="crc32c"),
        )

    def publish(self, local: Path, path: str, *, if_absent: bool) -> ObjectInfo:
        """Upload the finished file ``local`` under ``path`` (``ifGenerationMatch=0``: if absent).

        Raises:
            TargetExistsError: ``if_absent`` and an object is there.
            RemoteError: the upload failed; nothing is left under ``path``.
        """
        from google.api_core import exceptions as api

        size = local.stat().st_size
        crc32c = file_crc32c(local)

        def upload(blob: Any, timeout: Any) -> Any:
            try:
                blob.upload_from_filename(
                    str(local),
                    if_generation_match=0 if if_absent else None,
                    checksum="crc32c",
                    retry=None,
                    timeout=timeout,
                )
            except api.PreconditionFailed:
                raise TargetExistsError(f"{path} appeared meanwhile; not replaced") from None
            if blob.crc32c and blob.crc32c != crc32c:  # stored other than sent: removed, resent
                blob.delete(if_generation_match=blob.generation, retry=None, timeout=timeout)
                raise Retry(f"the stored object's CRC32C {blob.crc32c} is not the file's {crc32c}")
            return blob

        blob = self._call(path, f"the upload of {size} bytes", upload)
        return ObjectInfo(path, size, str(blob.generation or ""))

    def delete(self, path: str) -> None:
        """Delete ``path`` (no error when it is gone)."""
        with contextlib.suppress(PackNotFoundError):
            self._call(path, "its removal", lambda b, t: b.delete(retry=None, timeout=t))
