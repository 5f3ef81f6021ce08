"""`oms bench runtime --log both` runs both log backends and prints them in one table.

A smoke test of the benchmark's plumbing (leader key, fenced appends, cleanup),
never of its figures: the session's etcd runs without fsync, and each phase lasts
a fifth of a second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import pytest

from services.bench import runtime_bench
from services.coordination.etcd_session import EtcdSession, prefix_end

ROW_LABELS = ("closed-loop", "open-loop")


def _arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    runtime_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


async def _keys_of_this_process(endpoints: tuple[str, ...]) -> list[bytes]:
    # The benchmark's group name starts with its process id: this test's own keys.
    prefix = f"/oms/v1/bench/runtime/{os.getpid()}-".encode()
    async with EtcdSession(endpoints) as session:
        return [entry.key for entry in await session.range(prefix, prefix_end(prefix))]


def test_both_backends_print_side_by_side_and_leave_no_keys(
    etcd_endpoints: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("OMS_ETCD_ENDPOINTS", ",".join(etcd_endpoints))
    arguments = _arguments(
        "--log", "both", "--seconds", "0.2", "--settle-seconds", "0.05",
        "--rates", "2000", "--snapshot-entries", "0", "--dir", str(tmp_path),
    )  # fmt: skip

    runtime_bench.measure(arguments)

    lines = capsys.readouterr().out.splitlines()
    header_at = next(index for index, line in enumerate(lines) if line.startswith("phase"))
    groups = [cell.strip() for cell in lines[header_at - 1].split("|")]
    assert groups[1:3] == ["file log", "etcd log"]
    rows = [line for line in lines if line.startswith(ROW_LABELS)]
    assert [row.split()[:2] for row in rows] == [["closed-loop", "max"], ["open-loop", "2,000"]]
    for row in rows:
        _, file_cells, etcd_cells, *_ = row.split("|")
        for cells in (file_cells, etcd_cells):
            durable_per_second, p50_ms, p99_ms, per_batch, *writes = cells.split()
            assert float(durable_per_second.replace(",", "")) > 0
            assert 0 < float(p50_ms) <= float(p99_ms)
            assert float(per_batch) > 0
            if row.startswith("open-loop"):  # each write's or append's own time
                write_p50, slash, write_p99 = writes
                assert slash == "/" and 0 < float(write_p50) <= float(write_p99)
            else:
                assert writes == []
    assert any(line.startswith("machine: ") and "load average" in line for line in lines)
    assert asyncio.run(_keys_of_this_process(etcd_endpoints)) == []
