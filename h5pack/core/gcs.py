"""Packs in Google Cloud Storage (``gs://bucket/key``): ``GCSStore``, ``GCSOptions``, ``GCSSource``.

NOTE [ The GCS client ]

The client is google-cloud-storage (the ``gcs`` extra; docs/decisions/0031-gcs-azure-http-
stores.md says why), with no retries of its own (ours: NOTE [ Ranged sources ]). A chunk
is one ranged media GET carrying ``ifGenerationMatch``. Settings are named as gcsfs names
them: ``project``, ``token`` (``"anon"``, ``"google_default"``, ``"cloud"``, or a
credentials file), ``endpoint_url``; the environment gives ``STORAGE_EMULATOR_HOST`` and
``GOOGLE_CLOUD_PROJECT`` (the default credentials read ``GOOGLE_APPLICATION_CREDENTIALS``).
A publish is one upload with ``ifGenerationMatch=0`` when it must not replace (refused
atomically: 412), its CRC32C checked by the server and against the stored object's (one
that differs is removed and sent again); an interrupted upload leaves no object.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from h5pack.core.ranged import RangedSource, RemoteOptions, Retry, per_process, throttled_or_not
from h5pack.core.retry import Transient
from h5pack.core.store import ObjectInfo, Store, missing_extra, split_url
from h5pack.errors import PackNotFoundError, RemoteError, TargetExistsError

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


@dataclass(frozen=True, kw_only=True)
class GCSOptions(RemoteOptions):
    """How to reach Google Cloud Storage (names as gcsfs's).

    Attributes:
        project: The project (listings and bucket creation need one).
        token: ``None`` or ``"google_default"``: the default credentials (anonymous on an
            emulator); ``"anon"``; ``"cloud"``: the metadata server; else a JSON file of
            credentials (service account or user).
        endpoint_url: Another server than Google's (an emulator: ``http://127.0.0.1:9023``).
    """

    ALIASES: ClassVar[Mapping[str, str]] = {**RemoteOptions.ALIASES, "endpoint": "endpoint_url"}
    ENVIRONMENT: ClassVar[Mapping[str, str]] = {
        "STORAGE_EMULATOR_HOST": "endpoint_url",
        "GOOGLE_CLOUD_PROJECT": "project",
    }

    project: str | None = None
    token: str | None = None
    endpoint_url: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.endpoint_url and "://" not in self.endpoint_url:  # as the SDK reads it
            object.__setattr__(self, "endpoint_url", "http://" + self.endpoint_url)


def untyped(function: Any) -> Callable[..., Any]:
    """Return ``function`` as mypy sees a typed call (google's auth and CRC modules are not)."""
    return cast("Callable[..., Any]", function)


def make_client(options: GCSOptions) -> Any:
    """Return a ``google.cloud.storage.Client`` of ``options``."""
    try:
        from google.cloud import storage
    except ImportError as err:
        raise missing_extra("gs", err) from err
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    token, project = options.token, options.project
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

    options: GCSOptions
    ENDPOINT_HINT = "STORAGE_EMULATOR_HOST or storage option endpoint_url"
    CREDENTIALS_HINT = "GOOGLE_APPLICATION_CREDENTIALS, or storage option token"

    def __init__(self, url: str, options: GCSOptions, **identity: Any) -> None:
        super().__init__(url, options, **identity)
        _, self.bucket, self.key = split_url(url)
        self.timeout = (options.connect_timeout_s, options.read_timeout_s)

    def blob(self) -> Any:
        """Return a new handle of the object (a handle holds one answer's properties)."""
        return per_process(make_client, self.options).bucket(self.bucket).blob(self.key)

    def _stat(self) -> tuple[str, int]:
        blob = self.blob()
        blob.reload(retry=None, timeout=self.timeout)
        return str(blob.generation), int(blob.size)

    def _fetch(self, start: int, end: int) -> tuple[bytes, str, int]:
        blob = self.blob()
        data: bytes = blob.download_as_bytes(
            start=start,
            end=end - 1,
            raw_download=True,
            checksum=None,
            retry=None,
            timeout=self.timeout,
            if_generation_match=int(self.tag) if self.tag else None,
        )
        return data, str(blob.generation or ""), -1

    def cause(self, err: Exception, what: str) -> Transient:
        """Return why ``err`` is worth a retry, or raise the final error it means."""
        import urllib3
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        if isinstance(err, api.NotFound):
            bucket = per_process(make_client, self.options).bucket(self.bucket)
            exists = self.with_retries("its bucket", lambda: bucket.exists(retry=None))
            raise self.missing(self.bucket, whole=not exists) from None
        if isinstance(err, api.PreconditionFailed):
            raise self.replaced() from None
        if isinstance(err, api.BadRequest) and re.search(r"(CRC32C|MD5).*match", str(err)):
            return Transient(f"{err.code}: a body damaged on the way, refused")
        if isinstance(err, api.Forbidden | api.Unauthorized | auth.RefreshError):
            raise self.denied(type(err).__name__) from None
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
        raise RemoteError(f"{self.url}: {what}: {cause}") from None

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

    def _call(self, path: str, what: str, call: Callable[[Any, Any], Any]) -> Any:
        source = self.source(path)
        return source.with_retries(what, lambda: call(source.blob(), source.timeout))

    def objects(self, prefix: str) -> list[ObjectInfo]:
        """Return the objects under the URL ``prefix``, sorted (one listing request a page)."""
        scheme, bucket, key = split_url(prefix)

        def listing(_: Any, timeout: Any) -> list[ObjectInfo]:
            client = per_process(make_client, self.options)
            blobs = client.list_blobs(bucket, prefix=key, retry=None, timeout=timeout)
            url = f"{scheme}://{bucket}/"
            return [ObjectInfo(url + b.name, int(b.size), str(b.generation)) for b in blobs]

        return sorted(self._call(prefix, "the listing", listing), key=lambda o: o.url)

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
