"""The kinds of field that tables and manifests bring: a set of classes, a JSON value.

``MultiLabelField`` holds several class ids per sample (a multi-label set) and lists the
class names in the pack's field listing, as ``/classes`` does for the label; ``JSONField``
holds any JSON value per sample (a manifest's object, a WebDataset ``.json``) as its UTF-8
text. Both are stored like the other variable-length fields (``core.fieldkinds``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from h5pack.core.fieldkinds import RaggedField, TextField
from h5pack.errors import OptionsError


@dataclass(frozen=True)
class MultiLabelField(RaggedField):
    """Several class ids per sample (int64, in ``0 .. len(classes) - 1``) and their names.

    A sample's value reads back as its ids, in the order given; ``classes[i]`` names id
    ``i``. A batch is a list of id tensors.

    Attributes:
        classes: The class names, listed in the pack's field listing.
    """

    dtype: str = "<i8"
    classes: tuple[str, ...] = ()
    kind: ClassVar[str] = "multilabel"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        if np.dtype(self.dtype).kind not in "iu" or self.dims != ():
            raise OptionsError(
                f"field {self.name!r} holds class ids: dtype should be an integer and dims (), "
                f"but got dtype={self.dtype} and dims={self.dims}"
            )

    def to_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"name": self.name, "kind": self.kind, "classes": list(self.classes)}

    def _value(self, value: Any) -> np.ndarray:
        ids = super()._value(value)
        outside = ids[(ids < 0) | (ids >= len(self.classes))]
        if outside.size:
            raise OptionsError(
                f"field {self.name!r} holds ids of its {len(self.classes)} classes, but got "
                f"{int(outside[0])}"
            )
        return ids

    def names(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Return the class names of ``ids`` (one sample's value)."""
        return [self.classes[int(i)] for i in ids]


@dataclass(frozen=True)
class JSONField(TextField):
    """A JSON value per sample (an object, a list, a number...), stored as its UTF-8 text."""

    kind: ClassVar[str] = "json"

    def _value(self, value: Any) -> np.ndarray:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise OptionsError(f"field {self.name!r} holds JSON values: {err}") from err
        return super()._value(text)

    def _shaped(self, value: np.ndarray, shape: np.ndarray) -> Any:
        return json.loads(value.tobytes().decode("utf-8"))
