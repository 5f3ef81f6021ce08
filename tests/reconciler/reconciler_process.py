"""A real `oms reconciler` subprocess for tests (see tests/service_process.py)."""

from __future__ import annotations

from tests.service_process import ShardFollowerProcess

ROUND_INTERVAL_MS = 200  # rounds every 0.2 s keep the tests short


class ReconcilerProcess(ShardFollowerProcess):
    subcommand = "reconciler"
    default_environment = {"OMS_RECONCILER_INTERVAL_MS": str(ROUND_INTERVAL_MS)}
