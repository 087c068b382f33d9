"""Semantic segmentation: a folder of images and a folder of masks with the same stems.

``h5pack convert IMAGES out.h5 --masks MASKS/``: image ``IMAGES/a/b.jpg`` has its mask
``MASKS/a/b.png`` (any image extension): a palette ("P") or grey ("L") image whose values
are kept as they are, stored as the field ``mask`` (H x W uint8, its image's size), read in
the conversion's workers. An image without its mask, with a mask of another size, with
several masks or of a stem another image shares, and a mask that is not a palette or grey
image, are problems named by the image's path; masks without an image are a note.
"""

from __future__ import annotations

import io
import os
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from h5pack._types import StrPath
from h5pack.core.decode import probe_size
from h5pack.core.fields import LazyColumn, MaskField
from h5pack.core.format import SkippedFile
from h5pack.core.store import Store, is_url, open_store
from h5pack.errors import DecodeError, SourceError
from h5pack.write.scan import check_root, name_paths, path_sort_key, scan, walk
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample, read_object
from h5pack.write.sources.objects import prefix_images

MASK_MODES = ("P", "L")  # palette indices or grey values, kept as they are
HEADER_BYTES = 1 << 18  # read to learn an image's size; the whole file when not enough
REMOTE_HEADER_BYTES = 1 << 14  # in a bucket: the first bytes only (an image too big: unchecked)


class MaskSource(PathSource):
    """The images under the folder ``path``, each with its mask from the folder ``masks``."""

    kind = "masks"

    def __init__(self, path: StrPath, masks: StrPath, *, store: Store | None = None) -> None:
        super().__init__(path, store=store)
        self.masks = os.fspath(masks)

    def find(self) -> Listing:
        """Pair each image with its mask (SourceError: a folder missing, or no pair)."""
        images, problems = self._images()
        masks_by_stem: dict[str, list[FileRange]] = defaultdict(list)
        if is_url(self.masks):  # NOTE [ Sources in a bucket ]
            store = self.given if self.given is not None else open_store(self.masks)
            for relative, where in prefix_images(store, self.masks).items():
                masks_by_stem[os.path.splitext(relative)[0]].append(where)
        else:
            check_root(Path(self.masks))
            for relative, path in walk(Path(self.masks))[0]:
                masks_by_stem[os.path.splitext(relative)[0]].append(
                    FileRange(os.path.abspath(path))
                )
        stems = [os.path.splitext(relative)[0] for relative, _ in images]
        images_by_stem = Counter(stems)
        pairs = [
            (w, masks_by_stem.get(t, []), images_by_stem[t])
            for (_, w), t in zip(images, stems, strict=True)
        ]
        with ThreadPoolExecutor(16 if self.given is not None else 1) as pool:  # header GETs
            reasons = list(pool.map(lambda pair: _mismatch(*pair), pairs))
        samples: list[Sample] = []
        masks: list[FileRange] = []
        for (relative, where), stem, reason in zip(images, stems, reasons, strict=True):
            if reason:
                problems.append(SkippedFile(relative, reason))
                continue
            samples.append(Sample(relative, where))
            masks.append(masks_by_stem[stem][0])
        if not samples:
            raise SourceError(f"no image under {self.root} has a mask under {self.masks}")
        left = sorted(set(masks_by_stem) - set(images_by_stem))
        notes = (f"{len(left)} masks under {self.masks} have no image: {name_paths(left)}",)
        return Listing(
            samples,
            problems=tuple(problems),
            notes=notes if left else (),
            fields=(MaskField("mask"),),
            columns={"mask": LazyColumn(masks, read_mask)},
        )

    def _images(self) -> tuple[list[tuple[str, FileRange]], list[SkippedFile]]:
        """Return the images (relative path, where) and the problems of listing them."""
        if self.store.remote:
            found = prefix_images(self.store, self.root)
            return sorted(found.items(), key=lambda item: path_sort_key(item[0])), []
        scanned = scan(self.root, layout="flat")
        cwd = os.getcwd()
        images = [(f.relative, FileRange(os.path.join(cwd, f.path))) for f in scanned.files]
        return images, list(scanned.problems)


def _mismatch(image: FileRange, masks: list[FileRange], images: int) -> str:
    """Return why an image and its ``masks`` do not make a sample ("" when they do)."""
    if images > 1:
        return "several images have this stem: which one the mask belongs to cannot be told"
    if len(masks) != 1:
        return "no mask of this stem" if not masks else "several masks have this stem"
    try:
        with _open_mask(masks[0], header=True) as mask:
            mode, (width, height) = mask.mode, mask.size
    except (OSError, ValueError, DecodeError) as err:
        return f"its mask {masks[0].path} cannot be read ({err})"
    if mode not in MASK_MODES:
        return f"its mask is a {mode} image, not a palette (P) or grey (L) one"
    size = header_size(image)
    if size is not None and size != (height, width):
        return "its mask's size differs from the image's"
    return ""


def header_size(image: FileRange) -> tuple[int, int] | None:
    """Return an image's displayed (H, W) from its header; None when it cannot be read."""
    try:
        if image.store is None:
            with open(image.path, "rb") as f:
                head = f.read(HEADER_BYTES)
        else:  # a ranged GET of its first bytes (NOTE [ Sources in a bucket ])
            head = read_object(image.store, image.path, 0, min(image.size, REMOTE_HEADER_BYTES))
        try:
            return probe_size(head, name=image.path)
        except DecodeError:
            return probe_size(image.read(), name=image.path) if len(head) == HEADER_BYTES else None
    except (OSError, DecodeError):
        return None


def _open_mask(where: FileRange, *, header: bool = False) -> Image.Image:
    """Open a mask image: a file, or an object read whole (only its first bytes: ``header``)."""
    if where.store is None:
        return Image.open(where.path)
    size = min(where.size, 4096) if header else where.size
    return Image.open(io.BytesIO(read_object(where.store, where.path, 0, size)))


def read_mask(path: FileRange) -> np.ndarray:
    """Return the values of a palette or grey mask image as H x W uint8 (DecodeError)."""
    try:
        with _open_mask(path) as mask:
            return np.asarray(mask, dtype=np.uint8)
    except (OSError, ValueError) as err:
        raise DecodeError(f"{path.path}: cannot read the mask: {err}") from err
