"""What ``h5pack verify`` reports: ``Problem`` and ``VerifyReport``, shared by every check."""

from __future__ import annotations

from dataclasses import dataclass

# Mean absolute difference (levels) below which decoded pixels count as the same image:
# decoder versions differ by a level here and there, an edited image by far more.
DEFAULT_TOLERANCE = 1.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong: the sample (index within ``shard`` in a set, or None), its path, what.

    ``shard``: in a pack set, the shard file (the manifest for the set as a whole), or "".
    """

    index: int | None
    path: str
    message: str
    shard: str = ""

    def __str__(self) -> str:
        if self.index is not None:
            where = f"sample {self.index}"
        elif self.path:
            where = "source"
        else:
            where = "" if self.shard else "pack"
        if self.path:
            where += f" ({self.path})"
        if self.shard:
            where = f"{self.shard}: {where}" if where else self.shard
        return f"{where}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of ``verify_pack``.

    ``path``: the pack, a set's manifest or its first pack; ``num_verified``: samples whose
    digests matched and that decoded to their shape. With a source: ``missing`` (in the pack,
    not the source), ``extra`` (in the source, not the pack nor skipped), ``skipped`` (by the
    conversion: not a problem), ``mismatched`` labels, ``changed`` content, ``num_compared``.
    """

    path: str
    num_samples: int
    num_verified: int
    problems: tuple[Problem, ...]
    num_shards: int = 0
    num_source: int | None = None
    missing: int = 0
    extra: int = 0
    skipped: int = 0
    mismatched: int = 0
    changed: int = 0
    num_compared: int = 0

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems
