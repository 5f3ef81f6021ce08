"""What the persister tells the shard: hydrations, flush answers, dedup answers, its cursor.

They travel as mesh commands on the shared `ShardLink` (no result comes back).
Each is safe to lose or repeat: the shard asks again for hydrations and dedup
lookups after 5 s of consensus time, drops an answer whose epoch is stale, and
the persister re-sends recent flush answers whenever it reconnects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from protos.oms.v1 import shard_pb2


class AnswerSink(Protocol):
    async def send(self, commands: Sequence[shard_pb2.ShardCommand]) -> None: ...


def hydrate_user(
    user_id: int, epoch: int, state: shard_pb2.UserState | None
) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.hydrate.user_id = user_id
    command.hydrate.epoch = epoch
    command.hydrate.known = state is not None
    if state is not None:
        command.hydrate.state.CopyFrom(state)
    return command


def flush_complete(user_id: int, epoch: int, db_version: int) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.flush_complete.user_id = user_id
    command.flush_complete.epoch = epoch
    command.flush_complete.db_version = db_version
    return command


def flush_refused(user_id: int, epoch: int, reason: str) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.flush_refused.user_id = user_id
    command.flush_refused.epoch = epoch
    command.flush_refused.reason = reason
    return command


def dedup_answer(
    user_id: int, client_order_id: str, original: shard_pb2.RecentResult | None
) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    answer = command.dedup_answer
    answer.user_id = user_id
    answer.client_order_id = client_order_id
    answer.seen = original is not None
    if original is not None:
        answer.original.CopyFrom(original)
    return command


def persisted(through_position: int) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.persisted.through_position = through_position
    return command
