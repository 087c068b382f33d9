"""Packs in S3-compatible buckets: ``S3Store``; ``S3Options`` and ``S3Source`` import from here.

NOTE [ The S3 client ]

The client is botocore (the ``s3`` extra; docs/decisions/0017-s3-client-lean-get.md says
why, and why not obstore: its runtime does not survive ``fork``), made once per process and
options, reading what the AWS CLI reads (profiles, SSO, roles), with no retries of its own:
every request goes through ``S3Source.with_retries`` (NOTE [ Ranged sources ]). The chunks'
ranged GETs go through ``core.s3http`` (NOTE [ The lean ranged GET ]). Every GET after the
first carries ``If-Match`` with the ETag seen at open, and each answer's ETag and size are
checked (servers that ignore If-Match are caught too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from h5pack.core.ranged import Retry
from h5pack.core.s3options import S3Options as S3Options
from h5pack.core.s3options import make_client as make_client
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
    """Objects in S3-compatible buckets (NOTE [ The S3 client ]); ``sleep``, ``clock``: tests'."""

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
        self._conditional = True  # the server may implement If-None-Match

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

        ``check(answer)`` may raise ``Retry``: the request is then tried again.
        """
        source = self.source(url)
        _, bucket, key = split_url(url)

        def attempt() -> Any:
            answer = getattr(source.client(), name)(Bucket=bucket, Key=key, **arguments)
            if check is not None:
                check(answer)
            return answer

        return source.with_retries(what, attempt)

    def _pages(self, prefix_url: str, what: str, name: str) -> list[Any]:
        """Return every page of the listing ``name`` under ``prefix_url`` (retried whole)."""
        source = self.source(prefix_url)
        _, bucket, key = split_url(prefix_url)

        def listing() -> list[Any]:
            pages = source.client().get_paginator(name).paginate(Bucket=bucket, Prefix=key)
            return list(pages)

        found: list[Any] = source.with_retries(what, listing)
        return found

    def objects(self, prefix: str) -> list[ObjectInfo]:
        """Return the objects under the URL ``prefix``, sorted (one ListObjectsV2 a page)."""
        scheme, bucket, _ = split_url(prefix)
        found = [
            ObjectInfo(f"{scheme}://{bucket}/{o['Key']}", int(o["Size"]), str(o["ETag"]))
            for page in self._pages(prefix, "the listing (ListObjectsV2)", "list_objects_v2")
            for o in page.get("Contents", ())
        ]
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
        (AWS S3, MinIO...) refuses atomically to replace an object that appeared since the
        HEAD that checked the key. One that answers 501 is asked again without it (and not
        asked with it again); one that ignores it (rclone serve s3) has that HEAD as guard.

        Raises:
            TargetExistsError: the server refused: an object exists under ``url``.
        """
        if "Body" in arguments:
            md5, arguments["ContentMD5"] = digest(arguments["Body"])

        def check(answer: Any) -> None:
            if why := stored_other_bytes(answer, md5, parts):
                self.delete(url)
                if not parts:
                    raise Retry(why)
                raise RemoteError(f"{url}: {what}: {why}; the object was deleted")

        if if_absent and self._conditional:
            try:
                return self.call(url, what, name, check=check, IfNoneMatch="*", **arguments)
            except SourceChangedError:  # 412 Precondition Failed: the key is taken
                raise TargetExistsError(
                    f"{url} appeared during the conversion; not replaced"
                ) from None
            except UnsupportedRequestError:
                self._conditional = False
        return self.call(url, what, name, check=check, **arguments)

    def publish(
        self, local: Path, path: str, *, if_absent: bool, part_size: int | None = None
    ) -> ObjectInfo:
        """Upload the finished file ``local`` under ``path`` (NOTE [ Publishing in a bucket ]).

        A file of at most one part is one PUT, a larger one a multipart upload; each PUT
        is checked (NOTE [ Checked uploads ]).

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
        else:
            answer = upload_in_parts(self, local, path, part=part, if_absent=if_absent)
        return ObjectInfo(path, size, str(answer.get("ETag", "")))

    def pending(self, prefix_url: str) -> list[PendingUpload]:
        """Return the incomplete multipart uploads whose URL starts with ``prefix_url``."""
        scheme, bucket, prefix = split_url(prefix_url)
        what = f"the incomplete uploads under {prefix!r}"
        try:
            pages = self._pages(prefix_url, what, "list_multipart_uploads")
        except PackNotFoundError as err:
            # rclone serve s3 answers 404 NoSuchUpload for a bucket that never had an
            # upload (S3 answers an empty list): none
            if "no bucket" in str(err):
                raise
            return []
        return [
            PendingUpload(f"{scheme}://{bucket}/{item['Key']}", str(item["UploadId"]))
            for page in pages
            for item in page.get("Uploads", ())
        ]

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

        A sweep that fails is logged (the parts stay until a later run, or the bucket's
        lifecycle rule, removes them); a missing bucket raises ``PackNotFoundError``.
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
