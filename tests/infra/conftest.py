"""Servers in these tests keep their data where their unprivileged user can reach it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_folders import server_reachable_folder


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    with server_reachable_folder("oms-test-") as folder:
        yield folder
