"""Credentials never shown: masked reprs, redacted options, scrubbed messages.

NOTE [ No secret in any message ]

Keys, tokens, signatures and presigned query strings must not reach a repr, a log line or
an error (issue 28 item 6): a traceback pasted into an issue or a CI log is public. An
options class holding credentials masks them (``masked_repr``, or ``repr=False`` fields), a
mapping of settings is shown through ``redacted``, and any text from outside (a server's
error, a transport error) passes ``scrub`` before it goes into a message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

MASK = "***"
# storage options that hold a secret (h5pack's, boto3's, fsspec's, gcsfs's, adlfs's names)
SECRET_OPTIONS = frozenset(
    {
        "access_key_id",
        "secret_access_key",
        "session_token",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "key",
        "secret",
        "token",
        "account_key",
        "sas_token",
        "connection_string",
        "credential",
        "credentials",
        "client_secret",
        "password",
    }
)
# A signature, credential or token in a header or a presigned URL's query, with its value
# (``X-Amz-Signature=``, ``Credential=`` of an Authorization header, Azure's ``sig=``...).
_SIGNED = re.compile(
    r"(?i)((?:signature|credential|security-token|sig|token|AccountKey|SharedAccessSignature)=)"
    r"[^\s&,;\"'<>)]+"
)
# A header that carries one, as a server or a proxy may echo it: masked to the line's end.
_HEADER = re.compile(
    r"(?i)((?:authorization|x-amz-security-token|x-ms-[a-z-]*key)\s*:\s*)[^\r\n<]+"
)


def redacted(settings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Return ``settings`` with the values of secret ones masked.

    Example:
        >>> redacted({"endpoint": "http://h:1", "secret_access_key": "s3cr3t"})
        {'endpoint': 'http://h:1', 'secret_access_key': '***'}
    """
    if settings is None:
        return None
    return {
        key: MASK if key.lower() in SECRET_OPTIONS and value else value
        for key, value in settings.items()
    }


def scrub(text: str) -> str:
    """Return ``text`` with signatures, credentials and presigned query values masked.

    Example:
        >>> scrub("GET /b/k?X-Amz-Credential=AKIA1%2F2&X-Amz-Signature=ab12 refused")
        'GET /b/k?X-Amz-Credential=***&X-Amz-Signature=*** refused'
        >>> scrub("headers: X-Amz-Security-Token: Fw0g.. ")
        'headers: X-Amz-Security-Token: ***'
    """
    text = _HEADER.sub(lambda match: match.group(1) + MASK, text)
    return _SIGNED.sub(lambda match: match.group(1) + MASK, text)


def masked_repr(options: Any) -> str:
    """Return the repr of the dataclass ``options`` with its secret fields masked."""
    assert is_dataclass(options)
    shown = []
    for item in fields(options):
        if item.repr:
            value = getattr(options, item.name)
            if item.name in SECRET_OPTIONS and value:
                value = MASK
            shown.append(f"{item.name}={value!r}")
    return f"{type(options).__name__}({', '.join(shown)})"
