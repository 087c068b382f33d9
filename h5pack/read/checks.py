"""Each sample read checked against its recorded digest; a mismatch names the sample.

Format 1.1 packs are checked with their XXH3-64 (``sample_xxh3``); 1.0 packs, or a process
without the xxhash package, with the CRC32 every pack has.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.errors import FormatError

# NOTE [ Checked as copied ]
# A mapped raw sample (NOTE [ Mapped raw reads ] in core.source) is checked where its bytes
# are first touched: its digest computed on the mapping (the cold read), then it is copied
# out of the CPU's cache with a memoryview slice assignment; the crop path checks its views
# inline too (``sample_checks``). A one-pass copy-and-hash in C was retired (decision 0001).


class SampleChecks:
    """The digests one pack's samples are checked against."""

    def __init__(self, meta: fmt.PackMeta, name: Callable[[int], str]) -> None:
        self.path, self._name = meta.path, name
        if meta.sample_xxh3 is not None and integrity.has_sample_digest():
            self.recorded, self.digest_name = meta.sample_xxh3, "XXH3-64"
            self.digest: Callable[[Any], int] = integrity.sample_digest
            fast = integrity.contiguous_sample_digest()
        else:
            self.recorded, self.digest_name = meta.checksums, "CRC32"
            self.digest = integrity.crc32
            fast = zlib.crc32
        # the same digest for C-contiguous samples, called inline (``inline``)
        self.contiguous_digest: Callable[[Any], int] = fast or self.digest

    def inline(self, indices: Sequence[int] | np.ndarray) -> tuple[Callable[[Any], int], list[int]]:
        """``(digest, recorded)``: ``digest(sample) == recorded[k]`` checks ``indices[k]``."""
        recorded: list[int] = self.recorded[np.asarray(indices, dtype=np.int64)].tolist()
        return self.contiguous_digest, recorded

    def one(self, index: int, sample: np.ndarray, group: int | None = None) -> None:
        """Raise ``FormatError`` naming sample ``index`` unless ``sample`` is what was recorded."""
        got, recorded = self.digest(sample), int(self.recorded[index])
        if got == recorded:
            return
        width = 16 if self.digest_name == "XXH3-64" else 8
        where = f" in chunk group {group}" if group is not None else ""
        raise FormatError(
            f"{self.path}: sample {index} ({self._name(index)}){where} does not match its "
            f"checksum ({self.digest_name} {got:0{width}x}, recorded {recorded:0{width}x}); "
            f"the pack is damaged, run `h5pack verify {self.path}`"
        )

    def many(
        self,
        idx: np.ndarray | Sequence[int],
        samples: Sequence[np.ndarray] | np.ndarray,
        group: int | None = None,
    ) -> None:
        """Check ``samples[k]`` as sample ``idx[k]`` (the first mismatch raises)."""
        for i, sample in zip(idx, samples, strict=True):
            self.one(int(i), sample, group)


def copy_mapped(
    idx: np.ndarray,
    order: np.ndarray,
    starts: np.ndarray,
    mapped: np.ndarray,
    out: np.ndarray,
    checks: SampleChecks | None,
) -> None:
    """Copy samples ``idx[order]`` (at ``starts`` in ``mapped``) into ``out``'s rows."""
    size = out[0].nbytes if len(out) else 0
    rows, source = out.reshape(-1).data, mapped.data  # memoryviews: cheap slices
    positions, offsets = order.tolist(), starts.tolist()
    if checks is None:
        for pos, at in zip(positions, offsets, strict=True):
            rows[pos * size : (pos + 1) * size] = source[at : at + size]
        return
    digest, recorded = checks.inline(idx)
    for pos, at in zip(positions, offsets, strict=True):
        sample = source[at : at + size]
        if digest(sample) != recorded[pos]:  # the first touch of its bytes
            checks.one(int(idx[pos]), np.frombuffer(sample, dtype=np.uint8))
        rows[pos * size : (pos + 1) * size] = sample  # out of the CPU's cache
