"""The bridge's loops over simulated streams, with the real bridge's conversions.

What `bridge/` does, per step:
- per shard: follow the leader's durable egress from a cursor; a new leader, a
  broken stream or a cursor that left the window means a fresh `GetInFlight`
  (every saga in flight, the matcher sequences applied) and re-driving it;
- per matcher group: send the sagas (`saga_commands.saga_work`/`add_command`) on a
  stream to the group's leader; while the group has no leader, fresh work is shed
  (its next connection re-drives from `GetInFlight`, as `WorkQueue` does);
- per (shard, group): read the leader's events after the last one sent and
  deliver them as `MatcherEvents` commands (`event_commands`) on the stream to
  the shard's leader; a break resumes from the shard's applied sequence.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from bridge.event_commands import event_commands
from bridge.saga_commands import Work, add_command, saga_work
from protos.oms.v1 import matcher_pb2, shard_pb2
from services.matcher.core.errors import SequenceTooOldError
from services.shard.core.codec import egress_to_protobuf
from services.shard.core.egress import CancelToMatcher, SubmitToMatcher
from simulation.core.defects import BRIDGE_FORGETS_IN_FLIGHT
from simulation.core.links import Stream
from simulation.core.process import SimProcess

if TYPE_CHECKING:
    from simulation.core.replica_node import MatcherReplica, ShardReplica
    from simulation.core.world import SimWorld

TICK_MS = 3
COMMANDS_PER_SEND = 64
EVENTS_PER_READ = 256
EVENT_COMMAND_BYTES = 64 * 1024


class SimBridge(SimProcess):
    def __init__(self, world: SimWorld) -> None:
        super().__init__(world, "bridge", TICK_MS)
        self.correlation = 0
        self.boot()

    def boot(self) -> None:
        world = self.world
        self.egress_source: dict[str, str] = {}  # shard -> leader it follows
        self.egress_cursor: dict[str, int] = {}
        self.work: dict[str, list[Work]] = {group: [] for group in world.matcher_groups}
        self.command_streams = {
            group: Stream(world.network, f"bridge→{group}") for group in world.matcher_groups
        }
        self.command_target: dict[str, str] = {}
        self.event_streams = {
            shard: Stream(world.network, f"bridge→{shard}") for shard in world.shard_ids
        }
        self.event_target: dict[str, str] = {}
        self.event_cursor: dict[tuple[str, str], int] = {}
        super().boot()

    def step(self) -> None:
        world = self.world
        for shard in world.shard_ids:
            self._follow_egress(shard)
        for group in world.matcher_groups:
            self._send_work(group)
        for shard in world.shard_ids:
            self._deliver_events(shard)

    # --- sagas -----------------------------------------------------------------------

    def _get_in_flight(self, leader: ShardReplica, group: str | None) -> None:
        """GetInFlight: every saga in flight, re-driven ahead of fresh work."""
        self.world.figures["bridge_redrives"] += 1
        shard = leader.group
        state = leader.machine.state
        by_group: dict[str, list[Work]] = {}
        for item in leader.machine.in_flight_egress():
            if group is not None and item.matcher_group != group:
                continue
            routed = saga_work(egress_to_protobuf(item, leader.replica.applied_position, 0))
            assert routed is not None
            by_group.setdefault(routed[0], []).append(routed[1])
        if self.world.config.defect == BRIDGE_FORGETS_IN_FLIGHT:
            by_group.clear()
        for name, items in sorted(by_group.items()):
            self.work[name][:0] = items
        if group is None:
            self.egress_source[shard] = leader.name
            self.egress_cursor[shard] = leader.replica.applied_position
            for name in self.world.matcher_groups:
                self.event_cursor[(shard, name)] = state.sequences.get(name, 0)

    def _follow_egress(self, shard: str) -> None:
        leader = self.world.leading_replica(shard)
        if leader is None:
            self.egress_source.pop(shard, None)
            return
        if self.egress_source.get(shard) != leader.name:
            self._get_in_flight(leader, None)
            self.event_streams[shard].break_now()
            return
        entries = leader.window_from(self.egress_cursor[shard] + 1)
        if entries is None:
            self.world.figures["bridge_window_exceeded"] += 1
            self._get_in_flight(leader, None)
            return
        for position, consensus_ms, items in entries:
            for item in items:
                if isinstance(item, SubmitToMatcher | CancelToMatcher):
                    routed = saga_work(egress_to_protobuf(item, position, consensus_ms))
                    assert routed is not None
                    self.work[routed[0]].append(routed[1])
            self.egress_cursor[shard] = position
        if entries:
            self.egress_cursor[shard] = max(self.egress_cursor[shard], entries[-1][0])
        self.egress_cursor[shard] = max(self.egress_cursor[shard], leader.replica.applied_position)

    def _send_work(self, group: str) -> None:
        world = self.world
        stream = self.command_streams[group]
        leader = world.leading_replica(group)
        if leader is None:
            stream.break_now()
            self.work[group].clear()  # shed: the next connection re-drives
            return
        if stream.broken or self.command_target.get(group) != leader.name:
            stream.reopen()
            self.command_target[group] = leader.name
            self.work[group].clear()
            for shard in world.shard_ids:
                shard_leader = world.leading_replica(shard)
                if shard_leader is not None and self.egress_source.get(shard) == shard_leader.name:
                    self._get_in_flight(shard_leader, group)
        work = self.work[group]
        while work:
            chunk, work[:] = work[:COMMANDS_PER_SEND], work[COMMANDS_PER_SEND:]
            batch = matcher_pb2.MatcherCommandBatch()
            for item in chunk:
                self.correlation += 1
                add_command(batch, item, self.correlation)
            commands = list(batch.commands)
            if not stream.send(partial(self._to_matcher, leader, commands, group)):
                work.clear()  # the stream broke: re-driven on reconnect
                return

    def _to_matcher(
        self, target: MatcherReplica, commands: list[matcher_pb2.MatcherCommand], group: str
    ) -> None:
        if target.leading:
            target.pending.extend(commands)
        else:
            self.command_streams[group].break_now()

    # --- events ----------------------------------------------------------------------

    def _deliver_events(self, shard: str) -> None:
        world = self.world
        shard_leader = world.leading_replica(shard)
        stream = self.event_streams[shard]
        if shard_leader is None or self.egress_source.get(shard) != shard_leader.name:
            stream.break_now()
            return
        if stream.broken or self.event_target.get(shard) != shard_leader.name:
            stream.reopen()
            self.event_target[shard] = shard_leader.name
            sequences = shard_leader.machine.state.sequences
            for group in world.matcher_groups:
                self.event_cursor[(shard, group)] = sequences.get(group, 0)
        for group in world.matcher_groups:
            matcher = world.leading_replica(group)
            if matcher is None:
                continue
            cursor = self.event_cursor[(shard, group)]
            try:
                events = matcher.machine.events_from(shard, cursor + 1, EVENTS_PER_READ)
            except SequenceTooOldError:
                world.violation("events-gone", f"{group} no longer has {shard}'s {cursor + 1}")
                continue
            if not events:
                continue
            commands = event_commands(group, events, EVENT_COMMAND_BYTES)
            if not stream.send(partial(self._to_shard, shard_leader, commands, shard)):
                return
            self.event_cursor[(shard, group)] = events[-1].sequence

    def _to_shard(
        self, target: ShardReplica, commands: list[shard_pb2.ShardCommand], shard: str
    ) -> None:
        if target.leading:
            target.pending.extend(commands)
        else:
            self.event_streams[shard].break_now()
