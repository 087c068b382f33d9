"""Conversions and merges whose target is a URL: written locally, then published in a bucket.

``convert_to_url`` converts into a private staging directory on local disk, exactly as into
a local file, then uploads the finished pack under its final key (NOTE [ Publishing in a
bucket ] in ``write/upload.py``). The pack set's side (``convert_set`` and
``convert_on_dask`` into ``s3://bucket/set/``) is ``RemoteSet``; ``merge_with_urls`` fetches
remote sources into the staging directory, merges there and uploads the merged pack.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from h5pack._types import StrPath
from h5pack.core import format as fmt
from h5pack.core.format import PackMeta
from h5pack.core.packset import (
    MANIFEST_NAME,
    ShardEntry,
    ShardIdentity,
    manifest_text,
    meta_digest,
    parse_manifest,
    shard_name,
)
from h5pack.core.source import is_url, split_url
from h5pack.errors import (
    FormatError,
    H5PackError,
    OptionsError,
    PackNotFoundError,
    TargetExistsError,
)
from h5pack.write.builder import ConvertEvent, ConvertReport
from h5pack.write.leftovers import describe_removed
from h5pack.write.options import ConvertOptions
from h5pack.write.packset import meta_problems, set_manifest
from h5pack.write.publish import sigterm_as_exit
from h5pack.write.sources import SampleSource
from h5pack.write.upload import Bucket, RemoteObject, Staging, describe_swept

if TYPE_CHECKING:
    from h5pack.write.merge import MergeReport
    from h5pack.write.shards import ShardReport
    from h5pack.write.split import ShardTask

__all__ = [
    "RemoteSet",
    "RemoteShard",
    "check_pack_url",
    "convert_to_url",
    "upload_whole",
    "write_remote_shard",
]

Emit = Callable[[ConvertEvent], None]


def _ignore(_: object) -> None:
    return None


def check_pack_url(url: str) -> str:
    """Return the key of the pack ``url``; refuse a URL that names a prefix, not a pack.

    Raises:
        OptionsError: the URL names no bucket, or ends with ``/``.
    """
    _, _, key = split_url(url)
    if not key or key.endswith("/"):
        raise OptionsError(
            f"{url} is a prefix, not a pack: give the pack's name, e.g. {url.rstrip('/')}/"
            "out.h5 (to write a pack set of shards under a prefix, convert with --shards N)"
        )
    return key


def convert_to_url(
    source: StrPath | SampleSource,
    url: str,
    options: ConvertOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Emit | None = None,
    storage_options: Mapping[str, str] | None = None,
    staging_dir: StrPath | None = None,
) -> ConvertReport:
    """Pack ``source`` into the object ``url``: convert in a staging directory, then upload.

    See ``convert`` for the arguments.

    Raises:
        TargetExistsError: an object exists under ``url`` and ``overwrite`` is False.
        H5PackError: the staging directory is too small, or the upload failed (nothing is
            left under ``url``).
    """
    from h5pack.write.convert import convert_file

    emit = on_event or _ignore
    key = check_pack_url(url)
    bucket = Bucket(url, storage_options)
    refuse_existing(bucket, key, overwrite=overwrite)
    swept = bucket.sweep([key])
    if swept:
        emit(ConvertEvent("note", describe_swept(bucket, swept)))
    with sigterm_as_exit(), Staging(staging_dir, what=f"the pack for {url}") as staging:
        if staging.removed:
            emit(ConvertEvent("note", describe_removed(staging.removed)))
        local = staging.file(PurePosixPath(key).name)
        try:
            report = convert_file(
                source,
                local,
                options,
                progress=progress,
                on_event=on_event,
                room=lambda nbytes: staging.check_room(nbytes, what=f"the pack for {url}"),
            )
        except H5PackError as err:
            _raise_with_staging_hint(err, staging)
            raise
        upload_whole(bucket, local, key, overwrite=overwrite, emit=emit)
    return replace(report, path=url)


def refuse_existing(bucket: Bucket, key: str, *, overwrite: bool) -> RemoteObject | None:
    """Return the object under ``key``, refusing one unless ``overwrite``.

    Raises:
        TargetExistsError: it exists and ``overwrite`` is False.
    """
    found = bucket.info(key)
    if found is not None and not overwrite:
        raise TargetExistsError(f"{found.url} already exists; pass --overwrite to replace it")
    return found


def upload_whole(
    bucket: Bucket, local: Path, key: str, *, overwrite: bool, emit: Emit = _ignore
) -> RemoteObject:
    """Upload the finished file ``local`` under ``key`` (``Bucket.upload``: aborted on error).

    Raises:
        TargetExistsError: without ``overwrite``, an object appeared under ``key``
            meanwhile.
        RemoteError: the upload failed; nothing is left under ``key``.
    """
    if not overwrite:
        found = bucket.info(key)
        if found is not None:
            raise TargetExistsError(f"{found.url} appeared during the conversion; not replaced")
    size = local.stat().st_size
    emit(ConvertEvent("note", f"uploading {size / 2**20:.1f} MiB to {bucket.url(key)}"))
    return bucket.upload(local, key, if_absent=not overwrite)


def shard_url(prefix_url: str, name: str) -> str:
    """Return the URL of ``name`` under the pack set's prefix ``prefix_url``."""
    return prefix_url.rstrip("/") + "/" + name


