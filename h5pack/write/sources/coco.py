"""COCO detection and instance segmentation: an image folder and its ``instances_*.json``.

``h5pack convert IMAGES out.h5 --annotations instances.json``: every image the file lists
(``file_name`` under IMAGES) is a sample keyed by its ``file_name``, with the fields
``boxes`` (n x 4 float32 ``x1, y1, x2, y2``), ``labels`` (the category ids, named by the
field's ``categories``), ``iscrowd`` (n uint8), ``image_id``, and ``masks`` (n x H x W
uint8, when any annotation has a segmentation: polygons and RLE decoded exactly as
pycocotools' ``COCO.annToMask``, in the conversion's workers; decision 0055).

What cannot be packed is a problem named by the image file or ``annotation ID``: an image
not under IMAGES, of another size than the file says, or whose id or file name is given
twice; an annotation whose image, category, box or segmentation does not fit (more than
``SLACK`` pixels outside its image, an RLE of another size).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from h5pack._types import StrPath
from h5pack.core.fields import (
    BoxesField,
    CategoryField,
    InstanceMasksField,
    LazyColumn,
    RaggedField,
    ScalarField,
    StoredField,
)
from h5pack.core.format import SkippedFile
from h5pack.core.store import Store, join_url
from h5pack.errors import OptionsError, SourceError
from h5pack.write.scan import check_root, path_sort_key
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample
from h5pack.write.sources.masks import header_size
from h5pack.write.sources.objects import prefix_images, read_text

SLACK = 1.0  # pixels a box or polygon may reach outside its image (rounding in the file)
Image = tuple[str, FileRange, int, int]  # key, where, height, width


class CocoSource(PathSource):
    """The images of the folder ``path`` that the COCO file ``annotations`` lists, with boxes."""

    kind = "coco"

    def __init__(self, path: StrPath, annotations: StrPath, *, store: Store | None = None) -> None:
        super().__init__(path, store=store)
        self.annotations = os.fspath(annotations)

    def find(self) -> Listing:
        """Pair the annotations with the images (SourceError; OptionsError: no pycocotools)."""
        if not self.store.remote:
            check_root(Path(self.root))
        data = _load(self.annotations, self.given)
        categories = _categories(data["categories"], self.annotations)
        problems: list[SkippedFile] = []
        images, dropped = self._images(data["images"], problems)
        found: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
        for ann in data["annotations"]:
            reason = _annotation_problem(ann, images, categories, dropped)
            if reason is None:
                found[int(ann["image_id"])].append(ann)
            elif reason:
                image = images.get(ann.get("image_id", -1)) if isinstance(ann, dict) else None
                named = f"annotation {ann.get('id') if isinstance(ann, dict) else '?'}"
                named += f" ({image[0]})" if image else ""
                problems.append(SkippedFile(named, reason))
        order = sorted(images, key=lambda i: path_sort_key(images[i][0]))
        if not order:
            raise SourceError(f"none of the images {self.annotations} lists is under {self.root}")
        return self._listing(order, images, found, categories, problems)

    def _images(
        self, entries: Sequence[Any], problems: list[SkippedFile]
    ) -> tuple[dict[int, Image], set[Any]]:
        """Return the images that can be samples by id, and the ids of those that cannot."""
        good = [e for e in entries if _is_image(e)]
        problems.extend(
            SkippedFile(f"image entry {i}", "not a COCO image (id, file_name, width, height)")
            for i, e in enumerate(entries)
            if not _is_image(e)
        )
        ids = Counter(e["id"] for e in good)
        names = Counter(e["file_name"] for e in good)
        images: dict[int, Image] = {}
        cwd = os.getcwd()
        there = prefix_images(self.store, self.root) if self.store.remote else None
        sizes = _header_sizes(there, [e["file_name"] for e in good])
        for entry in good:
            key, height, width = entry["file_name"], int(entry["height"]), int(entry["width"])
            if there is None:
                where = FileRange(os.path.join(cwd, self.root, key))
            else:
                where = there.get(key, FileRange(join_url(self.root, key)))
            reason = ""
            if ids[entry["id"]] > 1:
                reason = "its image id is given to several images of the annotations"
            elif names[key] > 1:
                reason = "listed several times in the annotations"
            elif key.startswith("/") or ".." in PurePosixPath(key).parts:
                reason = "a file_name that leaves the image folder"
            elif not os.path.isfile(where.path) if there is None else key not in there:
                reason = "listed in the annotations, but not in the image folder"
            elif (sizes[key] if key in sizes else header_size(where)) not in (
                None,
                (height, width),
            ):
                reason = "its size differs from the width and height the annotations give"
            if reason:
                problems.append(SkippedFile(key, reason))
            else:
                images[entry["id"]] = (key, where, height, width)
        return images, {e["id"] for e in good} - set(images)

    def _listing(
        self,
        order: list[int],
        images: dict[int, Image],
        found: dict[int, list[Mapping[str, Any]]],
        categories: dict[int, str],
        problems: list[SkippedFile],
    ) -> Listing:
        boxes, labels, crowds, masks = [], [], [], []
        for image_id in order:
            anns = found.get(image_id, [])
            xywh = np.asarray([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
            xywh[:, 2:] += xywh[:, :2]
            boxes.append(xywh.astype(np.float32))
            labels.append(np.asarray([a["category_id"] for a in anns], dtype=np.int64))
            crowds.append(np.asarray([a.get("iscrowd", 0) for a in anns], dtype=np.uint8))
            _, _, height, width = images[image_id]
            masks.append((height, width, tuple(a.get("segmentation") for a in anns)))
        named = tuple(sorted(categories.items()))
        fields: list[StoredField] = [
            BoxesField("boxes", per_box=("labels", "iscrowd")),  # a crop drops their rows
            CategoryField("labels", categories=named),
            RaggedField("iscrowd", "|u1"),
            ScalarField("image_id", "<i8"),
        ]
        columns: dict[str, Any] = {
            "boxes": boxes,
            "labels": labels,
            "iscrowd": crowds,
            "image_id": np.asarray(order, dtype=np.int64),
        }
        if any(seg for _, _, segs in masks for seg in segs):
            if any(isinstance(seg, list) and seg for _, _, segs in masks for seg in segs):
                _pycocotools()
            fields[0] = BoxesField("boxes", per_box=("labels", "iscrowd", "masks"))
            fields.append(InstanceMasksField("masks"))
            columns["masks"] = LazyColumn(masks, coco_masks)
        samples = [Sample(images[i][0], images[i][1]) for i in order]
        return Listing(samples, problems=tuple(problems), fields=tuple(fields), columns=columns)


def _header_sizes(there: dict[str, FileRange] | None, keys: list[str]) -> dict[str, Any]:
    """Return the (H, W) of the images ``there`` (in a bucket) that ``keys`` name."""
    if there is None:
        return {}
    there_keys = [k for k in dict.fromkeys(keys) if k in there]
    named = [there[k] for k in there_keys]
    with ThreadPoolExecutor(16) as pool:
        return dict(zip(there_keys, pool.map(header_size, named), strict=True))


def _load(path: str, store: Store | None) -> dict[str, Any]:
    try:
        data = json.loads(read_text(path, store))
    except OSError as err:
        raise SourceError(f"cannot read the annotations {path}: {err.strerror or err}") from err
    except ValueError as err:
        raise SourceError(f"the annotations {path} are not JSON: {err}") from err
    lists = isinstance(data, dict) and all(
        isinstance(data.get(k), list) for k in ("images", "annotations", "categories")
    )
    if not lists:
        raise SourceError(
            f"the annotations {path} are not COCO's: they should be a JSON object with the "
            "lists images, annotations and categories"
        )
    return dict(data)


def _categories(entries: list[Any], path: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for entry in entries:
        ok = isinstance(entry, dict) and isinstance(entry.get("id"), int)
        if not ok or not isinstance(entry.get("name"), str) or entry["id"] in found:
            raise SourceError(
                f"the annotations {path}: each category should have its own int id and a "
                f"name, but got {entry!r}"
            )
        found[entry["id"]] = entry["name"]
    return found


def _is_image(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
        return False
    sizes = (entry.get("width"), entry.get("height"))
    return isinstance(entry.get("id"), int) and all(isinstance(v, int) and v > 0 for v in sizes)


def _annotation_problem(
    ann: Any, images: dict[int, Image], categories: Mapping[int, str], dropped: set[Any]
) -> str | None:
    """Return why ``ann`` cannot be packed; None when it can, "" when its image is dropped."""
    if not isinstance(ann, dict) or not _numbers(ann.get("bbox"), 4):
        return "not a COCO annotation (id, image_id, category_id, bbox)"
    image_id = ann.get("image_id")
    image = images.get(image_id) if isinstance(image_id, int) else None
    if image is None:
        return "" if image_id in dropped else "its image_id names no image"
    if ann.get("category_id") not in categories:
        return "its category_id names no category of the annotations"
    _, _, height, width = image
    x, y, w, h = ann["bbox"]
    if w < 0 or h < 0 or not _inside([x, x + w], [y, y + h], height, width):
        return "its bbox lies outside its image"
    if ann.get("iscrowd", 0) not in (0, 1):
        return "its iscrowd is neither 0 nor 1"
    segmentation = ann.get("segmentation")
    if segmentation and not _fits(segmentation, height, width):
        return "its segmentation does not fit its image"
    return None


def _numbers(value: Any, count: int = -1) -> bool:
    if not isinstance(value, list) or (count >= 0 and len(value) != count):
        return False
    return all(isinstance(v, int | float) and math.isfinite(v) for v in value)


def _inside(xs: Sequence[float], ys: Sequence[float], height: int, width: int) -> bool:
    return min(*xs, *ys) >= -SLACK and max(xs) <= width + SLACK and max(ys) <= height + SLACK


def _fits(segmentation: Any, height: int, width: int) -> bool:
    """Whether a segmentation (polygons, or an RLE) describes a mask of its image."""
    if isinstance(segmentation, list):
        polygons = [p for p in segmentation if _numbers(p) and len(p) >= 6 and len(p) % 2 == 0]
        return len(polygons) == len(segmentation) and all(
            _inside(p[0::2], p[1::2], height, width) for p in polygons
        )
    if not isinstance(segmentation, dict) or segmentation.get("size") != [height, width]:
        return False
    counts = segmentation.get("counts")
    found = rle_counts(counts) if isinstance(counts, str) else counts
    if not isinstance(found, list) or not all(isinstance(c, int) and c >= 0 for c in found):
        return False
    return sum(found) == height * width


def rle_counts(text: str) -> list[int] | None:
    """Return the run lengths of COCO's compressed RLE string (None: it ends in a number)."""
    counts: list[int] = []
    at = 0
    while at < len(text):
        value = shift = 0
        more = True
        while more:
            if at == len(text):
                return None
            code = ord(text[at]) - 48
            value |= (code & 0x1F) << shift
            more = bool(code & 0x20)
            at, shift = at + 1, shift + 5
            if not more and code & 0x10:
                value |= -1 << shift
        counts.append(value + counts[-2] if len(counts) > 2 else value)
    return counts


