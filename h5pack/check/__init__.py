"""What is inside a pack (``pack_info``) and whether it is intact (``verify_pack``).

- ``info``: ``PackInfo`` and ``pack_info`` (``h5pack info``).
- ``verify``: ``verify_pack`` (``h5pack verify``): metadata digests, structure, every
  sample's digests and decoding.
- ``source``: ``verify --source``: the pack against the folder it was made from.
- ``probe``: the first open in a child process under a time limit, so that damaged
  metadata is reported instead of hanging (``probe_pack``).
"""

from h5pack.check.info import PackInfo, pack_info
from h5pack.check.probe import PROBE_TIMEOUT_S, probe_pack
from h5pack.check.verify import DEFAULT_TOLERANCE, Problem, VerifyReport, verify_pack

__all__ = [
    "DEFAULT_TOLERANCE",
    "PROBE_TIMEOUT_S",
    "PackInfo",
    "Problem",
    "VerifyReport",
    "pack_info",
    "probe_pack",
    "verify_pack",
]
