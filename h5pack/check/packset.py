"""Whether a pack set is intact: ``verify_packset`` (``h5pack verify SET``).

Every shard is checked as a pack is (``check_pack``), and the set as a whole: the manifest's
shards present and unchanged (``check_shard``); the shards agree as readers require; no
source image in two shards; with a source, every image in exactly one. Problems name the
shard file, or the manifest for the set as a whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from h5pack._types import StrPath
from h5pack.check.probe import probe_packs
from h5pack.check.report import DEFAULT_TOLERANCE, Problem, VerifyReport
from h5pack.check.source import SourceShard, compare_source
from h5pack.check.verify import check_pack
from h5pack.core import format as fmt
from h5pack.core.packset import PackSetManifest, pack_paths
from h5pack.core.setmembers import check_shard, member_problems
from h5pack.core.store import Store, open_store
from h5pack.errors import FormatError, H5PackError
from h5pack.read.packset import PackSource, describe, load_pack_meta, remote_members
from h5pack.write.sources import SampleSource


def _message(err: BaseException, name: str) -> str:
    """Return the text of ``err`` without the file name it starts with (the problem says it)."""
    text = str(err)
    return text[len(name) + 2 :] if text.startswith(f"{name}: ") else text


def verify_packset(
    packs: PackSource,
    *,
    source: StrPath | SampleSource | None = None,
    labels_csv: StrPath | None = None,
    sample: int | None = None,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    progress: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
    store: Store | None = None,
) -> VerifyReport:
    """Check every shard of a pack set and the set as a whole (``check.entry.verify_packset``).

    Nothing raises for a missing, truncated, changed or damaged shard: each is a problem
    naming the shard file (a sample's index is its index within that shard).
    """
    store = store or open_store(packs)
    remote = store.remote
    paths: list[Path | str]
    if remote:  # a missing shard is named when its index is read
        urls, manifest, manifest_url = remote_members(packs, store)
        paths, timeout_s = list(urls), None
        where = manifest_url or urls[0]
    else:
        local, manifest = pack_paths(packs)
        paths = list(local)
        where = os.fspath(manifest.manifest_path) if manifest is not None else os.fspath(local[0])
    names = [os.fspath(p) for p in paths]
    problems: list[Problem] = []
    usable = [True] * len(paths)
    for number, path in enumerate(paths):
        if not remote and not Path(path).exists():
            usable[number] = False
            listed = "the manifest lists it, but" if manifest is not None else "given, but"
            message = f"missing: {listed} there is no such file"
            problems.append(Problem(None, "", message, names[number]))
    if timeout_s is not None:
        present = [n for n, ok in enumerate(usable) if ok]
        for number, error in zip(
            present,
            probe_packs([Path(paths[n]) for n in present], timeout_s=timeout_s, strict=False),
            strict=True,
        ):
            if error is not None:
                usable[number] = False
                problems.append(Problem(None, "", _message(error, names[number]), names[number]))
    checked: dict[int, SourceShard] = {}
    verified = total = 0
    for number, path in enumerate(paths):
        if not usable[number]:
            if manifest is not None:
                total += manifest.shards[number].num_samples
            continue
        name = names[number]
        try:
            meta = (
                load_pack_meta(path, store=store)
                if remote
                else fmt.load_meta(path, check_digests=False)
            )
        except (H5PackError, OSError) as err:  # not a pack, truncated: named, not raised
            problems.append(Problem(None, "", _message(err, name), name))
            if manifest is not None:
                total += manifest.shards[number].num_samples
            continue
        if manifest is not None:
            try:
                at = (name, where) if remote else None
                check_shard(manifest, manifest.shards[number], meta, remote=at)
            except FormatError as err:
                problems.append(Problem(None, "", _message(err, name), name))
        try:
            result = check_pack(path, progress=progress, store=store)
        except (H5PackError, OSError) as err:
            problems.append(Problem(None, "", _message(err, name), name))
            total += meta.num_samples
            continue
        problems.extend(replace(p, shard=name) for p in result.report.problems)
        verified += result.report.num_verified
        total += meta.num_samples
        checked[number] = SourceShard(name=name, path=name, meta=meta, paths=result.paths)
    shards = [checked[n] for n in sorted(checked)]
    if shards:
        problems.extend(_set_problems(shards, manifest, by_path=source is not None))
    if shards and len(shards) == len(paths):
        metas = [shard.meta for shard in shards]
        problems.extend(
            Problem(None, "", _message(FormatError(message), os.fspath(path)), os.fspath(path))
            for path, message in member_problems([Path(p) for p in paths], metas, manifest)
        )
    if shards and len(shards) == len(paths) and not problems:
        try:  # whatever else the readers would refuse (they open the set this way)
            describe(packs, store=store)
        except (H5PackError, OSError) as err:
            problems.append(Problem(None, "", str(err), where))
    report = VerifyReport(
        path=where,
        num_samples=total,
        num_verified=verified,
        problems=tuple(problems),
        num_shards=len(paths),
    )
    if source is None or not shards:
        return report
    return compare_source(
        report, shards, source, labels_csv=labels_csv, sample=sample, seed=seed, tolerance=tolerance
    )


def _set_problems(
    shards: Sequence[SourceShard], manifest: PackSetManifest | None, *, by_path: bool
) -> list[Problem]:
    """Return what is wrong across shards: their agreement, and images held twice."""
    problems: list[Problem] = []
    first = shards[0].meta
    for shard in shards[1:]:
        meta = shard.meta
        differences = [
            f"{what} {getattr(meta, what)!r}, not {getattr(first, what)!r}"
            for what in ("mode", "storage", "channels")
            if getattr(meta, what) != getattr(first, what)
        ]
        if manifest is None and meta.classes != first.classes:  # a manifest's: check_shard
            differences.append(f"classes {list(meta.classes)}, not {list(first.classes)}")
        if first.storage == "array" and meta.images_shape[1:] != first.images_shape[1:]:
            differences.append(f"image shape {meta.images_shape[1:]}, not {first.images_shape[1:]}")
        if differences:
            message = f"does not match {shards[0].name}: " + "; ".join(differences)
            problems.append(Problem(None, "", message, shard.name))
    # NOTE [ Source positions across shards ]: a sharded conversion numbers images by their
    # place in one global scan, so a position held twice is an image held twice. Packs
    # converted separately each number from 0: positions are compared only when some shard
    # holds one beyond its own count (a global numbering).
    by_index = any(
        s.meta.source_index.size and int(s.meta.source_index.max()) >= s.meta.num_samples
        for s in shards
    )
    problems.extend(_duplicates(shards, by_index=by_index, by_path=by_path or manifest is not None))
    return problems


def _duplicates(shards: Sequence[SourceShard], *, by_index: bool, by_path: bool) -> list[Problem]:
    """Return a problem for each sample whose source image an earlier shard holds too.

    The same image: the same ``source_index`` (``by_index``) or relative path (``by_path``).
    """
    problems: list[Problem] = []
    by_position: dict[int, tuple[int, int]] = {}
    by_relative: dict[str, tuple[int, int]] = {}
    for number, shard in enumerate(shards):
        positions = shard.meta.source_index.tolist()
        for local, relative in enumerate(shard.paths):
            holders = []
            if by_index:
                holders.append(by_position.setdefault(int(positions[local]), (number, local)))
            if by_path and relative:
                holders.append(by_relative.setdefault(relative, (number, local)))
            other = next((h for h in holders if h[0] != number), None)
            if other is not None:
                problems.append(
                    Problem(
                        local,
                        relative,
                        f"duplicate: the same source image is sample {other[1]} of "
                        f"{shards[other[0]].name} (an image belongs in exactly one shard)",
                        shard.name,
                    )
                )
    return problems
