"""The matcher machine on the runtime's pure `Replica`: leader, follower and a restored replica.

Log records are formed the way the sequencer forms them (commands, timer ticks and
CHECKPOINT entries carrying the leader's state hash every K entries); every replica
applies them, verifies the checkpoints, and ends with the same hash and snapshot.
"""

from __future__ import annotations

import random

from services.matcher.core import MatcherEgress, MatcherMachine
from services.runtime.core.log_batch import LogBatch, encode_checkpoint
from services.runtime.core.replica import Replica
from services.runtime.core.state_machine import EntryKind
from tests.matcher import support
from tests.matcher.test_contract import random_commands

INTERVAL = 7  # checkpoint every 7 entries


def test_replicas_agree_on_every_checkpoint_and_after_restore() -> None:
    leader = Replica(MatcherMachine(support.settings(dedup_horizon_ms=150)), INTERVAL)
    follower = Replica(MatcherMachine(support.settings(dedup_horizon_ms=150)), INTERVAL)
    late: Replica[MatcherEgress] | None = None
    rng = random.Random(4)
    entries = random_commands(seed=4, batches=600)
    position = 1
    snapshot: tuple[bytes, int, int] | None = None
    index = 0
    while index < len(entries):
        now = entries[index][0]
        record: list[tuple[int, bytes]] = []
        for _ in range(rng.randint(1, 5)):
            if index == len(entries):
                break
            entry_now, commands = entries[index]
            if entry_now != now:
                break
            if commands is None:
                record.append((int(EntryKind.TIMER), b""))
            else:
                record.append((int(EntryKind.COMMAND), support.batch_bytes(commands)))
            index += 1
        latest = leader.latest_hash
        if latest is not None and rng.random() < 0.5:
            record.append((int(EntryKind.CHECKPOINT), encode_checkpoint(*latest)))
        if not record:
            continue
        batch = LogBatch(position, now, record)
        position += len(record)
        leader_egress = leader.apply_batch(batch)
        follower_egress = follower.apply_batch(batch)
        assert [list(entry) for entry in leader_egress] == [
            list(entry) for entry in follower_egress
        ]
        if late is not None:
            late.apply_batch(batch)
        if snapshot is None and position > 300:
            snapshot = (leader.machine.snapshot(), leader.applied_position, now)
            late = Replica(MatcherMachine(support.settings(dedup_horizon_ms=150)), INTERVAL)
            late.restore(*snapshot)
    assert late is not None
    assert follower.checkpoints_verified > 20
    assert late.checkpoints_verified > 5
    for replica in (follower, late):
        assert replica.machine.state_hash() == leader.machine.state_hash()
        assert replica.machine.snapshot() == leader.machine.snapshot()
