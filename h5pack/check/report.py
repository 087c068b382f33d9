"""What ``h5pack verify`` reports: ``Problem`` and ``VerifyReport``, shared by every check.

The one module of ``check`` that the pack, set and source checks all import, so that none
of them imports another that imports it back (issue 16.4).
"""

from __future__ import annotations

from dataclasses import dataclass

# Mean absolute difference (0..255 levels) below which decoded pixels count as the same
# image: decoders of different versions differ by a level here and there, a re-encoded,
# edited or rotated image by far more.
DEFAULT_TOLERANCE = 1.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pack: the sample (index, or None) and path concerned, and what.

    Attributes:
        index: The sample (in a pack set, its index within ``shard``), or None.
        path: The sample's (or a source file's) relative path, or "".
        message: What is wrong.
        shard: In a pack set: the shard file concerned (the manifest for the set as a
            whole), or "" when the problem is a source file in no shard.
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

    Attributes:
        path: The pack (a pack set's manifest, or its first pack for a list).
        num_samples: Samples in the pack (set).
        num_verified: Samples whose digests matched and that decoded to their shape.
        problems: Everything found wrong, by sample index and path (and shard).
        num_shards: Shards of a pack set (0 for a pack).
        num_source: Images found in the source folder, when one was given.
        missing: Samples in the pack whose file is not in the source folder.
        extra: Images in the source folder that are not in the pack and were not skipped
            at conversion.
        skipped: Images in the source folder that the conversion skipped (the pack
            records them): accounted for, not a problem.
        mismatched: Samples whose label differs from the source's.
        changed: Samples whose content differs from their source file's.
        num_compared: Samples whose content was compared with their source file.
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
