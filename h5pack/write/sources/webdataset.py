"""WebDataset shards as a source: a folder of ``.tar`` files, or a brace pattern of them.

A sample is the consecutive members of a shard that share a key (webdataset's rule: the
path up to the first dot of the name); the rest of the name, lower-cased, says what the
member is: ``jpg``, ``jpeg``, ``png`` or ``webp`` the image (read in place by the workers),
``cls`` the label (an integer: classes are ``"0"`` to the largest), ``txt`` the text field
``txt``, ``json`` the JSON field ``json``; missing ones are "" and null, others ignored. A
key without an image, seen twice, or whose ``cls`` or ``json`` does not parse, is a problem
named by its key.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h5pack.core.fieldkinds import JSONField, StoredField, TextField
from h5pack.core.format import SkippedFile
from h5pack.core.store import Store
from h5pack.errors import SourceError
from h5pack.write.scan import has_image_extension, is_ignored_name
from h5pack.write.sources.archive import CUT_SHORT, opened_archive, tar_walk
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, label_fields
from h5pack.write.sources.objects import (
    ObjectFile,
    folder_url,
    listed,
    located,
    member_range,
    under,
)

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
TEXT_FIELDS = ("txt", "json")
_EMPTY = {"txt": "", "json": None}  # a sample without the member
_KEY = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_BRACES = re.compile(r"\{([^{}]*)\}")


@dataclass
class _Group:
    """The members of one key: by extension, with the text of the small ones read."""

    key: str
    members: dict[str, FileRange | None] = field(default_factory=dict)  # None: no file
    values: dict[str, str] = field(default_factory=dict)


class WebDatasetSource(PathSource):
    """WebDataset shards (the module docstring)."""

    kind = "webdataset"
    detect_first = True

    @staticmethod
    def matches(path: Path) -> bool:
        """Whether ``path`` is a brace pattern, or a folder of ``.tar`` files and nothing else."""
        if _BRACES.search(os.fspath(path)):
            return True
        if not path.is_dir():
            return False
        entries = [e for e in path.iterdir() if not is_ignored_name(e.name)]
        tars = [e for e in entries if e.suffix.lower() == ".tar" and e.is_file()]
        return bool(tars) and not any(e.is_dir() or has_image_extension(e.name) for e in entries)

    def shards(self) -> list[str]:
        """Return the shards' paths (or URLs), in order (SourceError: one missing, or none)."""
        remote = self.store.remote
        braces = _BRACES.search(self.root)
        if braces:
            paths = expand_braces(self.root)
            if remote:  # one listing of the pattern's folder, not a request per shard
                head = self.root[: braces.start()]
                there = {o.url for o in listed(self.store, head.rsplit("/", 1)[0] + "/")}
                missing = [p for p in paths if p not in there]
            else:
                missing = [p for p in paths if not os.path.isfile(p)]
            if missing:
                raise SourceError(
                    f"{len(missing)} of the {len(paths)} shards of {self.root} are missing, "
                    f"the first {missing[0]}"
                )
        elif remote:
            prefix = folder_url(self.root)
            found = (o.url for o in listed(self.store, prefix))
            paths = [u for u in found if u.lower().endswith(".tar") and "/" not in under(prefix, u)]
        else:
            paths = sorted(os.fspath(p) for p in Path(self.root).glob("*.tar"))
        if not paths:
            raise SourceError(f"no WebDataset shards (.tar) in {self.root}")
        return [located(self.store, p) for p in paths]

    def find(self) -> Listing:
        """List every shard's samples in order (SourceError: a shard unreadable, no image)."""
        groups: list[_Group] = []
        problems: list[SkippedFile] = []
        for shard in self.shards():
            groups.extend(_groups(self.store, shard, problems))
        counts = Counter(group.key for group in groups)
        problems.extend(
            SkippedFile(key, f"{count} samples of the shards have this key")
            for key, count in counts.items()
            if count > 1
        )
        rows = [_sample(group, problems) for group in groups]
        found = [row for row in rows if row is not None and counts[row[0].key] == 1]
        if not found:
            raise SourceError(f"no WebDataset sample with an image in {self.root}")
        labels = [label for _, label, _ in found]
        top = max(labels)
        fields = label_fields(labels)
        samples = [Sample(s.key, s.image, fields[i]) for i, (s, _, _) in enumerate(found)]
        kinds = {"txt": TextField("txt"), "json": JSONField("json")}
        texts: list[StoredField] = [
            kinds[name] for name in TEXT_FIELDS if any(name in v for _, _, v in found)
        ]
        columns = {
            f.name: f.column([v.get(f.name, _EMPTY[f.name]) for _, _, v in found], len(found))
            for f in texts
        }
        classes = tuple(str(i) for i in range(top + 1))
        return Listing(samples, classes, tuple(problems), fields=tuple(texts), columns=columns)

    def files(self) -> list[Path]:
        """Return the shards: the local files the samples are read from."""
        return [] if self.store.remote else [Path(p) for p in self.shards()]


def _groups(store: Store, shard: str, problems: list[SkippedFile]) -> list[_Group]:
    """Return the samples' members of one shard, in order."""
    groups: list[_Group] = []
    with opened_archive(store, shard, "the WebDataset shard") as (_, source):
        end = source.size()
        raw = ObjectFile(source)
        for member in tar_walk(raw, end, problems, Path(shard).name):
            match = _KEY.match(member.name)
            if member.isdir() or match is None:
                continue
            key, extension = match.group(1), match.group(2).lower()
            if member.offset_data + member.size > end:
                problems.append(SkippedFile(key, f"{extension}: {CUT_SHORT}"))
                continue
            if not groups or groups[-1].key != key or extension in groups[-1].members:
                groups.append(_Group(key))
            where = member_range(store, shard, member.offset_data, member.size)
            groups[-1].members[extension] = where if member.isfile() else None
            if extension in ("cls", *TEXT_FIELDS):
                data = bytes(raw.pread(member.offset_data, member.size))
                groups[-1].values[extension] = data.decode("utf-8", errors="replace")
    return groups


def _sample(
    group: _Group, problems: list[SkippedFile]
) -> tuple[Sample, int, dict[str, Any]] | None:
    """Return a group's sample, label and text fields; None (a problem) when it has none."""
    key, members = group.key, group.members
    values: dict[str, Any] = dict(group.values)
    found = [e for e in IMAGE_EXTENSIONS if e in members]
    if not found:
        problems.append(SkippedFile(key, "a WebDataset sample without an image (jpg, png...)"))
        return None
    image = members[found[0]]
    if image is None:
        problems.append(SkippedFile(key, "its image is a link or special file in the shard"))
        return None
    label = -1
    try:
        if "cls" in values:
            label = max(-1, int(values.pop("cls").strip()))
        if "json" in values:
            values["json"] = json.loads(values["json"])
    except ValueError as err:
        problems.append(SkippedFile(key, f"its cls or json does not parse: {err}"))
        return None
    return Sample(key, image), label, values


def expand_braces(pattern: str) -> list[str]:
    """Return the paths a brace pattern names: ``{000..012}`` ranges and ``{a,b}`` lists."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    span = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if span is not None:
        lo, hi = span.groups()
        width = max(len(lo), len(hi)) if lo.startswith("0") or hi.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        items = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [path for item in items for path in expand_braces(head + item + tail)]