def set_prefix(url: str) -> tuple[str, str]:
    """Return a pack set's prefix URL (ending in ``/``) and its key prefix.

    ``s3://bucket/set``, ``s3://bucket/set/`` and ``s3://bucket/set/packset.json`` name the
    same set.

    Raises:
        OptionsError: the URL names no bucket.
    """
    scheme, bucket, key = split_url(url)
    if key.endswith("/" + MANIFEST_NAME) or key == MANIFEST_NAME:
        key = key[: -len(MANIFEST_NAME)]
    key = key.strip("/")
    prefix = key + "/" if key else ""
    return f"{scheme}://{bucket}/{prefix}", prefix


def staging_root(staging_dir: StrPath | None) -> str | None:
    """Return ``staging_dir`` as text (a ShardTask carries it to a Dask worker)."""
    return os.fspath(staging_dir) if staging_dir is not None else None


# -- pack sets in a bucket --------------------------------------------------------------


@dataclass(frozen=True)
class RemoteShard:
    """Where one shard of a set in a bucket is published (picklable: a Dask task's).

    Attributes:
        url: The shard's URL.
        storage_options: The bucket's settings beyond the environment.
        staging_dir: Where the shard is written before it is uploaded (None: the temporary
            directory of the process that writes it).
    """

    url: str
    storage_options: dict[str, str] = field(default_factory=dict)
    staging_dir: str | None = None


