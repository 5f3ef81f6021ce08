"""Replication properties: any replica, replay or snapshot restore reaches the same state.

A small reference machine written here (a keyed ledger with holds that expire on timer
ticks, fed random and partly malformed bytes) is driven through the pure `Replica` with
random batch splits and consensus-time steps; batches are formed the way the sequencer
forms them, including CHECKPOINT entries carrying the leader's hash. The same properties
are then checked end to end with `CounterMachine` through a `RuntimeNode` on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.core.log_batch import LogBatch, decode_checkpoint, encode_checkpoint
from services.runtime.core.replica import DivergenceError, Replica, ReplicaInvariantError
from services.runtime.core.state_machine import ApplyContext, EntryKind
from services.runtime.file_log import FileLogStore
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings
from tests.runtime.node_support import settle

COMMAND = int(EntryKind.COMMAND)
TIMER = int(EntryKind.TIMER)
CHECKPOINT = int(EntryKind.CHECKPOINT)

# --- the reference machine ---------------------------------------------------------------

Egress = tuple[str, int, int]
DEPOSIT = struct.Struct("<cBH")  # b"D" | key u8 | amount u16
TRANSFER = struct.Struct("<cBBH")  # b"T" | from u8 | to u8 | amount u16
HOLD = struct.Struct("<cBHH")  # b"H" | key u8 | amount u16 | ttl_ms u16


class LedgerMachine:
    """Balances by key; a hold moves funds aside until a timer tick past its expiry.

    Hold ids are the log position of the command, expiries use the consensus time: both
    come from the `ApplyContext`, so a replica that mishandled either would diverge.
    Malformed or refused commands are answered in egress and change nothing.
    """

    version = 1  # one rule set (test_machine_versions.py exercises versions)
    implemented_versions = frozenset({1})

    def __init__(self) -> None:
        self.balances: dict[int, int] = {}
        self.holds: dict[int, tuple[int, int, int]] = {}  # id -> (key, amount, expires_ms)
        self.changed_at: dict[int, int] = {}  # key -> position of its last change
        self.timer_ticks = 0
        self.last_timer_ms = 0

    def _refuse(self, command: bytes, context: ApplyContext) -> Sequence[Egress]:
        return (("refused", context.position, len(command)),)

    def _add(self, key: int, amount: int, position: int) -> int:
        self.balances[key] = self.balances.get(key, 0) + amount
        self.changed_at[key] = position
        return self.balances[key]

    def activate_version(self, version: int) -> None:
        raise AssertionError("the ledger has no version but 1")

    def apply(self, command: bytes, context: ApplyContext) -> Sequence[Egress]:
        op = command[:1]
        position = context.position
        if op == b"D" and len(command) == DEPOSIT.size:
            _, key, amount = DEPOSIT.unpack(command)
            if amount == 0:
                return self._refuse(command, context)
            return (("deposit", key, self._add(key, amount, position)),)
        if op == b"T" and len(command) == TRANSFER.size:
            _, source, target, amount = TRANSFER.unpack(command)
            if source == target or amount == 0 or self.balances.get(source, 0) < amount:
                return self._refuse(command, context)
            return (
                ("debit", source, self._add(source, -amount, position)),
                ("credit", target, self._add(target, amount, position)),
            )
        if op == b"H" and len(command) == HOLD.size:
            _, key, amount, ttl_ms = HOLD.unpack(command)
            if amount == 0 or self.balances.get(key, 0) < amount:
                return self._refuse(command, context)
            self._add(key, -amount, position)
            self.holds[position] = (key, amount, context.consensus_time_ms + ttl_ms)
            return (("hold", position, context.consensus_time_ms + ttl_ms),)
        return self._refuse(command, context)

    def on_timer(self, context: ApplyContext) -> Sequence[Egress]:
        self.timer_ticks += 1
        self.last_timer_ms = context.consensus_time_ms
        released = []
        for hold_id in sorted(self.holds):
            key, amount, expires_ms = self.holds[hold_id]
            if expires_ms <= context.consensus_time_ms:
                del self.holds[hold_id]
                self._add(key, amount, context.position)
                released.append(("released", hold_id, amount))
        return tuple(released)

    def snapshot(self) -> bytes:
        image = {
            "balances": sorted(self.balances.items()),
            "holds": sorted((hold_id, *hold) for hold_id, hold in self.holds.items()),
            "changed_at": sorted(self.changed_at.items()),
            "timer_ticks": self.timer_ticks,
            "last_timer_ms": self.last_timer_ms,
        }
        return json.dumps(image, sort_keys=True, separators=(",", ":")).encode()

    def restore(self, data: bytes) -> None:
        image = json.loads(data)
        self.balances = {key: value for key, value in image["balances"]}
        self.holds = {
            hold_id: (key, amount, expires) for hold_id, key, amount, expires in image["holds"]
        }
        self.changed_at = {key: value for key, value in image["changed_at"]}
        self.timer_ticks = image["timer_ticks"]
        self.last_timer_ms = image["last_timer_ms"]

    def state_hash(self) -> bytes:
        return hashlib.blake2b(self.snapshot(), digest_size=16).digest()


# --- forming batches the way the sequencer does --------------------------------------------


@dataclass
class Boundary:
    """The leader's state right after one batch (or before the first)."""

    position: int
    consensus_time_ms: int
    image: bytes
    state_hash: bytes


