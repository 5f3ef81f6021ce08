"""The quick-usage path of `RuntimeNode`, and the reference machine it is exercised with."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.core.state_machine import ApplyContext
from services.runtime.file_log import FileLogStore
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings
from tests.runtime.node_support import settle


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def node_for(data_dir: Path, clock: FakeClock) -> RuntimeNode[tuple[int, int | None]]:
    settings = NodeSettings(
        data_dir=data_dir,
        checkpoint_interval_entries=100,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(timer_interval_ms=0),
    )
    log_store = FileLogStore(data_dir / "log", segment_bytes=64 * 1024)
    return RuntimeNode(CounterMachine(), settings, log_store=log_store, clock_ms=clock)


async def test_a_submission_resolves_to_a_receipt(tmp_path: Path) -> None:
    """Regression: receipts once raised TypeError on Python 3.11 and killed the sequencer.

    Commit a41fd18 built `Receipt[EgressT](...)`: calling a subscripted generic sets
    `__orig_class__` on the instance, which on a `frozen=True, slots=True` dataclass under
    Python 3.11 raises TypeError ("super(type, obj): obj must be an instance or subtype of
    type"), so `run()` crashed on the first durable batch and no submitter was answered.
    """
    clock = FakeClock(5_000)
    node = node_for(tmp_path, clock)
    report = await node.recover()
    assert report.applied_position == 0
    task = asyncio.create_task(node.run())
    try:
        receipt = await settle(
            node.sequencer.submit_many([encode_increment(1, 5), encode_increment(1, -2)]), task
        )
        assert receipt.first_position == 1
        assert [list(output) for output in receipt.outputs] == [[(1, 5)], [(1, 3)]]
        position, output = await settle(asyncio.ensure_future(node.sequencer.submit(b"bad")), task)
        assert (position, list(output)) == (3, [(0, None)])
        assert node.sequencer.statistics().consensus_time_ms == 5_000
    finally:
        node.stop()
        await asyncio.wait({task}, timeout=10)
        await node.close()
    task.result()


def test_counter_machine_snapshots_every_state_it_accepts() -> None:
    """BUG (reference machine): counters grow past i64 but snapshots pack them as i64.

    `apply` accepts two increments of 2**62 (the counter becomes 2**63), after which
    `snapshot()` raises struct.error: in a node every later snapshot fails and the log is
    never truncated again. Either refuse the overflowing command in egress (as bad input
    is refused) or wrap the value to i64.
    """
    machine = CounterMachine()
    context = ApplyContext(position=1, consensus_time_ms=0)
    machine.apply(encode_increment(9, 2**62), context)
    outputs = machine.apply(encode_increment(9, 2**62), context)
    restored = CounterMachine()
    restored.restore(machine.snapshot())
    assert restored.state_hash() == machine.state_hash()
    assert restored.counters == machine.counters or list(outputs) == [(9, None)]
