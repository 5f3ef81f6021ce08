"""The shard machine runs on the shared runtime's `Replica`, checkpoints included."""

from __future__ import annotations

from services.runtime.core.log_batch import LogBatch, encode_checkpoint
from services.runtime.core.replica import Replica
from services.runtime.core.state_machine import EntryKind, StateMachine
from services.shard.core.codec import encode_command_batch
from services.shard.core.egress import Egress, ShardResult
from services.shard.core.shard_machine import ShardMachine
from tests.shard.support import ShardDriver, settings


def test_replicas_on_the_runtime_agree_and_verify_checkpoints() -> None:
    driver = ShardDriver()
    machines: list[StateMachine[Egress]] = [ShardMachine(settings()), ShardMachine(settings())]
    leader, follower = (Replica(machine, checkpoint_interval_entries=2) for machine in machines)
    entries: list[tuple[int, bytes]] = [
        (EntryKind.COMMAND, encode_command_batch([driver.hydrate(1, balances={"USDT": 10**6})])),
        (EntryKind.COMMAND, encode_command_batch([driver.place(1, "a"), driver.place(1, "b")])),
        (EntryKind.TIMER, b""),
        (EntryKind.COMMAND, b"not protobuf"),
    ]
    batch = LogBatch(1, 10_000_000, entries)
    outputs = leader.apply_batch(batch)
    assert follower.apply_batch(batch) == outputs
    placed = [item for item in outputs[1] if isinstance(item, ShardResult)]
    assert [result.accepted for result in placed] == [True, True]
    assert outputs[3] == [ShardResult(0, False, 1, 0, False, False, "", 0, False)]
    recorded = leader.latest_hash
    assert recorded is not None
    checkpoint = LogBatch(5, 10_000_001, [(EntryKind.CHECKPOINT, encode_checkpoint(*recorded))])
    follower.apply_batch(checkpoint)
    assert follower.checkpoints_verified == 1