@dataclass
class LeaderRun:
    checkpoint_interval: int
    batches: list[LogBatch] = field(default_factory=list)
    outputs: list[list[Sequence[Egress]]] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    recorded_hashes: list[tuple[int, bytes]] = field(default_factory=list)
    checkpoints: int = 0
    final_hash: bytes = b""


def lead(
    messages: list[tuple[int, bytes]],
    sizes: list[int],
    time_steps: list[int],
    checkpoint_interval: int,
) -> LeaderRun:
    """Split `messages` into batches, adding CHECKPOINT entries as the sequencer does."""
    machine = LedgerMachine()
    leader = Replica[Egress](machine, checkpoint_interval)
    run = LeaderRun(checkpoint_interval)
    run.boundaries.append(Boundary(0, 0, machine.snapshot(), machine.state_hash()))
    last_sent = 0
    consensus_time_ms = time_steps[0]
    cursor = 0
    step = 0
    while cursor < len(messages):
        size = sizes[step % len(sizes)]
        entries = list(messages[cursor : cursor + size])
        cursor += size
        latest = leader.latest_hash
        if latest is not None and latest[0] > last_sent:
            entries.append((CHECKPOINT, encode_checkpoint(*latest)))
            last_sent = latest[0]
            run.checkpoints += 1
        step += 1
        consensus_time_ms += time_steps[step % len(time_steps)]
        if not entries:
            continue
        batch = LogBatch(leader.applied_position + 1, consensus_time_ms, entries)
        run.outputs.append(leader.apply_batch(batch))
        run.batches.append(batch)
        run.boundaries.append(
            Boundary(
                leader.applied_position, consensus_time_ms, machine.snapshot(), machine.state_hash()
            )
        )
    assert leader.checkpoints_verified == run.checkpoints
    run.recorded_hashes = leader.recorded_hashes()
    run.final_hash = machine.state_hash()
    return run


def u16() -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=400)


keys = st.integers(min_value=0, max_value=5)
commands = st.one_of(
    st.builds(lambda key, amount: DEPOSIT.pack(b"D", key, amount), keys, u16()),
    st.builds(lambda a, b, amount: TRANSFER.pack(b"T", a, b, amount), keys, keys, u16()),
    st.builds(lambda key, amount, ttl: HOLD.pack(b"H", key, amount, ttl), keys, u16(), u16()),
    st.binary(max_size=8),  # mostly malformed
)
messages_strategy = st.lists(
    st.one_of(commands.map(lambda payload: (COMMAND, payload)), st.just((TIMER, b""))),
    min_size=1,
    max_size=60,
)


