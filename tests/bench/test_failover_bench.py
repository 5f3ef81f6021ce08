"""`oms bench failover --kills 1` on the session's etcd: a row per group, nothing left behind.

A smoke test of the benchmark's plumbing (replica processes, the leader found and
killed, the load following it to its successor, the cleanup), never of its figures
beyond their being failovers at all. The matcher group gets a name of its own from a
catalog written for the test: on the session's etcd, `g1` is the mesh tests' group
(`oms up --replicas 3`), and the benchmark refuses a group that already has keys.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
from pathlib import Path

import pytest

from services.bench import failover_bench
from services.coordination.etcd_session import EtcdSession, prefix_end
from services.coordination.group_keys import GroupKeys

pytestmark = pytest.mark.slow
# One market of the packaged catalog's g1, under a group no other test uses.
CATALOG = """
[[market]]
symbol = "BTC-USDT"
base_asset = "BTC"
quote_asset = "USDT"
lot_size = 10_000
tick_size = 1
min_notional = 1_000_000
price_band_bps = 1_000
reference_price_ticks = 6_500_000
maker_fee_ppm = 1_000
taker_fee_ppm = 2_000
matcher_group = "{group}"
"""
SECONDS = r"(\d+\.\d\d)"
# The lease (2 s) expires, a follower wins: a figure past this is no failover at all.
FAILOVER_BOUND_S = 2 + failover_bench.FAILOVER_MARGIN_S


def _arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    failover_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


async def _keys_under(endpoints: tuple[str, ...], prefixes: list[bytes]) -> list[bytes]:
    async with EtcdSession(endpoints) as session:
        found: list[bytes] = []
        for prefix in prefixes:
            found += [entry.key for entry in await session.range(prefix, prefix_end(prefix))]
        return found


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (the session's etcd, too: it is this process's child)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def _service_processes() -> list[str]:
    command_lines = []
    for pid in _descendants(os.getpid()):
        try:
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone meanwhile
        if b"services.command_line" in command_line or b"next_release" in command_line:
            command_lines.append(command_line.decode(errors="replace"))
    return command_lines


@pytest.mark.timeout(60)
def test_one_kill_per_group_prints_both_rows_and_leaves_nothing_behind(
    etcd_endpoints: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("OMS_ETCD_ENDPOINTS", ",".join(etcd_endpoints))
    group = f"failover-test-{os.getpid()}"
    markets = tmp_path / "markets.toml"
    markets.write_text(CATALOG.format(group=group))
    arguments = _arguments("--kills", "1", "--matcher-group", group, "--markets-file", str(markets))
    # The run's own temporary folder lands here, to be found gone at the end.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))

    failover_bench.measure(arguments)

    captured = capsys.readouterr()
    assert "warning: OMS_ETCD_ENDPOINTS is set" in captured.err
    lines = captured.out.splitlines()
    header = next(line for line in lines if line.startswith("group "))
    assert header.split() == ["group", "kill", "1", "p50", "s", "max", "s", "goal"]
    rows = {}
    for kind, name in (("shard", r"(failover-\d+-[0-9a-f]+)"), ("matcher", f"({group})")):
        pattern = rf"{kind} {name} +{SECONDS} +{SECONDS} +{SECONDS}   <= 3 s: (met|missed)"
        matches = [found for line in lines if (found := re.fullmatch(pattern, line))]
        assert len(matches) == 1, (kind, lines)
        rows[kind] = matches[0]
    for found in rows.values():
        kill, p50, worst = (float(found.group(index)) for index in (2, 3, 4))
        assert 0 < kill == p50 == worst < FAILOVER_BOUND_S, found.group(0)
    assert any(line.startswith("goal: at most 3 s with a 2 s lease") for line in lines)
    machine = next(line for line in lines if line.startswith("machine: "))
    assert re.search(r"\d+ cores, load average \(1 / 5 / 15 min\) [\d./ ]+ before", machine)
    assert " after" in machine

    shard_id = rows["shard"].group(1)
    prefixes = [
        GroupKeys.of(failover_bench.BENCH_MESH_ID, "shard", shard_id).prefix,
        GroupKeys.of(failover_bench.BENCH_MESH_ID, "matcher", group).prefix,
    ]
    assert asyncio.run(_keys_under(etcd_endpoints, prefixes)) == []
    assert _service_processes() == []
    assert list(temporary.iterdir()) == []
