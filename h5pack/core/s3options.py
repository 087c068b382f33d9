"""How h5pack reaches a bucket: ``S3Options``, the environment, and botocore's clients.

Import these from ``core.s3`` (NOTE [ The S3 client ] is there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

from h5pack.core import s3http
from h5pack.core.http import Connections, connections
from h5pack.core.ranged import RemoteOptions, per_process
from h5pack.core.secrets import masked_repr
from h5pack.core.store import missing_extra
from h5pack.errors import OptionsError, RemoteError


@dataclass(frozen=True, kw_only=True)
class S3Options(RemoteOptions):
    """How to reach a bucket, from the user's settings or the environment (``AWS_*``).

    ``repr`` and ``str`` show no credential (NOTE [ No secret in any message ]).

    Attributes:
        endpoint: An S3-compatible server (``http://127.0.0.1:9000``); None: AWS.
        region: The bucket's region (None: the profile's, else us-east-1).
        access_key_id: Credentials (None: the profile's or the AWS default chain's).
        secret_access_key: Its secret.
        session_token: A temporary credential's token.
        profile: A profile of ``~/.aws/config`` / ``~/.aws/credentials``.
        ranged_gets: ``"lean"``: the chunks' ranged GETs are signed and sent by h5pack and
            read straight into their buffers (NOTE [ The lean ranged GET ]); ``"botocore"``:
            through botocore's ``get_object``, as every other request (for comparison).
    """

    # other spellings (fsspec's and boto3's names)
    ALIASES: ClassVar[Mapping[str, str]] = {
        **RemoteOptions.ALIASES,
        "endpoint_url": "endpoint",
        "key": "access_key_id",
        "aws_access_key_id": "access_key_id",
        "secret": "secret_access_key",
        "aws_secret_access_key": "secret_access_key",
        "token": "session_token",
        "aws_session_token": "session_token",
        "region_name": "region",
        "profile_name": "profile",
    }
    # what the AWS CLI and boto3 read (AWS_REGION after AWS_DEFAULT_REGION: it wins)
    ENVIRONMENT: ClassVar[Mapping[str, str]] = {
        "AWS_ENDPOINT_URL": "endpoint",
        "AWS_ACCESS_KEY_ID": "access_key_id",
        "AWS_SECRET_ACCESS_KEY": "secret_access_key",
        "AWS_SESSION_TOKEN": "session_token",
        "AWS_DEFAULT_REGION": "region",
        "AWS_REGION": "region",
        "AWS_PROFILE": "profile",
        "AWS_MAX_ATTEMPTS": "max_attempts",
    }

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    profile: str | None = None
    ranged_gets: Literal["lean", "botocore"] = "lean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ranged_gets not in ("lean", "botocore"):
            raise OptionsError(
                "ranged_gets should be 'lean' or 'botocore', but got "
                f"ranged_gets={self.ranged_gets!r}"
            )

    def __repr__(self) -> str:
        return masked_repr(self)


def boto_modules() -> Any:
    """Return boto3, botocore.config and botocore.exceptions (the ``s3`` extra)."""
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError as err:
        raise missing_extra("s3", err) from err
    return boto3, botocore.config, botocore.exceptions


def make_client(options: S3Options) -> tuple[Any, Any]:
    """Return a botocore S3 client of ``options`` (no retries of its own) and its credentials.

    Made once per process (``ranged.per_process``). The credentials are the options' keys,
    else the session's chain (profiles, SSO, roles: maybe refreshable) the client signs with.
    """
    boto3, config, errors = boto_modules()
    try:
        session = boto3.session.Session(profile_name=options.profile)
    except errors.ProfileNotFound as err:
        raise RemoteError(
            f"{err}: check AWS_PROFILE (or the storage option profile) against the profiles "
            "of ~/.aws/config and ~/.aws/credentials"
        ) from None
    settings = config.Config(
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.read_timeout_s,
        retries={"total_max_attempts": 1},
        max_pool_connections=max(10, options.max_in_flight),
        s3={"addressing_style": "path"} if options.endpoint else None,
        # A ranged GET has no whole-object checksum to check; rclone sends the one stored
        # with an upload's checksum anyway and botocore would refuse every range of it.
        response_checksum_validation="when_required",
    )
    client = session.client(
        "s3",
        endpoint_url=options.endpoint,
        region_name=options.region or session.region_name or "us-east-1",
        aws_access_key_id=options.access_key_id,
        aws_secret_access_key=options.secret_access_key,
        aws_session_token=options.session_token,
        config=settings,
    )
    return client, given_credentials(options) or session.get_credentials()


def given_credentials(options: S3Options) -> Any:
    """Return botocore credentials of the options' keys (None: none given)."""
    if not (options.access_key_id and options.secret_access_key):
        return None
    from botocore.credentials import Credentials

    return Credentials(options.access_key_id, options.secret_access_key, options.session_token)


class LeanGet(NamedTuple):
    """One object's lean ranged GET in this process (NOTE [ The lean ranged GET ])."""

    target: s3http.Target
    signer: s3http.Signer
    pool: Connections


# Where each object's GETs go (scheme, host, path, region: data, the same in every process):
# kept across fork, so a forked DataLoader worker given explicit keys never builds a botocore
# client to read its chunks.
_TARGETS: dict[tuple[S3Options, str, str], s3http.Target] = {}


def lean_get(options: S3Options, bucket: str, key: str) -> LeanGet | None:
    """Return the lean GET of ``bucket/key``, or None where a proxy would carry it.

    Raises:
        botocore.exceptions.NoCredentialsError: no credentials (``with_retries`` says so).
    """
    _, _, errors = boto_modules()
    target = _TARGETS.get((options, bucket, key))
    if target is None:
        client = per_process(make_client, options)[0]
        target = _TARGETS[(options, bucket, key)] = s3http.target_of(client, bucket, key)
    if s3http.uses_proxy(target):
        return None
    credentials = given_credentials(options) or per_process(make_client, options)[1]
    if credentials is None:
        raise errors.NoCredentialsError()

    def frozen() -> tuple[str, str, str | None]:
        now = credentials.get_frozen_credentials()  # refreshed by botocore when due
        return str(now.access_key), str(now.secret_key), now.token

    cafile = None
    if target.scheme == "https":
        from botocore.httpsession import get_cert_path

        cafile = get_cert_path(True)
    timeouts = (options.connect_timeout_s, options.read_timeout_s)
    pool = per_process(connections, (target.scheme, target.netloc, *timeouts, cafile))
    return LeanGet(target, s3http.Signer(frozen), pool)