@st.composite
def leader_runs(draw: st.DrawFn, min_interval: int = 1, max_interval: int = 12) -> LeaderRun:
    messages = draw(messages_strategy)
    sizes = draw(st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=40))
    if not any(sizes):
        sizes.append(1)
    time_steps = draw(st.lists(st.integers(min_value=0, max_value=90), min_size=1, max_size=40))
    interval = draw(st.integers(min_value=min_interval, max_value=max_interval))
    return lead(messages, sizes, time_steps, interval)


def follower(run: LeaderRun) -> Replica[Egress]:
    return Replica[Egress](LedgerMachine(), run.checkpoint_interval)


# --- pure replica properties -------------------------------------------------------------


@given(leader_runs())
def test_replay_from_scratch_reproduces_state_hashes_and_egress(run: LeaderRun) -> None:
    replica = follower(run)
    outputs = [replica.apply_batch(batch) for batch in run.batches]
    assert outputs == run.outputs
    assert replica.machine.state_hash() == run.final_hash
    assert replica.recorded_hashes() == run.recorded_hashes
    assert replica.applied_position == run.boundaries[-1].position
    assert replica.checkpoints_verified == run.checkpoints


@given(leader_runs())
def test_replay_from_every_batch_boundary_snapshot_converges(run: LeaderRun) -> None:
    for index, boundary in enumerate(run.boundaries):
        machine = LedgerMachine()
        replica = Replica[Egress](machine, run.checkpoint_interval)
        replica.restore(boundary.image, boundary.position, boundary.consensus_time_ms)
        assert machine.state_hash() == boundary.state_hash
        outputs = [replica.apply_batch(batch) for batch in run.batches[index:]]
        assert outputs == run.outputs[index:]
        assert machine.state_hash() == run.final_hash
        assert replica.applied_position == run.boundaries[-1].position
        assert replica.recorded_hashes() == [
            item for item in run.recorded_hashes if item[0] > boundary.position
        ]


@given(leader_runs())
def test_an_independent_replica_agrees_after_every_batch(run: LeaderRun) -> None:
    replica = follower(run)
    for batch, boundary, expected in zip(run.batches, run.boundaries[1:], run.outputs, strict=True):
        assert replica.apply_batch(batch) == expected
        assert replica.applied_position == boundary.position
        assert replica.consensus_time_ms == boundary.consensus_time_ms
        assert replica.machine.state_hash() == boundary.state_hash


def _replace_entry(batch: LogBatch, index: int, entry: tuple[int, bytes]) -> LogBatch:
    entries = list(batch.entries)
    entries[index] = entry
    return LogBatch(batch.first_position, batch.consensus_time_ms, entries)


@given(leader_runs(max_interval=3), st.data())
def test_a_checkpoint_with_a_wrong_hash_raises_divergence(
    run: LeaderRun, data: st.DataObject
) -> None:
    targets = [
        (batch_index, entry_index)
        for batch_index, batch in enumerate(run.batches)
        for entry_index, (kind, _) in enumerate(batch.entries)
        if kind == CHECKPOINT
    ]
    assume(targets)
    batch_index, entry_index = data.draw(st.sampled_from(targets))
    batch = run.batches[batch_index]
    position, digest = decode_checkpoint(batch.entries[entry_index][1])
    wrong = bytes([digest[0] ^ 0x01]) + digest[1:]
    tampered = _replace_entry(batch, entry_index, (CHECKPOINT, encode_checkpoint(position, wrong)))
    replica = follower(run)
    for earlier in run.batches[:batch_index]:
        replica.apply_batch(earlier)
    with pytest.raises(DivergenceError):
        replica.apply_batch(tampered)


def test_a_checkpoint_for_a_future_position_is_refused() -> None:
    replica = Replica[Egress](LedgerMachine(), 1)
    replica.apply_batch(LogBatch(1, 0, [(COMMAND, DEPOSIT.pack(b"D", 1, 5))]))
    own = LogBatch(2, 0, [(CHECKPOINT, encode_checkpoint(2, bytes(16)))])
    with pytest.raises(ReplicaInvariantError, match="future position") as caught:
        replica.apply_batch(own)
    assert type(caught.value) is ReplicaInvariantError


