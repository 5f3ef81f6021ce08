"""`oms gateway` refuses to start on a configuration it cannot serve, and says why."""

from __future__ import annotations

import os
import subprocess
import sys

from services.infra.ports import free_port
from tests.service_process import ROOT


def run_gateway(**environment: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "services.command_line",
            "gateway",
            "--listen",
            f"127.0.0.1:{free_port()}",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **environment},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_matcher_group_without_an_address_stops_the_start() -> None:
    finished = run_gateway(OMS_MATCHERS="g1=127.0.0.1:1")
    assert finished.returncode == 1
    assert "oms gateway: no address for matcher group(s) g2" in finished.stderr


def test_an_admin_key_without_a_secret_stops_the_start() -> None:
    finished = run_gateway(
        OMS_MATCHERS="g1=127.0.0.1:1,g2=127.0.0.1:2",
        OMS_ADMIN_API_KEY="admin",
        OMS_ADMIN_API_SECRET="",
    )
    assert finished.returncode == 1
    assert "OMS_ADMIN_API_SECRET is empty" in finished.stderr
