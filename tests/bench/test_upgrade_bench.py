"""`oms bench upgrade --groups matcher` on the session's etcd, rolled to the next release:
a row with each replica's figure and the switch to its new version, nothing left behind.

A smoke test of the benchmark's plumbing (graceful stops, the next build started, the
catch-up, the switch through the leader), never of its figures beyond their being
there. The shard's roll is tested for real in `tests/upgrade/test_rolling_upgrade.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
from pathlib import Path

import pytest

from services.bench import failover_bench, upgrade_bench
from services.coordination.group_keys import GroupKeys
from tests.bench.test_failover_bench import CATALOG, _keys_under, _service_processes
from tests.upgrade.next_release import MATCHER_VERSION

pytestmark = pytest.mark.slow


def _arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    upgrade_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.timeout(90)
def test_a_matcher_group_rolled_to_the_next_release_and_switched(
    etcd_endpoints: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("OMS_ETCD_ENDPOINTS", ",".join(etcd_endpoints))
    group = f"upgrade-test-{os.getpid()}"
    markets = tmp_path / "markets.toml"
    markets.write_text(CATALOG.format(group=group))
    arguments = _arguments(
        "--groups",
        "matcher",
        "--next-build",
        "tests.upgrade.next_release",
        "--matcher-group",
        group,
        "--markets-file",
        str(markets),
    )
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))

    upgrade_bench.measure(arguments)

    lines = capsys.readouterr().out.splitlines()
    seconds = r"\d+\.\d\d"
    pattern = (
        rf"matcher {group} +({seconds}) ({seconds}) ({seconds})L +{seconds} +{seconds}"
        # A new matcher group starts at this build's newest version, one below the next.
        rf"  v{MATCHER_VERSION - 1} -> v{MATCHER_VERSION}: {seconds} s"
    )
    assert [line for line in lines if re.fullmatch(pattern, line)], lines
    prefix = GroupKeys.of(failover_bench.BENCH_MESH_ID, "matcher", group).prefix
    assert asyncio.run(_keys_under(etcd_endpoints, [prefix])) == []
    assert _service_processes() == []
    assert list(temporary.iterdir()) == []
