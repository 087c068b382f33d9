"""A pack set's directory while it is written: its manifest, and the shards found there.

``convert_set`` and ``convert_on_dask`` prepare the directory, check a shard found under its
name against what they would write (``shard_problems``: the restart check), and write the
manifest last, once every shard is there and matches (``finish_set``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h5pack._types import StrPath
from h5pack._version import __version__
from h5pack.core import format as fmt
from h5pack.core.format import PackMeta
from h5pack.core.packset import (
    MANIFEST_NAME,
    PackSetManifest,
    ShardEntry,
    ShardIdentity,
    load_manifest,
    manifest_text,
    meta_digest,
    shard_name,
    write_manifest,
)
from h5pack.core.store import Store, open_store, split_url
from h5pack.errors import FormatError, H5PackError, OptionsError, TargetExistsError
from h5pack.write.options import ConvertOptions
from h5pack.write.report import ConvertEvent

if TYPE_CHECKING:
    from h5pack.write.remote import RemoteSet
    from h5pack.write.split import SourceSplit


def prepare_out_dir(
    out_dir: StrPath, num_shards: int, options: ConvertOptions, *, overwrite: bool
) -> Path:
    """Create the pack set's directory; refuse (TargetExistsError) another split's manifest.

    With ``overwrite``, such a manifest is removed (the new one is written at the end).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OptionsError(f"{out} is a file; a pack set is written into a directory")
    if not out.parent.is_dir():
        raise OptionsError(f"{out.parent} is not a directory; create it first")
    try:
        out.mkdir(exist_ok=True)
    except OSError as err:
        raise H5PackError(f"cannot create {out}: {err.strerror or err}") from err
    manifest = out / MANIFEST_NAME
    if manifest.exists() and another_split(
        os.fspath(manifest),
        lambda: load_manifest(manifest),
        num_shards,
        options,
        overwrite=overwrite,
        elsewhere="into another directory",
    ):
        manifest.unlink(missing_ok=True)
    return out


def another_split(
    where: str,
    load: Callable[[], PackSetManifest],
    num_shards: int,
    options: ConvertOptions,
    *,
    overwrite: bool,
    elsewhere: str,
) -> bool:
    """Whether the manifest ``where`` (``load``ed) is another split's, to replace.

    TargetExistsError unless ``overwrite``.
    """
    names = [shard_name(i, num_shards) for i in range(num_shards)]
    try:
        other = load()
        if (other.num_shards, other.seed) == (num_shards, options.seed) and [
            e.path for e in other.shards
        ] == names:
            return False
        what = f"a pack set of {other.num_shards} shards (seed {other.seed})"
    except FormatError as err:
        what = f"a manifest that cannot be read ({err})"
    if not overwrite:
        raise TargetExistsError(
            f"{where} describes {what}, not --shards {num_shards} --seed {options.seed}; "
            f"convert {elsewhere}, or pass --overwrite to replace it"
        )
    return True


def shard_problems(
    path: StrPath,
    identity: ShardIdentity,
    options: ConvertOptions,
    classes: Sequence[str],
    store: Store | None = None,
) -> tuple[PackMeta | None, list[str]]:
    """Return a shard's metadata and how it differs from what this conversion would write."""
    try:
        with fmt.open_index(path, store=store) as handle:
            meta = fmt.read_meta(handle, os.fspath(path))
            fmt.read_paths(handle, meta)
    except FormatError as err:
        return None, [f"it cannot be read ({err})"]
    return meta, meta_problems(meta, identity, options, classes)


def meta_problems(
    meta: PackMeta, identity: ShardIdentity, options: ConvertOptions, classes: Sequence[str]
) -> list[str]:
    """Return how a shard's ``meta`` differs from what this conversion would write."""
    problems = identity.differences(meta.shard)
    if meta.classes != tuple(classes):
        problems.append("another class list (the class folders changed)")
    recorded, wanted = _content_options(meta.options), _content_options(options.to_json())
    changed = sorted(k for k in recorded.keys() | wanted.keys() if recorded.get(k) != wanted.get(k))
    if changed:
        problems.append(
            "other options ("
            + ", ".join(f"{k}: {recorded.get(k)!r}, now {wanted.get(k)!r}" for k in changed)
            + ")"
        )
    return problems


def _content_options(options: Any) -> dict[str, Any]:
    """Return the options that decide a pack's content (``workers`` does not)."""
    data = json.loads(json.dumps(dict(options)))
    data.pop("workers", None)
    return dict(data)


def finish_manifest(
    out: Path,
    remote: RemoteSet | None,
    *,
    split: SourceSplit,
    options: ConvertOptions,
    metas: dict[int, PackMeta],
    sizes: dict[int, int],
    emit: Callable[[ConvertEvent], None],
) -> tuple[str | None, tuple[int, ...]]:
    """Write the set's manifest, in ``out`` or the bucket, once every shard is there and matches.

    Returns its path or URL (None while shards are missing) and the missing shards.
    ``metas`` and ``sizes`` are the shards this process wrote or checked; the others are
    checked here, and ``emit`` told of one that does not match.
    """
    if remote is not None:
        store, prefix = remote.store, remote.prefix_url
        root = Path(split_url(prefix)[2] or ".")
    else:
        store, prefix, root = open_store(out), os.fspath(out) + os.sep, out
    n = split.num_shards
    entries: list[ShardEntry] = []
    missing: tuple[int, ...] = ()
    for i in range(n):
        name = shard_name(i, n)
        meta, size = metas.get(i), sizes.get(i)
        if meta is None or size is None:
            found = store.stat(prefix + name)
            if found is None:
                missing += (i,)
                continue
            if meta is None:
                classes = split.source.classes
                meta, problems = shard_problems(
                    found.url, split.identity(i), options, classes, store
                )
                if problems or meta is None:
                    emit(ConvertEvent("note", f"{found.url} does not match: {'; '.join(problems)}"))
                    missing += (i,)
                    continue
            size = found.size
        digest = meta_digest(meta)
        entries.append(
            ShardEntry(path=name, num_samples=meta.num_samples, file_bytes=size, digest=digest)
        )
    if missing:
        return None, missing
    manifest = PackSetManifest(
        root=root,
        shards=tuple(entries),
        classes=split.source.classes,
        num_samples=sum(e.num_samples for e in entries),
        seed=options.seed,
        num_shards=n,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        tool_version=__version__,
    )
    if not store.remote:
        return os.fspath(write_manifest(manifest)), ()
    store.put(prefix + MANIFEST_NAME, (manifest_text(manifest) + "\n").encode("utf-8"))
    return prefix + MANIFEST_NAME, ()
