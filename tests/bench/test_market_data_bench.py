"""`oms bench marketdata` at a tiny size: a whole `oms up` mesh with four symbols, a phase
without subscribers, one with a few spread over two processes of their own, one without
again; its table, slow-consumer lines, saturation estimate and goals printed, the
subscribers' messages counted and timed, and nothing left behind.

A smoke test of the benchmark's plumbing (the markets file reaching every service, the
subscriber processes and their line protocol, the service's counters), never of its
figures beyond their being there.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.bench.market_data_bench import MARKETS_FILE_VARIABLE, SUBSCRIBER_MODULE, _header
from services.command_line import main
from services.transport.tls import use_transports

SUBSCRIBERS = 6
PROCESSES = 2
COLUMNS = [
    "subs",
    "procs",
    "orders/s",
    "msgs/s",
    "/sub/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "match µs",
    "svc µs",
    "+svc µs",
    "µs/upd",
    "svc %",
    "RSS MiB",
    "KiB/sub",
    "cli µs",
    "resync",
    "ended",
]


@pytest.fixture
def own_transports() -> Iterator[None]:
    """The bench adopts the mesh's transports for this process: the next test gets its own."""
    yield
    use_transports(None, None)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def _bench_processes() -> list[str]:
    """What the bench started and may have left: the mesh's services, the subscribers."""
    command_lines = []
    for pid in _descendants(os.getpid()):
        try:
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone meanwhile
        if b"services.command_line" in command_line or SUBSCRIBER_MODULE.encode() in command_line:
            command_lines.append(command_line.decode(errors="replace"))
    return command_lines


def _cells(line: str) -> dict[str, float]:
    return {
        column: float(cell.replace(",", ""))
        for column, cell in zip(COLUMNS, line.split(), strict=True)
    }


@pytest.mark.timeout(280)
@pytest.mark.usefixtures("own_transports")
def test_a_tiny_run_prints_its_table_and_leaves_nothing_behind(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The run's own temporary folder lands here, to be found gone at the end.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    markets_file_before = os.environ.get(MARKETS_FILE_VARIABLE)

    code = main(
        [
            "bench",
            "marketdata",
            "--subscribers",
            str(SUBSCRIBERS),
            "--subscriber-processes",
            str(PROCESSES),
            "--seconds",
            "2",
            "--rate",
            "40",
            "--levels",
            "10",
            "--plaintext",
        ]
    )

    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("symbols: "), lines[0]
    assert len(lines[0].removeprefix("symbols: ").split(" (")[0].split(", ")) == 4, lines[0]
    # The report's table: its header, then a row per phase.
    title = next(i for i, line in enumerate(lines) if line.startswith("oms bench marketdata: "))
    assert lines[title + 1] == _header()
    assert lines[title + 1].split()[-2:] == COLUMNS[-2:]
    rows = [_cells(line) for line in lines[title + 2 : title + 5]]
    assert [row["subs"] for row in rows] == [0, SUBSCRIBERS, 0]
    assert [row["procs"] for row in rows] == [0, PROCESSES, 0]
    without, with_subscribers, again = rows
    for row in rows:
        assert row["orders/s"] > 0, lines
        assert row["match µs"] > 0, lines
        assert row["RSS MiB"] > 0, lines
    assert math.isnan(without["msgs/s"]) or without["msgs/s"] == 0
    # Every taker trades and moves a book: the subscribers got messages and timed them.
    assert with_subscribers["msgs/s"] > 0, lines
    for column in ("p50 ms", "p99 ms", "max ms", "svc µs", "cli µs"):
        assert not math.isnan(with_subscribers[column]), (column, lines)
    assert with_subscribers["p50 ms"] <= with_subscribers["p99 ms"] <= with_subscribers["max ms"]
    assert math.isnan(again["p50 ms"])

    slow = [line for line in lines if line.startswith(f"  {SUBSCRIBERS} subscribers: ")]
    assert len(slow) == 1 and " 0 broken chains" in slow[0], lines
    # The saturation estimate: a row for the phase with subscribers.
    estimate = next(i for i, line in enumerate(lines) if line.startswith("saturation of the "))
    assert lines[estimate + 1].split()[:4] == ["subs", "msgs/s/sub", "+svc", "µs"]
    assert lines[estimate + 2].split()[0] == str(SUBSCRIBERS), lines[estimate:]
    goals = lines[lines.index("goals (the figure, then the goal):") + 1 :]
    assert goals[0] == "  p99 delay with 100 subscribers: no such phase"
    assert goals[1].startswith(f"  service CPU per delivered message with {SUBSCRIBERS} subscr")
    assert goals[2].startswith(f"  matcher CPU per order with {SUBSCRIBERS} subscribers ")
    assert goals[1].endswith(("met", "NOT met")) and goals[2].endswith(("met", "NOT met"))

    assert os.environ.get(MARKETS_FILE_VARIABLE) == markets_file_before
    assert _bench_processes() == []
    assert list(temporary.iterdir()) == []
