"""Semantic segmentation: a folder of images and a folder of masks with the same stems.

``h5pack convert IMAGES out.h5 --masks MASKS/``: each image ``IMAGES/a/b.jpg`` has its mask
``MASKS/a/b.png`` (the relative path mirrored, any image extension): a palette ("P") or
grey ("L") image whose values are kept as they are (class ids, 255 included), stored as
the field ``mask`` (H x W uint8, its image's size). The masks are read while the pack is
written, one at a time. An image without its mask, with a mask of another size, with
several masks or of a stem another image shares, and a mask that is not a palette or grey
image, are problems named by the image's path; masks without an image are a note.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import numpy as np
from PIL import Image

from h5pack._types import StrPath
from h5pack.core.decode import probe_size
from h5pack.core.fields import LazyColumn, MaskField
from h5pack.core.format import SkippedFile
from h5pack.core.store import Store
from h5pack.errors import DecodeError, SourceError
from h5pack.write.scan import name_paths, scan
from h5pack.write.sources.base import FileRange, Listing, PathSource, Sample
from h5pack.write.walk import check_root, walk

MASK_MODES = ("P", "L")  # palette indices or grey values, kept as they are
HEADER_BYTES = 1 << 18  # read to learn an image's size; the whole file when not enough


class MaskSource(PathSource):
    """The images under a folder, each with its mask from a second folder (module docstring).

    Args:
        path: The images' folder.
        masks: The masks' folder.
    """

    kind = "masks"

    def __init__(self, path: StrPath, masks: StrPath, *, store: Store | None = None) -> None:
        super().__init__(path, store=store)
        self.masks = os.fspath(masks)

    def find(self) -> Listing:
        """Pair each image with its mask and check their sizes (module docstring).

        Raises:
            SourceError: either folder is missing or holds no image.
        """
        found = scan(self.root, layout="flat")
        check_root(Path(self.masks))
        masks_by_stem: dict[str, list[Path]] = defaultdict(list)
        for relative, path in walk(Path(self.masks))[0]:
            masks_by_stem[os.path.splitext(relative)[0]].append(path)
        images_by_stem: dict[str, int] = defaultdict(int)
        for file in found.files:
            images_by_stem[os.path.splitext(file.relative)[0]] += 1
        problems = list(found.problems)
        samples, masks = [], []
        cwd = os.getcwd()
        for file in found.files:
            stem = os.path.splitext(file.relative)[0]
            where = FileRange(os.path.join(cwd, file.path))
            reason = _mismatch(where, masks_by_stem.get(stem, []), images_by_stem[stem])
            if reason:
                problems.append(SkippedFile(file.relative, reason))
                continue
            samples.append(Sample(file.relative, where))
            masks.append(os.path.join(cwd, masks_by_stem[stem][0]))
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


def _mismatch(image: FileRange, masks: list[Path], images: int) -> str:
    """Return why an image and its ``masks`` do not make a sample ("" when they do)."""
    if images > 1:
        return "several images have this stem: which one the mask belongs to cannot be told"
    if len(masks) != 1:
        return "no mask of this stem" if not masks else "several masks have this stem"
    try:
        with Image.open(masks[0]) as mask:
            mode, (width, height) = mask.mode, mask.size
    except (OSError, ValueError) as err:
        return f"its mask {masks[0].name} cannot be read ({err})"
    if mode not in MASK_MODES:
        return f"its mask is a {mode} image, not a palette (P) or grey (L) one"
    size = header_size(image)
    if size is not None and size != (height, width):
        return "its mask's size differs from the image's"
    return ""


def header_size(image: FileRange) -> tuple[int, int] | None:
    """Return an image's displayed (H, W) from its header; None when it cannot be read.

    An image that cannot be read is left to the decoder, which skips it naming why.
    """
    try:
        with open(image.path, "rb") as f:
            head = f.read(HEADER_BYTES)
        try:
            return probe_size(head, name=image.path)
        except DecodeError:
            return probe_size(image.read(), name=image.path) if len(head) == HEADER_BYTES else None
    except (OSError, DecodeError):
        return None


def read_mask(path: str) -> np.ndarray:
    """Return the values of a palette or grey mask image as H x W uint8.

    Raises:
        DecodeError: it cannot be read.
    """
    try:
        with Image.open(path) as mask:
            return np.asarray(mask, dtype=np.uint8)
    except (OSError, ValueError) as err:
        raise DecodeError(f"{path}: cannot read the mask: {err}") from err
