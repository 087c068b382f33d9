"""Packs in Azure Blob Storage (``az://container/key``, ``abfs://``): ``AzureStore``.

NOTE [ The Azure client ]

The client is azure-storage-blob (the ``azure`` extra; docs/decisions/0031-gcs-azure-http-
stores.md says why), with no retries of its own (ours: NOTE [ Ranged sources ]) and no
split of one read into several GETs. Settings are named as adlfs names them
(``account_name``, ``account_key``, ``connection_string``, ``sas_token``, ``anon``), or
given by the environment (``AZURE_STORAGE_*``); without a key, token or connection string,
azure-identity's default credential is asked. A publish is one upload (blocks, each with
its Content-MD5, committed at once) with ``If-None-Match: *`` when it must not replace:
Azure refuses atomically (409); uncommitted blocks are never an object.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from h5pack.core.ranged import RangedSource, RemoteOptions, per_process, throttled_or_not
from h5pack.core.retry import Transient
from h5pack.core.secrets import scrub
from h5pack.core.store import ObjectInfo, Store, missing_extra, split_url
from h5pack.errors import FormatError, PackNotFoundError, RemoteError, TargetExistsError

ONE_GET = 2**40  # the SDK splits a read above its max_single_get_size into several GETs


@dataclass(frozen=True, kw_only=True)
class AzureOptions(RemoteOptions):
    """How to reach Azure Blob Storage (names as adlfs's; secrets never in a repr).

    Attributes:
        account_name: The storage account (``https://NAME.blob.core.windows.net``).
        account_key: Its shared key.
        connection_string: A connection string (Azurite's, or a real account's).
        sas_token: A shared access signature.
        anon: Public containers: no credentials.
    """

    ENVIRONMENT: ClassVar[Mapping[str, str]] = {
        "AZURE_STORAGE_CONNECTION_STRING": "connection_string",
        "AZURE_STORAGE_ACCOUNT_NAME": "account_name",
        "AZURE_STORAGE_ACCOUNT_KEY": "account_key",
        "AZURE_STORAGE_SAS_TOKEN": "sas_token",
    }

    account_name: str | None = None
    account_key: str | None = field(default=None, repr=False)
    connection_string: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    anon: bool = False

    def account_url(self) -> str:
        """Return the account's blob endpoint (for messages when a connection string sets it)."""
        if self.connection_string:
            found = re.search(r"BlobEndpoint=([^;]+)", self.connection_string)
            if found:
                return found.group(1)
            name = re.search(r"AccountName=([^;]+)", self.connection_string)
            return f"https://{name.group(1) if name else '?'}.blob.core.windows.net"
        return f"https://{self.account_name}.blob.core.windows.net"


def make_client(options: AzureOptions) -> Any:
    """Return a ``BlobServiceClient`` of ``options``.

    Raises:
        RemoteError: no account is named.
    """
    try:
        from azure.storage import blob
    except ImportError as err:
        raise missing_extra("az", err) from err
    settings: dict[str, Any] = {
        "retry_total": 0,
        "connection_timeout": options.connect_timeout_s,
        "read_timeout": options.read_timeout_s,
        "max_single_get_size": ONE_GET,
        "max_chunk_get_size": ONE_GET,
    }
    if options.connection_string:
        return blob.BlobServiceClient.from_connection_string(options.connection_string, **settings)
    if not options.account_name:
        raise RemoteError(
            "az:// URLs need an account: set AZURE_STORAGE_ACCOUNT_NAME or "
            "AZURE_STORAGE_CONNECTION_STRING, or give the storage option account_name or "
            "connection_string"
        )
    credential: Any = None
    if options.account_key:
        credential = {"account_name": options.account_name, "account_key": options.account_key}
    elif options.sas_token:
        from azure.core.credentials import AzureSasCredential

        credential = AzureSasCredential(options.sas_token.lstrip("?"))
    elif not options.anon:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError as err:
            raise missing_extra("az", err) from err
        credential = DefaultAzureCredential()
    return blob.BlobServiceClient(options.account_url(), credential=credential, **settings)


def _container_key(url: str) -> tuple[str, str]:
    _, container, key = split_url(url)
    if "@" in container:
        raise FormatError(
            f"{url}: name the account with the storage option account_name (or "
            f"AZURE_STORAGE_ACCOUNT_NAME) and write the URL az://{container.partition('@')[0]}/"
            f"{key}"
        )
    return container, key


class AzureSource(RangedSource):
    """One blob (NOTE [ The Azure client ]); its ETag is its identity."""

    options: AzureOptions
    ENDPOINT_HINT = "AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME or storage options"
    CREDENTIALS_HINT = "account_key, sas_token or connection_string"

    def __init__(self, url: str, options: AzureOptions, **identity: Any) -> None:
        super().__init__(url, options, **identity)
        self.container, self.key = _container_key(url)

    def blob(self) -> Any:
        """Return this process's client of the blob."""
        client = per_process(make_client, self.options)
        return client.get_blob_client(self.container, self.key)

    def _stat(self) -> tuple[str, int]:
        found = self.blob().get_blob_properties()
        return str(found.etag), int(found.size)

    def _fetch(self, start: int, end: int) -> tuple[bytes, str, int]:
        from azure.core import MatchConditions

        condition = {"etag": self.tag, "match_condition": MatchConditions.IfNotModified}
        answer = self.blob().download_blob(
            offset=start, length=end - start, max_concurrency=1, **(condition if self.tag else {})
        )
        data: bytes = answer.readall()
        total = str(answer.properties.content_range or "").rpartition("/")[2]
        return data, str(answer.properties.etag or ""), int(total) if total.isdigit() else -1

    def cause(self, err: Exception, what: str) -> Transient:
        """Return why ``err`` is worth a retry, or raise the final error it means."""
        from azure.core import exceptions as azure

        code = str(getattr(err, "error_code", "") or "")
        status = int(getattr(err, "status_code", 0) or 0)
        if code == "Md5Mismatch" or (status == 400 and "contentMD5 doesn't match" in str(err)):
            return Transient(f"HTTP {status} {code}: a body damaged on the way, refused")
        if code == "ContainerNotFound" or isinstance(err, azure.ResourceNotFoundError):
            raise self.missing(self.container, whole=code == "ContainerNotFound") from None
        if isinstance(err, azure.ResourceModifiedError) or status == 412:
            raise self.replaced() from None
        if isinstance(err, azure.ClientAuthenticationError) or status in (401, 403):
            raise self.denied(code or status) from None
        text = scrub(f"{type(err).__name__}: {err}".splitlines()[0])
        if isinstance(err, azure.ServiceRequestError | azure.ServiceResponseError | OSError):
            return Transient(text)
        if isinstance(err, azure.HttpResponseError) and (status >= 500 or status in (0, 429)):
            return throttled_or_not(text, status, getattr(err.response, "headers", None))
        raise RemoteError(f"{self.url}: {what}: {text}") from None

    def where(self) -> str:
        """Return the account's endpoint."""
        return scrub(self.options.account_url())


class AzureStore(Store):
    """Blobs in Azure Storage containers (NOTE [ The Azure client ])."""

    options_type = AzureOptions
    options: AzureOptions

    def source(self, path: str) -> AzureSource:
        """Return the blob at the URL ``path`` (its ETag fixed at the first answer)."""
        return AzureSource(path, self.options)

    def _call(self, path: str, what: str, call: Any) -> Any:
        source = self.source(path)
        return source.with_retries(what, lambda: call(source.blob()))

    def objects(self, prefix: str) -> list[ObjectInfo]:
        """Return the blobs under the URL ``prefix``, sorted (one listing request a page)."""
        container, key = _container_key(prefix)
        source = self.source(prefix)

        def listing() -> list[ObjectInfo]:
            client = per_process(make_client, self.options).get_container_client(container)
            url = f"{prefix.partition('://')[0]}://{container}/"
            found = client.list_blobs(name_starts_with=key)
            return [ObjectInfo(url + b.name, int(b.size), str(b.etag)) for b in found]

        return sorted(source.with_retries("the listing", listing), key=lambda o: o.url)

    def put(self, path: str, data: bytes) -> None:
        """Write the small blob ``path`` (one PUT: whole or not at all)."""
        self._call(
            path, "the upload", lambda b: b.upload_blob(data, overwrite=True, validate_content=True)
        )

    def publish(self, local: Path, path: str, *, if_absent: bool) -> ObjectInfo:
        """Upload the finished file ``local`` under ``path`` (``If-None-Match: *``: if absent).

        Raises:
            TargetExistsError: ``if_absent`` and a blob is there.
            RemoteError: the upload failed; nothing is left under ``path``.
        """
        from azure.core.exceptions import ResourceExistsError

        size = local.stat().st_size

        def upload(blob: Any) -> Any:
            with open(local, "rb") as file:
                try:
                    return blob.upload_blob(
                        file,
                        length=size,
                        overwrite=not if_absent,
                        validate_content=True,
                        max_concurrency=8,
                    )
                except ResourceExistsError:
                    raise TargetExistsError(f"{path} appeared meanwhile; not replaced") from None

        answer = self._call(path, f"the upload of {size} bytes", upload)
        return ObjectInfo(path, size, str(answer.get("etag", "")))

    def delete(self, path: str) -> None:
        """Delete ``path`` (no error when it is gone)."""
        with contextlib.suppress(PackNotFoundError):
            self._call(path, "its removal", lambda b: b.delete_blob())
