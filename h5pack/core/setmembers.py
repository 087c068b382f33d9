"""Whether packs fit together as one set: each shard as its manifest recorded it, none twice."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from h5pack.core.fields import field_difference, fields_of
from h5pack.core.format import PackMeta
from h5pack.core.packset import PackSetManifest, ShardEntry, meta_digest, shard_name
from h5pack.errors import FormatError


def check_shard(
    manifest: PackSetManifest,
    entry: ShardEntry,
    meta: PackMeta,
    *,
    remote: tuple[str, str] | None = None,
) -> None:
    """Raise ``FormatError`` unless ``meta`` is the shard the manifest recorded."""
    path: Path | str = manifest.root / entry.path
    where: Path | str = manifest.manifest_path
    if remote is not None and meta.identity is not None:
        (path, where), size = remote, meta.identity.size
    else:
        size = Path(path).stat().st_size
    problems = []
    if size != entry.file_bytes:
        problems.append(f"{size} bytes, the manifest recorded {entry.file_bytes}")
    if meta.num_samples != entry.num_samples:
        problems.append(f"{meta.num_samples} samples, the manifest recorded {entry.num_samples}")
    if meta.classes != manifest.classes:
        problems.append("another class list than the pack set's")
    if not problems and meta_digest(meta) != entry.digest:
        problems.append("metadata that differs from what the manifest recorded")
    if problems:
        raise FormatError(
            f"{path}: the shard changed since {where} was written ("
            + "; ".join(problems)
            + "); rebuild it with the same --shards and --seed, or restore it"
        )


def member_problems(
    paths: Sequence[Path], metas: Sequence[PackMeta], manifest: PackSetManifest | None
) -> list[tuple[Path, str]]:
    """Return what makes packs unfit to be one set, each with its file (a pack twice...)."""
    problems: list[tuple[Path, str]] = []
    seen: dict[object, tuple[int, Path]] = {}

    def add(at: Path, text: str) -> None:
        problems.append((at, f"{at}: {text}"))

    for number, (path, meta) in enumerate(zip(paths, metas, strict=True)):
        keys: list[object] = [("file", _file_key(path))]
        if meta.pack_id is not None:
            keys.append(("id", meta.pack_id))
        earlier = next((seen[key] for key in keys if key in seen), None)
        if earlier is not None:
            at, first = earlier
            if ("file", _file_key(path)) not in seen:
                what = f"the same pack as {first} (pack id {meta.pack_id}: a copy)"
            elif first == path:
                what = "given twice"
            else:
                what = f"the same file as {first}"
            add(
                path,
                f"{what}, entries {at} and {number} of the set: a pack given twice is served "
                "twice every epoch; give each pack once (a mix weights a pack up on purpose)",
            )
        for key in keys:
            seen.setdefault(key, (number, path))
    if manifest is None:
        return problems
    where = manifest.manifest_path
    splits = {_split_key(meta.shard) for meta in metas if meta.shard}
    if len(splits) == 1 and all(meta.shard for meta in metas):
        ((num_shards, *_),) = splits
        held = {int(meta.shard["index"]) for meta in metas}
        missing = sorted(set(range(num_shards)) - held)
        if missing:
            shown = ", ".join(shard_name(i, num_shards) for i in missing[:4])
            more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            add(
                where,
                f"lists {len(metas)} of the {num_shards} shards its shards say the set has: "
                f"{shown}{more} not listed (an incomplete set would be read as a smaller one); "
                "restore the manifest, or rerun the conversion with --shards to write it again",
            )
    elif manifest.num_shards != len(manifest.shards):
        add(
            where,
            f"lists {len(manifest.shards)} shards but says the set has "
            f"{manifest.num_shards} (num_shards): restore the manifest",
        )
    listed = sum(entry.num_samples for entry in manifest.shards)
    if not problems and listed != manifest.num_samples:
        add(
            where,
            f"says the set holds {manifest.num_samples} samples (num_samples), but its shard "
            f"entries add up to {listed}: restore the manifest",
        )
    return problems


def join_differences(meta: PackMeta, first: PackMeta) -> list[str]:
    """Return how ``meta``'s pack differs from ``first``'s in what a set or merge joins."""
    found = [
        f"{what} {mine} here, {theirs} in {first.path}"
        for what, mine, theirs in (
            ("mode", meta.mode, first.mode),
            ("storage", meta.storage, first.storage),
            ("channels", meta.channels, first.channels),
        )
        if mine != theirs
    ]
    shape, first_shape = meta.images_shape[1:], first.images_shape[1:]
    if meta.storage == first.storage == "array" and shape != first_shape:
        found.append(f"sample shape {shape} here, {first_shape} in {first.path}")
    fields = field_difference(fields_of(meta), fields_of(first), meta.path, first.path)
    found.extend([fields] if fields else [])
    if meta.classes != first.classes:
        only = sorted(set(meta.classes) ^ set(first.classes))[:3]
        detail = f" (e.g. {', '.join(map(repr, only))} in one only)" if only else " (order)"
        found.append(
            f"classes: {len(meta.classes)} here, {len(first.classes)} in {first.path}{detail}"
        )
    return found


def _file_key(path: Path) -> tuple[int, int] | str:
    try:
        stat = path.stat()
    except OSError:
        return os.fspath(path.resolve())
    return (stat.st_dev, stat.st_ino)


def _split_key(shard: Mapping[str, Any]) -> tuple[int, object, object, object]:
    return (
        int(shard.get("num_shards", 0)),
        shard.get("seed"),
        shard.get("shuffled"),
        shard.get("num_found"),
    )