class RemoteSet:
    """A pack set written under a prefix of a bucket (``convert_set`` into ``s3://...``).

    Args:
        url: The set's prefix (``s3://bucket/set/``) or its manifest's URL.
        storage_options: The bucket's settings beyond the environment.
        staging_dir: Where shards are written before they are uploaded.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, str] | None,
        staging_dir: StrPath | None,
    ) -> None:
        self.prefix_url, self.prefix = set_prefix(url)
        self.storage_options = dict(storage_options or {})
        self.staging_dir = staging_root(staging_dir)
        self.bucket = Bucket(url, self.storage_options)

    @property
    def manifest_url(self) -> str:
        """The URL of the set's manifest."""
        return self.bucket.url(self.prefix + MANIFEST_NAME)

    def shard(self, index: int, num_shards: int) -> RemoteShard:
        """Return where shard ``index`` is published."""
        return RemoteShard(
            self.bucket.url(self.prefix + shard_name(index, num_shards)),
            self.storage_options,
            self.staging_dir,
        )

    def prepare(self, num_shards: int, options: ConvertOptions, *, overwrite: bool) -> Path:
        """Refuse a manifest of another split under the prefix (deleted with ``overwrite``).

        Returns the directory ``ShardTask.target`` names the shards in (only their names
        are used).

        Raises:
            TargetExistsError: the prefix holds another split's manifest, without
                ``overwrite``.
        """
        key = self.prefix + MANIFEST_NAME
        text = self.bucket.get_text(key)
        if text is None:
            return Path(self.prefix or ".")
        try:
            other = parse_manifest(text, where=self.manifest_url, root=Path(self.prefix or "."))
            same = (other.num_shards, other.seed) == (num_shards, options.seed) and [
                e.path for e in other.shards
            ] == [shard_name(i, num_shards) for i in range(num_shards)]
            what = f"a pack set of {other.num_shards} shards (seed {other.seed})"
        except FormatError as err:
            same, what = False, f"a manifest that cannot be read ({err})"
        if not same:
            if not overwrite:
                raise TargetExistsError(
                    f"{self.manifest_url} describes {what}, not --shards {num_shards} --seed "
                    f"{options.seed}; convert under another prefix, or pass --overwrite to "
                    "replace it"
                )
            self.bucket.delete(key)
        return Path(self.prefix or ".")

    def finish(
        self,
        *,
        identities: Sequence[ShardIdentity],
        options: ConvertOptions,
        classes: tuple[str, ...],
        metas: dict[int, PackMeta],
        sizes: dict[int, int],
        emit: Emit,
    ) -> tuple[str | None, tuple[int, ...]]:
        """Upload the manifest if every shard is there and matches; return it and what is missing.

        As ``write.packset.finish_set``: the shards this run did not handle are checked
        here (HEAD, then their metadata through a remote open).
        """
        n = len(identities)
        entries: list[ShardEntry] = []
        missing: tuple[int, ...] = ()
        for i in range(n):
            name = shard_name(i, n)
            meta, size = metas.get(i), sizes.get(i)
            if meta is None or size is None:
                found = self.bucket.info(self.prefix + name)
                if found is None:
                    missing += (i,)
                    continue
                meta, problems = remote_shard_problems(
                    found.url, identities[i], options, classes, self.storage_options
                )
                if problems or meta is None:
                    emit(ConvertEvent("note", f"{found.url} does not match: {'; '.join(problems)}"))
                    missing += (i,)
                    continue
                size = found.size
            entries.append(
                ShardEntry(
                    path=name,
                    num_samples=meta.num_samples,
                    file_bytes=size,
                    digest=meta_digest(meta),
                )
            )
        if missing:
            return None, missing
        manifest = set_manifest(Path(self.prefix or "."), entries, classes, options)
        self.bucket.put_text(self.prefix + MANIFEST_NAME, manifest_text(manifest) + "\n")
        return self.manifest_url, ()


def read_remote_meta(url: str, storage_options: Mapping[str, str]) -> PackMeta:
    """Return the metadata of the pack at ``url`` (its paths read too, as a local check does).

    Raises:
        FormatError: the object is not a pack that can be read.
    """
    with fmt.open_h5(url, storage_options=storage_options) as handle:
        meta = fmt.read_meta(handle, url)
        fmt.read_paths(handle, meta)
    return meta


def remote_shard_problems(
    url: str,
    identity: ShardIdentity,
    options: ConvertOptions,
    classes: Sequence[str],
    storage_options: Mapping[str, str],
) -> tuple[PackMeta | None, list[str]]:
    """Return the metadata of the shard at ``url`` and how it differs from this conversion's."""
    try:
        meta = read_remote_meta(url, storage_options)
    except FormatError as err:
        return None, [f"it cannot be read ({err})"]
    return meta, meta_problems(meta, identity, options, classes)


