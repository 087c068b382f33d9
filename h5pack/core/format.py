"""The on-disk format of a pack (version 1.1; docs/format.md is its normative description).

Writers and readers import every name of the format from here: the names (``core.names``),
opening a pack (``core.opening``) and its metadata (``core.readmeta``).
"""

from h5pack.core.names import *  # noqa: F403
from h5pack.core.opening import *  # noqa: F403
from h5pack.core.readmeta import *  # noqa: F403