@given(leader_runs(), st.data())
def test_a_position_gap_is_refused_before_anything_is_applied(
    run: LeaderRun, data: st.DataObject
) -> None:
    assume(len(run.batches) >= 2)
    skipped = data.draw(st.integers(min_value=0, max_value=len(run.batches) - 2))
    replica = follower(run)
    for batch in run.batches[:skipped]:
        replica.apply_batch(batch)
    before = (replica.applied_position, replica.machine.state_hash())
    with pytest.raises(ReplicaInvariantError, match="log gap") as caught:
        replica.apply_batch(run.batches[skipped + 1])
    assert type(caught.value) is ReplicaInvariantError
    assert (replica.applied_position, replica.machine.state_hash()) == before
    # Replaying a batch that was already applied is a gap too (a duplicate record).
    if skipped:
        with pytest.raises(ReplicaInvariantError, match="log gap"):
            replica.apply_batch(run.batches[skipped - 1])


@given(leader_runs(), st.data())
def test_consensus_time_going_back_is_refused(run: LeaderRun, data: st.DataObject) -> None:
    candidates = [
        index for index in range(1, len(run.batches)) if run.batches[index - 1].consensus_time_ms
    ]
    assume(candidates)
    index = data.draw(st.sampled_from(candidates))
    previous_time = run.batches[index - 1].consensus_time_ms
    earlier_time = data.draw(st.integers(min_value=0, max_value=previous_time - 1))
    batch = run.batches[index]
    rewound = LogBatch(batch.first_position, earlier_time, batch.entries)
    replica = follower(run)
    for earlier in run.batches[:index]:
        replica.apply_batch(earlier)
    before = (replica.applied_position, replica.consensus_time_ms, replica.machine.state_hash())
    with pytest.raises(ReplicaInvariantError, match="consensus time went back") as caught:
        replica.apply_batch(rewound)
    assert type(caught.value) is ReplicaInvariantError
    assert (replica.applied_position, replica.consensus_time_ms, replica.machine.state_hash()) == (
        before
    )


# --- the same properties end to end: CounterMachine in a RuntimeNode on disk ----------------

Increment = tuple[int, int]
# One step: submissions sent together (so they may share a record), the clock advance
# before them, and whether to take a snapshot once they are durable.
Step = tuple[list[list[Increment]], int, bool]

