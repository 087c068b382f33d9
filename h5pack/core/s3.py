"""Packs in S3-compatible buckets: ``S3Store``; ``S3Options`` and ``S3Source`` import from here.

NOTE [ The S3 client ]

The client is botocore (the ``s3`` extra; docs/decisions/0017-s3-client-lean-get.md says
why, and why not obstore: its runtime does not survive ``fork``). Clients are made once per
process and options (keyed on the pid), read what the AWS CLI reads (profiles, SSO, roles),
and leave retries to ``S3Source.with_retries``: timeouts, resets, 5xx and SlowDown are
tried again until ``retry_timeout_s`` (NOTE [ Retries by time ]), then one ``RemoteError``
names the URL, the bytes, the attempts and the cause. The chunks' ranged GETs go through
``core.s3http`` (NOTE [ The lean ranged GET ]).

Trust: every GET after the first carries ``If-Match`` with the ETag seen at open, and each
answer's ETag and total size are checked (servers that ignore If-Match are caught too); a
body shorter than its range is never returned. The settings come from the environment
(``AWS_*``, ``S3Options.ENVIRONMENT``), overridden by the user's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from h5pack.core.s3options import S3Options as S3Options
from h5pack.core.s3options import make_client as make_client
from h5pack.core.s3source import RetryableAnswer
from h5pack.core.s3source import S3Source as S3Source
from h5pack.core.s3upload import (
    PendingUpload,
    digest,
    part_bytes,
    stored_other_bytes,
    upload_in_parts,
)
from h5pack.core.source import SourceChangedError
from h5pack.core.store import ObjectInfo, Store, split_url
from h5pack.errors import (
    H5PackError,
    PackNotFoundError,
    RemoteError,
    TargetExistsError,
    UnsupportedRequestError,
)

logger = logging.getLogger("h5pack")


class S3Store(Store):
    """Objects in S3-compatible buckets, reached with ``options`` (NOTE [ The S3 client ]).

    Every request goes through ``S3Source.with_retries`` (retries by time, one-line errors
    naming the URL). NOTE [ Publishing in a bucket ] (``write/upload.py``) says why an
    upload is the atomic publish of a pack.

    Args:
        options: How to reach the buckets.
        sleep: The wait between tries (injected by tests).
        clock: Seconds, monotonic: the retries' deadline (injected by tests with ``sleep``).
    """

    options_type = S3Options
    options: S3Options

    def __init__(
        self,
        options: S3Options,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(options)
        self._sleep, self._clock = sleep, clock
        # whether the server may implement If-None-Match (NOTE [ Conditional final PUT ])
        self._conditional = True

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["options"])

    def source(self, path: str) -> S3Source:
        """Return the object at the URL ``path``; its first answer fixes its size and ETag."""
        return S3Source(path, self.options, sleep=self._sleep, clock=self._clock)

    def call(
        self,
        url: str,
        what: str,
        name: str,
        *,
        check: Callable[[Any], None] | None = None,
        **arguments: Any,
    ) -> Any:
        """Return the client's ``name(Bucket=..., Key=..., **arguments)``, with the retries.

        ``check(answer)`` may raise ``RetryableAnswer``: the request is then tried again.

        Raises:
            PackNotFoundError: no such object (or bucket).
            RemoteError: denied, or failed after the retries (naming the URL and the cause).
        """
        source = self.source(url)
        _, bucket, key = split_url(url)
        method = getattr(source.client(), name)

        def attempt() -> Any:
            answer = method(Bucket=bucket, Key=key, **arguments)
            if check is not None:
                check(answer)
            return answer

        return source.with_retries(what, attempt)

    def stat(self, path: str) -> ObjectInfo | None:
        """Return the object at ``path`` (one HEAD), or None when there is none."""
        try:
            answer = self.call(path, "its size (HEAD)", "head_object")
        except PackNotFoundError as err:
            if "no bucket" in str(err):
                raise
            return None
        return ObjectInfo(path, int(answer["ContentLength"]), str(answer["ETag"]))

    def objects(self, prefix: str) -> list[ObjectInfo]:
        """Return the objects under the URL ``prefix``, sorted (one ListObjectsV2 a page)."""
        source = self.source(prefix)
        scheme, bucket, key = split_url(prefix)
        found: list[ObjectInfo] = []
        token = ""
        while True:
            more = {"ContinuationToken": token} if token else {}

            def listing(more: dict[str, str] = more) -> Any:
                return source.client().list_objects_v2(Bucket=bucket, Prefix=key, **more)

            page = source.with_retries("the listing (ListObjectsV2)", listing)
            found.extend(
                ObjectInfo(f"{scheme}://{bucket}/{o['Key']}", int(o["Size"]), str(o["ETag"]))
                for o in page.get("Contents", ())
            )
            token = page.get("NextContinuationToken", "")
            if not page.get("IsTruncated") or not token:
                break
        return sorted(found, key=lambda o: o.url)

    def put(self, path: str, data: bytes) -> None:
        """Write the small object ``path`` (one checked PUT: it appears whole or not at all)."""
        self.put_final(path, "the upload (PUT)", "put_object", if_absent=False, Body=data)

    def delete(self, path: str) -> None:
        """Delete ``path`` (no error when it is gone)."""
        with contextlib.suppress(PackNotFoundError):
            self.call(path, "its removal (DELETE)", "delete_object")

    def put_final(
        self,
        url: str,
        what: str,
        name: str,
        *,
        if_absent: bool,
        parts: int = 0,
        md5: str = "",
        **arguments: Any,
    ) -> Any:
        """Return the request that makes ``url`` appear, conditional when ``if_absent``.

        Checked (NOTE [ Checked uploads ]): a ``Body`` goes with its ``Content-MD5``; an
        answer whose ETag is not the bytes' MD5 (``md5`` of ``parts``, for a completion)
        is refused: the object is deleted, and a PUT tried again, a completion not.

        NOTE [ Conditional final PUT ]: with ``if_absent``, the PUT (or the multipart
        upload's completion) carries ``If-None-Match: *``, so a server that implements it
        (AWS S3, MinIO...) refuses atomically to replace an object that appeared under the
        key since the HEAD that checked it. A server that answers 501 NotImplemented is
        asked again without the header (and not asked with it again); one that ignores the
        header (rclone serve s3) cannot be told apart: the HEAD just before is the guard.

        Raises:
            TargetExistsError: the server refused: an object exists under ``url``.
        """
        if "Body" in arguments:
            md5, arguments["ContentMD5"] = digest(arguments["Body"])

        def check(answer: Any) -> None:
            if why := stored_other_bytes(answer, md5, parts):
                self.delete(url)
                if not parts:
                    raise RetryableAnswer(why)
                raise RemoteError(f"{url}: {what}: {why}; the object was deleted")

        arguments["check"] = check
        if if_absent and self._conditional:
            try:
                return self.call(url, what, name, IfNoneMatch="*", **arguments)
            except SourceChangedError:  # 412 Precondition Failed: the key is taken
                raise TargetExistsError(
                    f"{url} appeared during the conversion; not replaced"
                ) from None
            except UnsupportedRequestError:
                self._conditional = False
        return self.call(url, what, name, **arguments)

    def publish(
        self, local: Path, path: str, *, if_absent: bool, part_size: int | None = None
    ) -> ObjectInfo:
        """Upload the finished file ``local`` under ``path`` (NOTE [ Publishing in a bucket ]).

        A file of at most one part is one PUT; a larger one a multipart upload
        (``core.s3upload.upload_in_parts``). Every PUT is checked (NOTE [ Checked uploads ]).

        Raises:
            TargetExistsError: ``if_absent`` and the server refused: an object exists.
            RemoteError: the upload failed; nothing is left under ``path``.
        """
        size = local.stat().st_size
        part = part_size or part_bytes(size)
        if size <= part:
            what = f"the upload of {size} bytes (PUT)"
            answer = self.put_final(
                path, what, "put_object", if_absent=if_absent, Body=local.read_bytes()
            )
            return ObjectInfo(path, size, str(answer.get("ETag", "")))
        answer = upload_in_parts(self, local, path, part=part, if_absent=if_absent)
        return ObjectInfo(path, size, str(answer.get("ETag", "")))

    def pending(self, prefix_url: str) -> list[PendingUpload]:
        """Return the incomplete multipart uploads whose URL starts with ``prefix_url``.

        Raises:
            RemoteError: the listing failed.
        """
        scheme, bucket, prefix = split_url(prefix_url)
        source = self.source(prefix_url)
        found: list[PendingUpload] = []
        markers: dict[str, str] = {}
        while True:
            try:
                page = source.with_retries(
                    f"the incomplete uploads under {prefix!r}",
                    lambda: source.client().list_multipart_uploads(
                        Bucket=bucket,
                        Prefix=prefix,
                        **markers,  # noqa: B023  (called at once)
                    ),
                )
            except PackNotFoundError as err:
                # rclone serve s3 answers 404 NoSuchUpload for a bucket that never had an
                # upload (S3 answers an empty list): none
                if "no bucket" in str(err):
                    raise
                return found
            found += [
                PendingUpload(f"{scheme}://{bucket}/{item['Key']}", str(item["UploadId"]))
                for item in page.get("Uploads", [])
            ]
            if not page.get("IsTruncated"):
                return found
            markers = {
                "KeyMarker": str(page.get("NextKeyMarker", "")),
                "UploadIdMarker": str(page.get("NextUploadIdMarker", "")),
            }

    def abort(self, upload: PendingUpload) -> None:
        """Abort ``upload`` (its parts are deleted). Never raises: a failure is logged."""
        try:
            what = "the abort of an incomplete upload"
            self.call(upload.url, what, "abort_multipart_upload", UploadId=upload.upload_id)
        except PackNotFoundError:
            return  # aborted or completed meanwhile
        except H5PackError as err:
            logger.warning(
                "could not abort the upload %s of %s: %s", upload.upload_id, upload.url, err
            )

    def sweep(self, paths: Sequence[str]) -> list[str]:
        """Abort the incomplete multipart uploads under ``paths``; return their URLs.

        NOTE [ Publishing in a bucket ]. A sweep that fails is logged (the parts stay until
        a later run, or the bucket's lifecycle rule, removes them).

        Raises:
            PackNotFoundError: the bucket does not exist.
        """
        if not paths:
            return []
        wanted = set(paths)
        # a prefix of the keys' text, as S3 compares keys (not of path components)
        prefix = os.path.commonprefix(sorted(wanted))  # noqa: RUF071
        try:
            pending = [u for u in self.pending(prefix) if u.url in wanted]
        except PackNotFoundError:
            raise  # no such bucket: said before anything is converted
        except H5PackError as err:
            logger.warning("could not list the incomplete uploads under %s: %s", prefix, err)
            return []
        for upload in pending:
            self.abort(upload)
        return [u.url for u in pending]
