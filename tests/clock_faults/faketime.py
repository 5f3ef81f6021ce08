"""Debian's libfaketime, preloaded into one process to move or speed its wall clock."""

from __future__ import annotations

from pathlib import Path

import pytest

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
needs_libfaketime = pytest.mark.skipif(
    not LIBFAKETIME.exists(),
    reason="no libfaketime: apt-get install faketime (Debian), run as root by `make install`",
)
