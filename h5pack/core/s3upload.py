"""Uploads into a bucket: part sizes, checked bodies, and the multipart upload of a pack."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h5pack.core.ranged import Retry
from h5pack.core.s3source import UploadVanishedError

if TYPE_CHECKING:
    from h5pack.core.s3 import S3Store

logger = logging.getLogger("h5pack")

MIB = 2**20
# S3 allows 10,000 parts of 5 MiB to 5 GiB; 16 MiB parts reach 160 GB with few requests,
# ``UPLOAD_CONCURRENCY`` of them in memory at once.
PART_BYTES = 16 * MIB
MAX_PARTS = 10_000
UPLOAD_CONCURRENCY = 8


def part_bytes(size: int) -> int:
    """Return the part size of a multipart upload of ``size`` bytes (a whole number of MiB).

    Example:
        >>> part_bytes(10 * 2**20) // 2**20, part_bytes(400 * 2**30) // 2**20
        (16, 41)
    """
    needed = -(-size // MAX_PARTS)
    return PART_BYTES if needed <= PART_BYTES else -(-needed // MIB) * MIB


def digest(data: bytes | memoryview) -> tuple[str, str]:
    """Return the MD5 of ``data`` in hex (an ETag's) and in base64 (a Content-MD5 header's).

    Example:
        >>> digest(b"abc")
        ('900150983cd24fb0d6963f7d28e17f72', 'kAFQmDzST7DWlj99KOF/cg==')
    """
    md5 = hashlib.md5(data, usedforsecurity=False)
    return md5.hexdigest(), base64.b64encode(md5.digest()).decode()


def stored_other_bytes(answer: Mapping[str, Any], md5: str, parts: int = 0) -> str | None:
    """Return why an upload's ``answer`` says other bytes were stored than sent, else None.

    NOTE [ Checked uploads ]: every PUT (and part) carries ``Content-MD5``, which the
    server checks (AWS, MinIO, rclone...: ``BadDigest``, retried); the answer's ETag is
    then compared with the bytes' MD5 (``md5-N``, the MD5 of the parts' MD5s, for a
    multipart upload of ``parts``). Where an ETag is not an MD5 (SSE-KMS, SSE-C, or one
    of another shape) it is not compared: the server's check stands alone.
    """
    encryption = str(answer.get("ServerSideEncryption", ""))
    if answer.get("SSECustomerAlgorithm") or encryption.startswith("aws:kms"):
        return None
    etag = str(answer.get("ETag", "")).strip('"')
    expected = f"{md5}-{parts}" if parts else md5
    if not re.fullmatch(r"[0-9a-f]{32}(-\d+)?", etag) or etag == expected:
        return None
    return f"the server stored other bytes than were sent (ETag {etag}, their MD5 {expected})"


@dataclass(frozen=True)
class PendingUpload:
    """An incomplete multipart upload: the object it would complete into, its upload id."""

    url: str
    upload_id: str


# How many times a multipart upload the server dropped is started again (rclone serve s3
# drops one when it refuses a damaged part; S3 keeps it and the part is sent again).
RESTARTS = 3


def upload_in_parts(
    store: S3Store, local: Path, path: str, *, part: int, if_absent: bool
) -> dict[str, Any]:
    """Upload ``local`` under ``path`` in parts of ``part`` bytes; return the completion's answer.

    ``UPLOAD_CONCURRENCY`` parts are in flight, each checked (NOTE [ Checked uploads ]) and
    retried; an upload the server dropped (NoSuchUpload) is started again, up to
    ``RESTARTS`` times; any error (Ctrl-C, SIGTERM too) aborts it before it is raised again.
    """
    for _ in range(RESTARTS - 1):
        try:
            return _upload_once(store, local, path, part=part, if_absent=if_absent)
        except UploadVanishedError as err:
            logger.warning("%s; uploading %s again from its first part", err, path)
    return _upload_once(store, local, path, part=part, if_absent=if_absent)


def _upload_once(
    store: S3Store, local: Path, path: str, *, part: int, if_absent: bool
) -> dict[str, Any]:
    created = store.call(path, "the start of a multipart upload", "create_multipart_upload")
    upload = PendingUpload(path, str(created["UploadId"]))
    size = local.stat().st_size
    count = -(-size // part)
    md5s = [""] * count
    pool = ThreadPoolExecutor(UPLOAD_CONCURRENCY, thread_name_prefix="h5pack-upload")
    try:
        with open(local, "rb", buffering=0) as file:

            def send(number: int) -> dict[str, Any]:
                start = (number - 1) * part
                data = os.pread(file.fileno(), min(part, size - start), start)
                what = f"part {number} of {count} (bytes {start}..{start + len(data) - 1})"
                md5s[number - 1], sent = digest(data)

                def check(answer: Any) -> None:
                    if why := stored_other_bytes(answer, md5s[number - 1]):
                        raise Retry(why)

                answer = store.call(
                    path,
                    what,
                    "upload_part",
                    check=check,
                    UploadId=upload.upload_id,
                    PartNumber=number,
                    Body=data,
                    ContentMD5=sent,
                )
                return {"ETag": answer["ETag"], "PartNumber": number}

            parts = list(pool.map(send, range(1, count + 1)))
        whole, _ = digest(b"".join(bytes.fromhex(md5) for md5 in md5s))
        answer: dict[str, Any] = store.put_final(
            path,
            "the completion of the multipart upload",
            "complete_multipart_upload",
            if_absent=if_absent,
            parts=count,
            md5=whole,
            UploadId=upload.upload_id,
            MultipartUpload={"Parts": parts},
        )
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        store.abort(upload)
        raise
    pool.shutdown()
    return answer
