"""Samples held in memory (numpy arrays or encoded bytes) as a source: ``write_arrays``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from h5pack.core.fields import Field, columns_of
from h5pack.errors import OptionsError
from h5pack.write.options import ConvertOptions
from h5pack.write.sources.base import Image, Listing, Sample, SampleSource, label_fields


class ArraySource(SampleSource):
    """In-memory samples (HWC or HW uint8 arrays, or encoded bytes), decoded in this process.

    Args:
        samples: The images, all arrays or all bytes.
        labels: One int per sample, ``-1`` for unlabelled.
        classes: Class names; default ``"0".."max label"``.
        paths: A key per sample; default ``sample-000000``...
        fields: More values per sample, by field (``write_arrays``).

    Raises:
        OptionsError: samples, labels, classes, paths or fields do not fit together.
    """

    kind = "arrays"
    parallel = False

    def __init__(
        self,
        samples: Sequence[Image],
        labels: Sequence[int] | np.ndarray,
        *,
        classes: Sequence[str] = (),
        paths: Sequence[str] | None = None,
        fields: Mapping[str | Field, Any] | None = None,
    ) -> None:
        num = len(samples)
        label_array = np.asarray(labels, dtype=np.int64).reshape(-1)
        names = list(paths) if paths is not None else [f"sample-{i:06d}" for i in range(num)]
        if label_array.size != num or len(names) != num:
            raise OptionsError(
                f"samples, labels and paths should have one entry each, but got {num} samples, "
                f"{label_array.size} labels and {len(names)} paths"
            )
        if num == 0:
            raise OptionsError("samples should not be empty")
        classes = tuple(classes) or tuple(str(i) for i in range(int(label_array.max()) + 1))
        if label_array.min() < -1 or label_array.max() >= len(classes):
            raise OptionsError(
                f"labels should be -1 or index the {len(classes)} classes, but got labels in "
                f"{label_array.min()}..{label_array.max()}"
            )
        extra, columns = columns_of(fields or {}, num)
        kinds = {isinstance(s, np.ndarray) for s in samples}
        if len(kinds) > 1:
            raise OptionsError("samples should be all arrays or all encoded bytes, not a mix")
        self.encoded = kinds != {True}
        self.root = "memory"
        self._listing = Listing(
            [
                Sample(name, image, fields)
                for image, name, fields in zip(
                    samples, names, label_fields(label_array.tolist()), strict=True
                )
            ],
            classes,
            fields=extra,
            columns=columns,
        )

    def find(self) -> Listing:
        """Return the samples given."""
        return self._listing

    def check(self, options: ConvertOptions) -> None:
        """Refuse arrays of another shape than ``options.channels`` says, or encoded mode."""
        if self.encoded:
            return
        for i, sample in enumerate(self.samples):
            image = sample.image
            assert isinstance(image, np.ndarray)
            shape_ok = image.ndim == 3 and image.shape[2] == options.channels
            shape_ok = shape_ok or (image.ndim == 2 and options.channels == 1)
            if image.dtype != np.uint8 or not shape_ok or 0 in image.shape:
                raise OptionsError(
                    f"samples[{i}] should be an HWC uint8 array with {options.channels} "
                    f"channel(s), but got shape {image.shape} and dtype {image.dtype}"
                )
        if options.mode == "encoded":
            raise OptionsError("mode 'encoded' needs encoded bytes; these samples are arrays")
