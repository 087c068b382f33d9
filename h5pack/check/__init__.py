"""What is inside a pack or a pack set (``pack_info``) and whether it is intact (``verify_pack``).

- ``info``: ``PackInfo`` and ``pack_info`` (``h5pack info``); ``PackSetInfo`` and
  ``packset_info`` for a pack set or a list of packs (``packset_summary``: with the
  readers' view of it).
- ``verify``: ``verify_pack`` (``h5pack verify``): metadata digests, structure, every
  sample's digests and decoding.
- ``packset``: ``verify_packset``: every shard, the manifest, and the set as a whole.
- ``source``: ``verify --source``: the pack (set) against the folder it was made from.
- ``probe``: the first open in a child process under a time limit, so that damaged
  metadata is reported instead of hanging (``probe_pack``, ``probe_packs``).
"""

from h5pack.check.entry import verify_pack
from h5pack.check.info import (
    PackInfo,
    PackSetInfo,
    ShardRow,
    pack_info,
    packset_info,
    packset_summary,
)
from h5pack.check.packset import verify_packset
from h5pack.check.probe import PROBE_TIMEOUT_S, probe_pack, probe_packs
from h5pack.check.report import DEFAULT_TOLERANCE, Problem, VerifyReport

__all__ = [
    "DEFAULT_TOLERANCE",
    "PROBE_TIMEOUT_S",
    "PackInfo",
    "PackSetInfo",
    "Problem",
    "ShardRow",
    "VerifyReport",
    "pack_info",
    "packset_info",
    "packset_summary",
    "probe_pack",
    "probe_packs",
    "verify_pack",
    "verify_packset",
]