increments = st.lists(
    st.tuples(st.integers(min_value=0, max_value=24), st.integers(min_value=-999, max_value=999)),
    min_size=1,
    max_size=25,
)
steps_strategy = st.lists(
    st.tuples(
        st.lists(increments, min_size=1, max_size=3),
        st.integers(min_value=0, max_value=120),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class NodeOutcome:
    state_hash: bytes
    applied_position: int
    counters: dict[int, int]
    timer_ticks: int
    snapshot_positions: list[int]


SEGMENT_BYTES = 256 * 1024  # one segment per run: the whole log stays readable from 1


def open_node(
    machine: CounterMachine,
    data_dir: Path,
    checkpoint_interval: int,
    clock: FakeClock | None = None,
) -> RuntimeNode[tuple[int, int | None]]:
    return RuntimeNode(
        machine,
        node_settings(data_dir, checkpoint_interval),
        log_store=FileLogStore(data_dir / "log", segment_bytes=SEGMENT_BYTES),
        clock_ms=clock or FakeClock(0),
    )


def node_settings(data_dir: Path, checkpoint_interval: int) -> NodeSettings:
    return NodeSettings(
        data_dir=data_dir,
        checkpoint_interval_entries=checkpoint_interval,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(timer_interval_ms=50),
    )


async def drive_node(data_dir: Path, steps: list[Step], checkpoint_interval: int) -> NodeOutcome:
    clock = FakeClock(1_000)
    machine = CounterMachine()
    node = open_node(machine, data_dir, checkpoint_interval, clock)
    report = await node.recover()
    assert report.applied_position == 0
    task = asyncio.create_task(node.run())
    expected: dict[int, int] = {}
    snapshot_positions: list[int] = []
    try:
        for submissions, advance, take_snapshot in steps:
            clock.now_ms += advance
            futures = [
                node.sequencer.submit_many([encode_increment(key, delta) for key, delta in sent])
                for sent in submissions
            ]
            receipts = await settle(asyncio.gather(*futures), task)
            durable_position = node.replica.applied_position
            ordered = sorted(
                zip(receipts, submissions, strict=True), key=lambda x: x[0].first_position
            )
            for receipt, sent in ordered:
                assert len(receipt.outputs) == len(sent)
                for (key, delta), output in zip(sent, receipt.outputs, strict=True):
                    expected[key] = expected.get(key, 0) + delta
                    assert list(output) == [(key, expected[key])]
            if take_snapshot:
                # A wake-up of the timer may append a CHECKPOINT-only record meanwhile.
                snapshot_positions.append(await node.snapshot_now())
                assert durable_position <= snapshot_positions[-1] <= node.replica.applied_position
    finally:
        node.stop()
        await task
        await node.close()
    assert machine.counters == expected
    assert node.snapshot_failures == 0, node.last_snapshot_error
    return NodeOutcome(
        machine.state_hash(),
        node.replica.applied_position,
        dict(machine.counters),
        machine.timer_ticks,
        snapshot_positions,
    )


def checkpoint_references(batches: list[LogBatch]) -> list[int]:
    """The positions whose hashes the CHECKPOINT entries of `batches` carry."""
    return [
        decode_checkpoint(payload)[0]
        for batch in batches
        for kind, payload in batch.entries
        if kind == CHECKPOINT
    ]


async def recover_and_compare(
    data_dir: Path, outcome: NodeOutcome, checkpoint_interval: int
) -> None:
    machine = CounterMachine()
    node = open_node(machine, data_dir, checkpoint_interval)
    report = await node.recover()
    try:
        assert report.snapshot_position == max(outcome.snapshot_positions, default=0)
        assert report.applied_position == outcome.applied_position
        assert node.replica.applied_position == outcome.applied_position
        assert machine.state_hash() == outcome.state_hash
        assert machine.counters == outcome.counters
        assert machine.timer_ticks == outcome.timer_ticks
        store = node.log_store
        assert isinstance(store, FileLogStore)
        all_batches = list(store.read_sync(1))
        replayed = [b for b in all_batches if b.last_position > report.snapshot_position]
        assert report.replayed_entries == sum(len(b.entries) for b in replayed)
        verifiable = [p for p in checkpoint_references(replayed) if p > report.snapshot_position]
        assert node.replica.checkpoints_verified == len(verifiable)
        if verifiable:
            assert node.replica.checkpoints_verified > 0
        # A replay of the whole log from an empty machine verifies every checkpoint.
        scratch = Replica(CounterMachine(), checkpoint_interval)
        for batch in all_batches:
            scratch.apply_batch(batch)
        assert scratch.machine.state_hash() == outcome.state_hash
        assert scratch.checkpoints_verified == len(checkpoint_references(all_batches))
    finally:
        await node.close()


@settings(max_examples=40, deadline=None)
@given(steps_strategy, st.integers(min_value=1, max_value=40))
def test_node_on_disk_recovers_to_the_same_state(
    steps: list[Step], checkpoint_interval: int
) -> None:
    with tempfile.TemporaryDirectory(prefix="runtime-prop-") as folder:
        data_dir = Path(folder)
        outcome = asyncio.run(drive_node(data_dir, steps, checkpoint_interval))
        asyncio.run(recover_and_compare(data_dir, outcome, checkpoint_interval))


async def test_node_replay_verifies_checkpoints(tmp_path: Path) -> None:
    """A fixed run with many checkpoints: a from-snapshot recovery still verifies some."""
    steps: list[Step] = [([[(key % 7, key)] * 3], 10, key == 5) for key in range(1, 30)]
    outcome = await drive_node(tmp_path, steps, checkpoint_interval=4)
    machine = CounterMachine()
    node = open_node(machine, tmp_path, 4)
    await node.recover()
    try:
        assert machine.state_hash() == outcome.state_hash
        assert node.replica.checkpoints_verified > 0
    finally:
        await node.close()
