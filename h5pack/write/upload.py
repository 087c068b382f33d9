"""Packs published in a bucket: staged locally, uploaded whole under their final key.

A conversion (or merge) into ``s3://bucket/key.h5`` writes the pack exactly as it writes a
local one, into a staging directory on local disk (``Staging``), then uploads the finished
file under its final key (``Bucket.upload``); a pack set's manifest goes up last.

NOTE [ Publishing in a bucket ]: S3 has no rename, but it has the same guarantee in
another form: an object appears under its key only when its upload completes, a single PUT
as a whole and a multipart upload on CompleteMultipartUpload. So a killed conversion never
leaves part of a pack under the final key: either the local file was not finished (nothing
was sent), or the upload was cut (no object). What a killed multipart upload does leave is
its parts, stored (and billed) in the bucket until the upload is aborted, and listed by no
ordinary listing. The client aborts the upload on any error, Ctrl-C and SIGTERM included;
a SIGKILL runs nothing, so every run first lists the incomplete multipart uploads under
the keys it is about to write and aborts them (``sweep_uploads``), as a local conversion
removes the temporary files a killed one left beside its target (``write/leftovers.py``).
Keys are the owners here: a bucket has no locks, and an upload in progress under a key
that this run writes is another run's conversion into the same target, which cannot both
win. A lifecycle rule (``AbortIncompleteMultipartUpload``) is still worth setting on the
bucket for uploads no run comes back to (docs/object-storage.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from h5pack._types import StrPath
from h5pack.core.source import SourceChangedError, is_url, split_url
from h5pack.errors import (
    H5PackError,
    OptionsError,
    PackNotFoundError,
    TargetExistsError,
    UnsupportedRequestError,
)
from h5pack.write.publish import check_room, free_bytes

__all__ = [
    "PART_BYTES",
    "Bucket",
    "PendingUpload",
    "RemoteObject",
    "Staging",
    "is_url",
    "part_bytes",
    "remove_dead_staging",
]

logger = logging.getLogger("h5pack")

MIB = 2**20

# Bytes of one part of a multipart upload (each part is one PUT request; a file of at most
# one part is one PUT). S3 allows at most 10,000 parts of 5 MiB to 5 GiB; 16 MiB parts
# reach 160 GB with few requests, and at most ``UPLOAD_CONCURRENCY`` of them are in memory
# at once. (The tests use smaller parts: the local server accepts them.)
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


@dataclass(frozen=True)
class PendingUpload:
    """An incomplete multipart upload in a bucket (what ``ListMultipartUploads`` returns).

    Attributes:
        key: The object key it would complete into.
        upload_id: Its upload id.
        initiated: When it was started, as the server said (ISO 8601).
    """

    key: str
    upload_id: str
    initiated: str


# -- the local staging directory --------------------------------------------------------

# Staging directories are named ``h5pack-staging-<pid>-<random>`` and hold ``.lock``, which
# their run locks (flock) for as long as it lives: a directory whose lock can be taken is a
# dead run's (NOTE [ Telling a dead owner ] in write/leftovers.py).
_STAGING_PREFIX = "h5pack-staging-"
_LOCK_NAME = ".lock"


class Staging:
    """A private local directory where packs bound for a bucket are written, then uploaded.

    A context manager: it creates ``h5pack-staging-<pid>-<random>`` under ``root`` (default:
    the system's temporary directory, ``TMPDIR``), locks it, first removes what dead runs
    left there (``remove_dead_staging``), and removes itself with everything in it on exit.

    Args:
        root: Where to create the directory.
        what: What the staged files are for (said in errors), e.g. the target URL.

    Raises:
        OptionsError: ``root`` is not a directory.
        H5PackError: the directory cannot be created.
    """

    def __init__(self, root: StrPath | None, *, what: str) -> None:
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir())
        self.what = what
        self.path = self.root / f"{_STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.removed: list[Path] = []
        self._fd = -1

    def __enter__(self) -> Staging:
        if not self.root.is_dir():
            raise OptionsError(
                f"the staging directory {self.root} (where {self.what} is written before it "
                "is uploaded) is not a directory: give an existing one with --staging-dir"
            )
        self.removed = remove_dead_staging(self.root)
        try:
            self.path.mkdir(mode=0o700)
            self._fd = os.open(self.path / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            with contextlib.suppress(OSError):  # no locks here: only this run removes it
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            self._remove()
            raise H5PackError(
                f"cannot create a staging directory in {self.root} for {self.what}: "
                f"{err.strerror or err}; give another with --staging-dir"
            ) from err
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._remove()

    def file(self, name: str) -> Path:
        """Return where the pack ``name`` is staged."""
        return self.path / name

    def check_room(self, nbytes: int, *, what: str) -> None:
        """Refuse to go on when the staging directory has less than ``nbytes`` free.

        Raises:
            H5PackError: it has less (the message names the directory and how to change it).
        """
        try:
            check_room(self.root, nbytes, what=what)
        except H5PackError as err:
            raise H5PackError(f"{err}; {self.hint()}") from None

    def hint(self) -> str:
        """Return what to do when the staging directory is too small."""
        free = free_bytes(self.root)
        said = f" ({free / 2**30:.1f} GiB free)" if free is not None else ""
        return (
            f"{self.what} is written whole in the staging directory {self.root}{said} "
            "before it is uploaded: give a larger one with --staging-dir DIR (or TMPDIR)"
        )

    def _remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def remove_dead_staging(root: Path) -> list[Path]:
    """Remove the staging directories under ``root`` whose run is gone; return them.

    Never raises: a directory that cannot be removed is left for the next run.
    """
    try:
        names = [entry.name for entry in os.scandir(root) if entry.name.startswith(_STAGING_PREFIX)]
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        directory = root / name
        try:
            fd = os.open(directory / _LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1  # killed between mkdir and the lock: no one owns it
        except OSError:
            continue
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live run's (or no locks here: left alone)
            shutil.rmtree(directory, ignore_errors=True)
            if not directory.exists():
                removed.append(directory)
        finally:
            if fd >= 0:
                os.close(fd)
    return removed


@contextlib.contextmanager
def staged(root: StrPath | None, *, what: str) -> Iterator[Staging]:
    """Lend a ``Staging`` directory (a shorthand for ``with Staging(root, what=what)``)."""
    with Staging(root, what=what) as staging:
        yield staging


def keys_text(keys: Sequence[str], *, shown: int = 3) -> str:
    """Return a short list of keys for a message."""
    listed = ", ".join(keys[:shown])
    return listed + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


# -- the bucket -------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteObject:
    """An object in a bucket, as HEAD says.

    Attributes:
        url: Its URL.
        size: Its bytes.
        etag: Its ETag.
    """

    url: str
    size: int
    etag: str


class Bucket:
    """The write side of one bucket: HEAD, the upload of a finished file, small objects, the sweep.

    It is built on the read side's client (``core.s3.S3Source``: one botocore client per
    process, the configuration of NOTE [ The S3 client ], its retries with bounded backoff
    and its one-line errors naming the URL).

    Args:
        url: Any URL in the bucket (``s3://bucket/...``).
        storage_options: Settings the environment does not give.

    Raises:
        MissingExtraError: the ``s3`` extra is not installed.
        OptionsError: an unknown storage option.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        from h5pack.core.s3 import S3Source, resolve_options

        self.scheme, self.name, _ = split_url(url)
        if self.scheme != "s3":
            raise OptionsError(f"{url}: h5pack writes to s3:// URLs and local paths only")
        self.storage_options = dict(storage_options or {})
        self._source = S3Source(self.url(""), resolve_options(self.storage_options))
        # whether the server may implement If-None-Match (NOTE [ Conditional final PUT ])
        self._conditional = True

    def url(self, key: str) -> str:
        """Return the URL of ``key``."""
        return f"{self.scheme}://{self.name}/{key}"

    def _call(self, key: str, what: str, call: Callable[..., Any], **arguments: Any) -> Any:
        """Return ``call(Bucket=..., Key=key, **arguments)``, retried as the read side retries.

        Raises:
            PackNotFoundError: no such object (or bucket).
            RemoteError: denied, or failed after the retries (naming the URL and the cause).
        """
        source = self._source.sibling(self.url(key))
        return source.with_retries(what, lambda: call(Bucket=self.name, Key=key, **arguments))

    @property
    def client(self) -> Any:
        """This process's botocore client."""
        return self._source.client()

    def info(self, key: str) -> RemoteObject | None:
        """Return the object under ``key``, or None when there is none (one HEAD).

        Raises:
            PackNotFoundError: the bucket does not exist.
            RemoteError: the bucket cannot be reached, or refuses.
        """
        try:
            answer = self._call(key, "its size (HEAD)", self.client.head_object)
        except PackNotFoundError as err:
            if "no bucket" in str(err):
                raise
            return None
        return RemoteObject(self.url(key), int(answer["ContentLength"]), str(answer["ETag"]))

    def _put_final(
        self, key: str, what: str, call: Callable[..., Any], *, if_absent: bool, **arguments: Any
    ) -> Any:
        """Return the request that makes ``key`` appear, conditional when ``if_absent``.

        NOTE [ Conditional final PUT ]: with ``if_absent``, the PUT (or the multipart
        upload's completion) carries ``If-None-Match: *``, so a server that implements it
        (AWS S3, MinIO...) refuses atomically to replace an object that appeared under the
        key since the HEAD that checked it. A server that answers 501 NotImplemented is
        asked again without the header (and not asked with it again); one that ignores the
        header (rclone serve s3) cannot be told apart: the HEAD just before is the guard.

        Raises:
            TargetExistsError: the server refused: an object exists under ``key``.
        """
        if if_absent and self._conditional:
            try:
                return self._call(key, what, call, IfNoneMatch="*", **arguments)
            except SourceChangedError:  # 412 Precondition Failed: the key is taken
                raise TargetExistsError(
                    f"{self.url(key)} appeared during the conversion; not replaced"
                ) from None
            except UnsupportedRequestError:
                self._conditional = False
        return self._call(key, what, call, **arguments)

    def upload(
        self, path: Path, key: str, *, part_size: int | None = None, if_absent: bool = False
    ) -> RemoteObject:
        """Upload the finished file ``path`` under ``key`` (NOTE [ Publishing in a bucket ]).

        A file of at most one part is one PUT; a larger one a multipart upload of
        ``part_bytes(size)`` parts, ``UPLOAD_CONCURRENCY`` in flight, each retried; any
        error (Ctrl-C and SIGTERM too) aborts it before it is raised again. With
        ``if_absent`` the request that makes the object appear is conditional (NOTE
        [ Conditional final PUT ]).

        Raises:
            TargetExistsError: ``if_absent`` and the server refused: an object exists.
            RemoteError: the upload failed; nothing is left under ``key``.
        """
        size = path.stat().st_size
        part = part_size or part_bytes(size)
        if size <= part:
            data = path.read_bytes()
            answer = self._put_final(
                key,
                f"the upload of {size} bytes (PUT)",
                self.client.put_object,
                if_absent=if_absent,
                Body=data,
            )
            return RemoteObject(self.url(key), size, str(answer.get("ETag", "")))
        created = self._call(
            key, "the start of a multipart upload", self.client.create_multipart_upload
        )
        upload = PendingUpload(key, str(created["UploadId"]), "")
        count = -(-size // part)
        pool = ThreadPoolExecutor(UPLOAD_CONCURRENCY, thread_name_prefix="h5pack-upload")
        try:
            with open(path, "rb", buffering=0) as file:
                descriptor = file.fileno()

                def send(number: int) -> dict[str, Any]:
                    start = (number - 1) * part
                    data = os.pread(descriptor, min(part, size - start), start)
                    answer = self._call(
                        key,
                        f"part {number} of {count} (bytes {start}..{start + len(data) - 1})",
                        self.client.upload_part,
                        UploadId=upload.upload_id,
                        PartNumber=number,
                        Body=data,
                    )
                    return {"ETag": answer["ETag"], "PartNumber": number}

                parts = list(pool.map(send, range(1, count + 1)))
            answer = self._put_final(
                key,
                "the completion of the multipart upload",
                self.client.complete_multipart_upload,
                if_absent=if_absent,
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            self.abort(upload)
            raise
        pool.shutdown()
        return RemoteObject(self.url(key), size, str(answer.get("ETag", "")))

    def put_text(self, key: str, text: str) -> None:
        """Write the small object ``key`` (one PUT: it appears whole or not at all).

        Raises:
            RemoteError: the PUT failed.
        """
        data = text.encode("utf-8")
        self._call(key, "the upload (PUT)", self.client.put_object, Body=data)

    def get_text(self, key: str) -> str | None:
        """Return the small object ``key`` as text, or None when there is none.

        Raises:
            RemoteError: the GET failed.
        """
        try:
            data = self._source.sibling(self.url(key)).read_object()
        except PackNotFoundError as err:
            if "no bucket" in str(err):
                raise
            return None
        return data.decode("utf-8", errors="replace")

    def delete(self, key: str) -> None:
        """Delete ``key`` (no error when it is gone).

        Raises:
            RemoteError: the DELETE failed.
        """
        with contextlib.suppress(PackNotFoundError):
            self._call(key, "its removal (DELETE)", self.client.delete_object)

    def download(self, key: str, path: Path) -> int:
        """Copy the object ``key`` into the local file ``path`` (ranged GETs); return its size.

        Raises:
            PackNotFoundError: no such object.
            RemoteError: a GET failed after its retries.
        """
        source = self._source.sibling(self.url(key))
        size = source.size()
        step = 4 * PART_BYTES
        with open(path, "wb") as file:
            for start in range(0, size, step):
                file.write(source.read(start, min(size, start + step)))
        return size

    def pending(self, prefix: str) -> list[PendingUpload]:
        """Return the incomplete multipart uploads whose key starts with ``prefix``.

        Raises:
            RemoteError: the listing failed.
        """
        found: list[PendingUpload] = []
        markers: dict[str, str] = {}
        while True:
            try:
                page = self._source.with_retries(
                    f"the incomplete uploads under {prefix!r}",
                    lambda m=markers: self.client.list_multipart_uploads(  # type: ignore[misc]
                        Bucket=self.name, Prefix=prefix, **m
                    ),
                )
            except PackNotFoundError as err:
                # rclone serve s3 answers 404 NoSuchUpload for a bucket that never had an
                # upload (S3 answers an empty list): none
                if "no bucket" in str(err):
                    raise
                return found
            for item in page.get("Uploads", []):
                initiated = item.get("Initiated")
                found.append(
                    PendingUpload(
                        str(item["Key"]),
                        str(item["UploadId"]),
                        initiated.isoformat() if initiated is not None else "",
                    )
                )
            if not page.get("IsTruncated"):
                return found
            markers = {
                "KeyMarker": str(page.get("NextKeyMarker", "")),
                "UploadIdMarker": str(page.get("NextUploadIdMarker", "")),
            }

    def abort(self, upload: PendingUpload) -> None:
        """Abort ``upload`` (its parts are deleted). Never raises: a failure is logged."""
        try:
            self._call(
                upload.key,
                "the abort of an incomplete upload",
                self.client.abort_multipart_upload,
                UploadId=upload.upload_id,
            )
        except PackNotFoundError:
            return  # aborted or completed meanwhile
        except H5PackError as err:
            logger.warning(
                "could not abort the upload %s of %s: %s",
                upload.upload_id,
                self.url(upload.key),
                err,
            )

    def sweep(self, keys: Sequence[str]) -> list[PendingUpload]:
        """Abort the incomplete multipart uploads under ``keys``; return them.

        NOTE [ Publishing in a bucket ]. A sweep that fails is logged (the parts stay until
        a later run, or the bucket's lifecycle rule, removes them).

        Raises:
            PackNotFoundError: the bucket does not exist.
        """
        if not keys:
            return []
        wanted = set(keys)
        # a prefix of the keys' text, as S3 compares keys (not of path components)
        prefix = os.path.commonprefix(sorted(wanted))  # noqa: RUF071
        try:
            pending = [u for u in self.pending(prefix) if u.key in wanted]
        except PackNotFoundError:
            raise  # no such bucket: said before anything is converted
        except H5PackError as err:
            logger.warning(
                "could not list the incomplete uploads under %s: %s", self.url(prefix), err
            )
            return []
        for upload in pending:
            self.abort(upload)
        return pending


def describe_swept(bucket: Bucket, swept: Sequence[PendingUpload]) -> str:
    """Return the note that tells a user which killed uploads were aborted."""
    keys = sorted({u.key for u in swept})
    count = len(swept)
    noun = "upload" if count == 1 else "uploads"
    return (
        f"aborted {count} incomplete multipart {noun} that a killed conversion left in "
        f"{bucket.url('')}: {keys_text(keys)}"
    )