def write_remote_shard(
    task: ShardTask, *, executor: Any, workers: int, emit: Emit, step: Callable[[int], None]
) -> tuple[ShardReport, PackMeta]:
    """Reuse the shard of ``task`` in its bucket if it matches, else write it and upload it.

    Raises:
        TargetExistsError: the shard exists, does not match and not ``task.overwrite`` (the
            message names its URL).
        H5PackError: the staging directory is too small, or the upload failed.
    """
    from h5pack.write.shards import ShardReport, convert_shard_file

    assert task.remote is not None  # write_shard sends only remote tasks here
    started = time.perf_counter()
    remote = task.remote
    _, _, key = split_url(remote.url)
    bucket = Bucket(remote.url, remote.storage_options)
    identity = task.identity
    where = f"shard {identity.index}/{identity.num_shards}"
    meta: PackMeta | None = None
    found = bucket.info(key)
    if found is not None:
        meta, problems = remote_shard_problems(
            remote.url, identity, task.options, task.classes, remote.storage_options
        )
        if problems:
            detail = "; ".join(problems)
            if not task.overwrite:
                raise TargetExistsError(
                    f"{remote.url} exists but is not {where} of this conversion ({detail}); "
                    "pass --overwrite to rebuild it, or convert under another prefix"
                )
            emit(ConvertEvent("note", f"replacing {remote.url}: {detail}"))
            meta = None
    if meta is not None and found is not None:
        status: Literal["written", "reused"] = "reused"
        size = found.size
    else:
        swept = bucket.sweep([key])
        if swept:
            emit(ConvertEvent("note", describe_swept(bucket, swept)))
        with sigterm_as_exit(), Staging(remote.staging_dir, what=remote.url) as staging:
            if staging.removed:
                emit(ConvertEvent("note", describe_removed(staging.removed)))
            local = staging.file(task.target.name)
            try:
                meta = convert_shard_file(
                    task,
                    local,
                    executor=executor,
                    workers=workers,
                    emit=emit,
                    step=step,
                    room=lambda nbytes: staging.check_room(nbytes, what=remote.url),
                )
            except H5PackError as err:
                _raise_with_staging_hint(err, staging)
                raise
            size = local.stat().st_size
            upload_whole(bucket, local, key, overwrite=True, emit=emit)
        status = "written"
    report = ShardReport(
        index=identity.index,
        path=remote.url,
        status=status,
        num_samples=meta.num_samples,
        num_planned=identity.num_planned,
        file_bytes=size,
        elapsed_s=time.perf_counter() - started,
        skipped=meta.skipped,
    )
    return report, meta


def _raise_with_staging_hint(err: H5PackError, staging: Staging) -> None:
    """When the staging disk filled, raise ``err`` again with what to do about it.

    Raises:
        H5PackError: ``err`` said no space was left (else nothing is raised here).
    """
    text = str(err)
    if "no space left" in text.lower() and "--staging-dir" not in text:
        raise H5PackError(f"{text}; {staging.hint()}") from err


# -- merging from and into a bucket -----------------------------------------------------


def has_url(sources: StrPath | Sequence[StrPath], target: StrPath) -> bool:
    """Return whether a merge reads or writes a bucket."""
    items: list[StrPath] = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    return is_url(target) or any(is_url(item) for item in items)


