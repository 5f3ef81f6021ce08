"""Matcher events as `MatcherEvents` shard commands, cut to a byte budget.

Pure (no I/O, no event loop): the bridge's `EventDelivery` sends what this makes, and
the whole-mesh simulation (`simulation/`) feeds its shards the same commands.
"""

from __future__ import annotations

from collections.abc import Sequence

from protos.oms.v1 import matcher_pb2, shard_pb2

FIELD_OVERHEAD_BYTES = 8  # tag and length of an event, of a command, of the group name


def event_commands(
    group: str, events: Sequence[matcher_pb2.MatcherEvent], command_bytes: int
) -> list[shard_pb2.ShardCommand]:
    """`events` as MatcherEvents commands of at most `command_bytes` each (one at least)."""
    commands: list[shard_pb2.ShardCommand] = []
    budget = command_bytes - len(group) - 2 * FIELD_OVERHEAD_BYTES
    current: list[matcher_pb2.MatcherEvent] = []
    used = 0
    for event in events:
        size = event.ByteSize() + FIELD_OVERHEAD_BYTES
        if current and used + size > budget:
            commands.append(_command(group, current))
            current, used = [], 0
        current.append(event)
        used += size
    if current:
        commands.append(_command(group, current))
    return commands


def _command(group: str, events: list[matcher_pb2.MatcherEvent]) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.matcher_events.matcher_group = group
    command.matcher_events.events.extend(events)
    return command
