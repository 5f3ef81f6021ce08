"""Servers in these tests keep their data where their unprivileged user can reach it;
`running_mesh`: one default mesh (`oms up`) for a whole test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mesh.up_process import RunningMesh, running_up
from tests.server_folders import server_reachable_folder


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    with server_reachable_folder("oms-test-") as folder:
        yield folder


@pytest.fixture(scope="module")
def running_mesh() -> Iterator[RunningMesh]:
    """The default mesh (`oms up`, as `make run` runs it: one replica per group, one shard
    cluster, TLS, its own etcd and PostgreSQL), started once for the module that asks for
    it and stopped after its last test. `running_mesh.oms(...)` and `.omsctl(...)` run
    the tools as subprocesses, the folder named by `OMS_STATE_DIR` in
    `running_mesh.environment` (so the manual's commands run as written);
    `running_mesh.state_dir` is the folder, for a `--state-dir`."""
    with server_reachable_folder("oms-mesh-") as folder, running_up(folder / "state") as mesh:
        yield mesh