def merge_with_urls(
    sources: StrPath | Sequence[StrPath],
    target: StrPath,
    *,
    overwrite: bool = False,
    virtual: bool = False,
    keep_order: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Emit | None = None,
    storage_options: Mapping[str, str] | None = None,
    staging_dir: StrPath | None = None,
) -> MergeReport:
    """Merge packs of which some are in a bucket, or into a bucket (``merge_packs``).

    The remote sources (packs, or a set's prefix or manifest, with all its shards) are
    downloaded into a staging directory, merged there as local packs are, and a remote
    target is uploaded once complete (NOTE [ Publishing in a bucket ]): the merge copies
    every stored chunk anyway, and whole objects take the fewest requests.

    Raises:
        OptionsError: ``virtual`` with a URL (a virtual pack reads its sources by path).
        TargetExistsError: the target exists and ``overwrite`` is False.
        H5PackError: the staging directory is too small, or a transfer failed.
    """
    from h5pack.write.merge import merge_packs

    emit = on_event or _ignore
    if virtual:
        raise OptionsError(
            f"--virtual writes a view that reads its sources by local path; it cannot read "
            f"from or point into a bucket ({os.fspath(target)}): merge without --virtual"
        )
    options = dict(storage_options or {})
    target_text = os.fspath(target)
    remote_target = is_url(target_text)
    bucket = key = None
    if remote_target:
        key = check_pack_url(target_text)
        bucket = Bucket(target_text, options)
        refuse_existing(bucket, key, overwrite=overwrite)
    single = isinstance(sources, str | os.PathLike)
    items: list[StrPath] = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    with sigterm_as_exit(), Staging(staging_dir, what=f"the merge into {target_text}") as staging:
        if staging.removed:
            emit(ConvertEvent("note", describe_removed(staging.removed)))
        fetched = [
            _fetch_source(os.fspath(item), staging, k, options, emit)
            if is_url(os.fspath(item))
            else Path(item)
            for k, item in enumerate(items)
        ]
        local_target = staging.file(PurePosixPath(key).name) if key is not None else Path(target)
        merge_sources: StrPath | list[StrPath] = fetched[0] if single else list(fetched)
        try:
            report = merge_packs(
                merge_sources,
                local_target,
                overwrite=overwrite,
                keep_order=keep_order,
                progress=progress,
                on_event=on_event,
            )
        except H5PackError as err:
            _raise_with_staging_hint(err, staging)
            raise
        if bucket is not None and key is not None:
            swept = bucket.sweep([key])
            if swept:
                emit(ConvertEvent("note", describe_swept(bucket, swept)))
            upload_whole(bucket, local_target, key, overwrite=overwrite, emit=emit)
    said = [os.fspath(item) for item in items]
    if len(said) == 1 and len(report.sources) > 1:
        said = (
            [shard_url(said[0], Path(p).name) for p in report.sources]
            if is_url(said[0])
            else list(report.sources)
        )
    return replace(report, path=target_text, sources=tuple(said))


def _fetch_source(
    url: str, staging: Staging, index: int, options: Mapping[str, str], emit: Emit
) -> Path:
    """Download a remote pack, or a set's manifest and shards, into ``staging``; return it.

    Raises:
        PackNotFoundError: no such object (or no manifest under a set's prefix).
        H5PackError: the staging directory is too small, or a GET failed.
    """
    bucket = Bucket(url, options)
    folder = staging.file(f"source-{index:05d}")
    folder.mkdir()
    _, _, key = split_url(url)
    if not (key.endswith("/") or key.endswith(".json") or not key):
        found = bucket.info(key)
        if found is None:
            raise PackNotFoundError(
                f"{url}: no such object (a pack set: give its prefix, ending in /)"
            )
        staging.check_room(2 * found.size, what=f"{url} and its merged copy")
        local = folder / PurePosixPath(key).name
        emit(ConvertEvent("note", f"downloading {url} ({found.size / 2**20:.1f} MiB)"))
        bucket.download(key, local)
        return local
    prefix_url, prefix = set_prefix(url)
    text = bucket.get_text(prefix + MANIFEST_NAME)
    if text is None:
        raise PackNotFoundError(
            f"{prefix_url} has no {MANIFEST_NAME}: no pack set manifest (a conversion with "
            "--shards writes it last; was it interrupted?)"
        )
    manifest = parse_manifest(text, where=prefix_url + MANIFEST_NAME, root=folder)
    total = sum(e.file_bytes for e in manifest.shards)
    staging.check_room(2 * total, what=f"the shards of {prefix_url} and their merged copy")
    emit(
        ConvertEvent(
            "note",
            f"downloading {len(manifest.shards)} shards of {prefix_url} ({total / 2**20:.1f} MiB)",
        )
    )
    (folder / MANIFEST_NAME).write_text(text, encoding="utf-8")
    for entry in manifest.shards:
        bucket.download(prefix + entry.path, folder / entry.path)
    return folder
