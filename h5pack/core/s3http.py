"""The hot path's ranged GET: signed here (SigV4), sent with ``http.client``, read in place.

NOTE [ The lean ranged GET ]

botocore's ``get_object`` spends most of a chunk's GET in its own machinery, so the
chunks' ranged GETs are issued here (docs/decisions/0017-s3-client-lean-get.md):

- botocore still gives the credentials (refreshable ones are frozen at every request), the
  object's URL and signing region (``target_of``), and makes every other request;
- ``Signer``: SigV4 in headers, the day's signing key kept per (secret, day, region);
- ``http.Connections`` per process, HTTPS verified against botocore's CA bundle; an
  endpoint behind an ``HTTP(S)_PROXY`` keeps botocore's path;
- ``get_into``: ``http.read_range``, as the HTTP store's chunks: the body read straight into
  the caller's buffer, its length and Content-Range checked. Error answers become botocore's
  ``ClientError`` (one mapping in ``S3Source``); resets, timeouts and short bodies are
  ``OSError`` (retried by the caller).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from h5pack.core.http import Answer, byte_range, read_range
from h5pack.core.http import Connections as Connections

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UTC = datetime.timezone.utc  # not datetime.UTC: Python 3.11+, and 3.10 is supported


@dataclass(frozen=True)
class Target:
    """Where one object's GETs go, as botocore would send them."""

    scheme: str  # http or https
    netloc: str  # host[:port], also the signed Host header
    path: str  # URL-encoded (with the bucket in path style)
    region: str  # the signature's scope


def target_of(client: Any, bucket: str, key: str) -> Target:
    """Return where ``client`` sends the GETs of ``bucket/key`` (one presigned URL, no request)."""
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

    ``credentials`` returns ``(access_key, secret_key, token)`` now (botocore's
    ``get_frozen_credentials``, which refreshes temporary ones); ``clock``: for tests.
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

    ``start`` None asks for the last ``len(buffer)`` bytes; ``etag`` goes as ``If-Match``;
    an error answer raises botocore's ``ClientError`` (see ``http.read_range``).
    """
    extra = {"range": byte_range(start, len(buffer))}
    if etag:
        extra["if-match"] = etag
    headers = signer.headers("GET", target, extra)
    return read_range(buffer, start, pool, target.path, headers, _client_error)


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
