"""What is inside a pack or a pack set (``h5pack info``) and whether it is intact (``verify``)."""

from h5pack.check.entry import pack_info, verify_pack, verify_packset
from h5pack.check.info import PackInfo, PackSetInfo, ShardRow, packset_info, packset_summary
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
