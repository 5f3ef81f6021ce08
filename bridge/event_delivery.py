"""Matcher events into the shard: `MatcherEvents` commands on the session's ShardLink.

Each batch read from a matcher's Subscribe stream becomes one command (many
events per command); the link puts every command queued in one loop turn into
one `ShardCommandBatch` (many commands per batch). Delivery is at least once:
the shard drops sequences it has already applied, so a resume that starts
earlier than needed is harmless; the bridge never starts later than the
shard's last applied sequence + 1 unless the matcher no longer has the events.
"""

from __future__ import annotations

from collections.abc import Sequence

from bridge.statistics import BridgeStatistics
from protos.oms.v1 import matcher_pb2, shard_pb2
from services.clients.shard_link import ShardLink

MAX_EVENTS_PER_COMMAND = 2_000


class EventDelivery:
    def __init__(self, link: ShardLink, statistics: BridgeStatistics) -> None:
        self.link = link
        self.statistics = statistics

    async def deliver(self, group: str, events: Sequence[matcher_pb2.MatcherEvent]) -> None:
        if not events:
            return
        commands = []
        for start in range(0, len(events), MAX_EVENTS_PER_COMMAND):
            command = shard_pb2.ShardCommand()
            command.matcher_events.matcher_group = group
            command.matcher_events.events.extend(events[start : start + MAX_EVENTS_PER_COMMAND])
            commands.append(command)
        await self.link.send(commands)
        self.statistics.counters.events_delivered += len(events)
        self.statistics.last_delivered[group] = events[-1].sequence
