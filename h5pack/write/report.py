"""What a conversion tells its caller: events as it runs, a report when it is done."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from h5pack.core import format as fmt
from h5pack.core.format import SkippedFile
from h5pack.write.plan import StoragePlan

EventKind = Literal["scanned", "phase", "mode", "skipped", "note"]


@dataclass(frozen=True)
class ConvertEvent:
    """Something a user should hear about during a conversion (a ``"phase"`` of ``total`` steps)."""

    kind: EventKind
    message: str
    total: int | None = None
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConvertReport:
    """What a conversion did: the pack, its metadata, the samples found, packed and skipped."""

    path: str
    meta: fmt.PackMeta
    num_samples: int
    num_found: int
    skipped: tuple[SkippedFile, ...]
    mode: str
    storage: str
    reason: str
    elapsed_s: float
    file_bytes: int

    @property
    def images_per_s(self) -> float:
        """Files processed per second, over the whole conversion."""
        return self.num_found / self.elapsed_s if self.elapsed_s > 0 else float("inf")


def make_report(
    path: Path, plan: StoragePlan, num_found: int, skipped: Sequence[SkippedFile], started: float
) -> ConvertReport:
    """Return the report of a finished conversion."""
    meta = fmt.load_meta(path)
    return ConvertReport(
        path=os.fspath(path),
        meta=meta,
        num_samples=meta.num_samples,
        num_found=num_found,
        skipped=tuple(skipped),
        mode=plan.mode,
        storage=plan.storage,
        reason=plan.reason,
        elapsed_s=time.perf_counter() - started,
        file_bytes=path.stat().st_size,
    )
