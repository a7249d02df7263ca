"""Where the libfuse release tarballs the suite builds from are (tests/fuse/test_libfuse_matrix.py
builds them, tests/fuse/test_struct_layout.py reads their headers)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# ../shared/libfuse beside the clone (CI); TENSORFS_LIBFUSE_SOURCES names another place.
SOURCES = Path(os.environ.get("TENSORFS_LIBFUSE_SOURCES") or ROOT.parent / "shared" / "libfuse")
