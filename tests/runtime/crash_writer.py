"""Writer process for the crash test (`test_crash_recovery.py`).

Run as `python -m tests.runtime.crash_writer DATA_DIR` (or by path) with the repo root
on PYTHONPATH. It opens a `RuntimeNode` with `CounterMachine` on DATA_DIR, recovers,
prints one `RECOVERED ...` line, then submits numbered batches as fast as it can and
prints `ACK <first_position> <count> <batch_id>` once each batch is durable. It never
stops by itself: the test SIGKILLs it.

Batch `b` holds `1..50` increments, all derived from `b` alone, so the test can rebuild
the exact state the first `B` batches produce. Even-numbered commands of batch `b`
increment key `b` (so key `b` equals `marker_value(b)` exactly when every one of those
commands was applied), odd-numbered ones increment a small set of shared keys. Batches
form a prefix: after recovery the writer resumes at `max(batch key) + 1`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import types
from collections import deque
from pathlib import Path

import structlog

from services.runtime import file_log
from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.file_log import FileLogStore
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import Receipt, SequencerSettings

SHARED_BASE = 1 << 40
SHARED_KEYS = 64
MAX_COMMANDS = 50
WINDOW = 8
SEGMENT_BYTES = 64 * 1024
CHECKPOINT_INTERVAL = 1_000
SNAPSHOT_INTERVAL = 5_000
DROP_DSYNC_ENV = "CRASH_WRITER_DROP_DSYNC"


def batch_size(batch_id: int) -> int:
    return 1 + (batch_id * 2_654_435_761 >> 7) % MAX_COMMANDS


def batch_commands(batch_id: int) -> list[tuple[int, int]]:
    """The (key, delta) increments of batch `batch_id`, a pure function of the id."""
    commands = []
    for index in range(batch_size(batch_id)):
        if index % 2 == 0:
            commands.append((batch_id, 1))
        else:
            commands.append(
                (SHARED_BASE + (batch_id * 31 + index) % SHARED_KEYS, batch_id % 13 + 1)
            )
    return commands


def marker_value(batch_id: int) -> int:
    """What key `batch_id` holds once the whole batch is applied."""
    return (batch_size(batch_id) + 1) // 2


def next_batch_id(counters: dict[int, int]) -> int:
    batch_keys = [key for key in counters if key < SHARED_BASE]
    return max(batch_keys, default=0) + 1


def node_for(data_dir: Path) -> RuntimeNode[tuple[int, int | None]]:
    settings = NodeSettings(
        data_dir=data_dir,
        checkpoint_interval_entries=CHECKPOINT_INTERVAL,
        snapshot_interval_entries=SNAPSHOT_INTERVAL,
        snapshots_retained=2,
        sequencer=SequencerSettings(timer_interval_ms=20),
    )
    log_store = FileLogStore(data_dir / "log", segment_bytes=SEGMENT_BYTES)
    return RuntimeNode(CounterMachine(), settings, log_store=log_store)


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _pump(node: RuntimeNode[tuple[int, int | None]], first_batch: int) -> None:
    in_flight: deque[tuple[int, int, asyncio.Future[Receipt[tuple[int, int | None]]]]] = deque()
    batch_id = first_batch
    while True:
        while len(in_flight) < WINDOW:
            payloads = [encode_increment(key, delta) for key, delta in batch_commands(batch_id)]
            future = node.sequencer.submit_many(payloads)
            in_flight.append((batch_id, len(payloads), future))
            batch_id += 1
        acked_id, count, future = in_flight.popleft()
        receipt = await future
        _emit(f"ACK {receipt.first_position} {count} {acked_id}")


async def main(data_dir: Path) -> None:
    node = node_for(data_dir)
    report = await node.recover()
    machine = node.replica.machine
    assert isinstance(machine, CounterMachine)
    first_batch = next_batch_id(machine.counters)
    _emit(
        f"RECOVERED {report.applied_position} {report.snapshot_position} "
        f"{report.replayed_entries} {report.torn_bytes_dropped} "
        f"{machine.state_hash().hex()} {first_batch}"
    )
    run_task = asyncio.create_task(node.run())
    await asyncio.gather(run_task, _pump(node, first_batch))


def forget_o_dsync() -> None:
    """Become a build whose log forgot `O_DSYNC`: the power-cut test's control
    (`tests/power_cut/test_log_power_cut.py`) shows such a build loses acknowledged
    batches at a power cut, so the test would catch it."""
    vars(file_log)["os"] = types.SimpleNamespace(**{**vars(os), "O_DSYNC": 0})


if __name__ == "__main__":
    if os.environ.get(DROP_DSYNC_ENV) == "1":
        forget_o_dsync()
    # Logs go to stderr so stdout carries only the protocol lines.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )
    asyncio.run(main(Path(sys.argv[1])))
