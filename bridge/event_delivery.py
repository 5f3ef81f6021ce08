"""Matcher events into the shard: `MatcherEvents` commands on the session's ShardLink.

Events read from a matcher's Subscribe stream become commands of many events
each; the link puts every command queued in one loop turn into one
`ShardCommandBatch` (many commands per batch, at most `MAX_COMMANDS_PER_BATCH`).
The shard logs a batch as one entry and refuses an entry over its byte cap,
so each command is cut at `shard_batch_bytes / MAX_COMMANDS_PER_BATCH`: even a
full batch of them fits, however large a backlog the bridge is catching up on.

Delivery is at least once: the shard drops sequences it has already applied,
so a resume that starts earlier than needed is harmless; the bridge never
starts later than the shard's last applied sequence + 1 unless the matcher no
longer has the events.
"""

from __future__ import annotations

from collections.abc import Sequence

from bridge.event_commands import event_commands
from bridge.statistics import BridgeStatistics
from protos.oms.v1 import matcher_pb2, shard_pb2
from services.clients.shard_link import MAX_COMMANDS_PER_BATCH, ShardLink


class EventDelivery:
    def __init__(
        self, link: ShardLink, statistics: BridgeStatistics, *, shard_batch_bytes: int
    ) -> None:
        self.link = link
        self.statistics = statistics
        self.command_bytes = shard_batch_bytes // MAX_COMMANDS_PER_BATCH
        if self.command_bytes < 512:
            raise ValueError(f"shard batch budget of {shard_batch_bytes} bytes is too small")

    def commands(
        self, group: str, events: Sequence[matcher_pb2.MatcherEvent]
    ) -> list[shard_pb2.ShardCommand]:
        """`events` as MatcherEvents commands of at most `command_bytes` each (one at least)."""
        return event_commands(group, events, self.command_bytes)

    async def deliver(self, group: str, events: Sequence[matcher_pb2.MatcherEvent]) -> None:
        if not events:
            return
        await self.link.send(self.commands(group, events))
        self.statistics.counters.events_delivered += len(events)
        self.statistics.last_delivered[group] = events[-1].sequence