def coco_masks(item: tuple[int, int, tuple[Any, ...]]) -> np.ndarray:
    """Return the n x H x W masks of an image's segmentations, as ``COCO.annToMask`` does.

    Polygons are rasterised by pycocotools; every RLE is decoded here (its ``decode`` warns
    under NumPy 2).
    """
    height, width, segmentations = item
    out = np.zeros((len(segmentations), height, width), dtype=np.uint8)
    for k, segmentation in enumerate(segmentations):
        if not segmentation:
            continue  # an annotation without one: an empty mask
        if isinstance(segmentation, list):
            from pycocotools import mask as coco_mask

            rle = coco_mask.merge(coco_mask.frPyObjects(segmentation, height, width))
            segmentation = {"counts": rle["counts"].decode("ascii")}
        counts = segmentation["counts"]
        runs = rle_counts(counts) if isinstance(counts, str) else counts
        assert runs is not None  # _fits checked it
        values = np.arange(len(runs), dtype=np.uint8) % 2
        out[k] = np.repeat(values, runs).reshape(width, height).T
    return out


def _pycocotools() -> None:
    try:
        import pycocotools.mask  # noqa: F401
    except ImportError as err:
        raise OptionsError(
            "COCO polygons are rasterised by pycocotools: pip install 'h5pack-images[coco]'"
        ) from err
