"""Temporary folders that server processes running as another user can reach.

PostgreSQL refuses to run as root, so the embedded server runs as an unprivileged
user. pytest keeps its base temp folder at mode 0700 and resets it whenever a
session starts, which would lock that user out of data folders under `tmp_path`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def server_reachable_folder(prefix: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
