"""The reconciler of one shard, with the real reconciler's rules (`services/reconciler/drift.py`).

Each round it looks again at last round's suspects, then at every resident user: the
matchers' open orders of the user (read first), then the shard's view of it
(`actor_view`, what `GetActorBatch` answers). A disagreement unchanged between two
looks a round apart is reported: one `Reconcile` command per (user, group), stamped
with the matcher's sequence, which the shard applies once it has applied that
sequence and judges against its own index. Events are never lost on the simulated
streams, so a report here is either a real drift the shard heals or the reconciler
racing live orders: the checks after every step say which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protos.oms.v1 import shard_pb2
from services.reconciler.drift import MAX_LOOKS, UserFinding, look, stable_drift
from services.shard.actor_view import actor_view
from simulation.core.process import SimProcess

if TYPE_CHECKING:
    from simulation.core.world import SimWorld

ROUND_MS = 400


class SimReconciler(SimProcess):
    def __init__(self, world: SimWorld, shard_id: str) -> None:
        super().__init__(world, f"reconciler {shard_id}", ROUND_MS)
        self.shard_id = shard_id
        groups = {m.symbol: m.matcher_group for m in world.markets}
        self.group_of = groups.get
        self.boot()

    def boot(self) -> None:
        self.suspects: dict[int, UserFinding] = {}
        super().boot()

    def step(self) -> None:
        world = self.world
        shard = world.leading_replica(self.shard_id)
        matchers = {group: world.leading_replica(group) for group in world.matcher_groups}
        if shard is None:
            return
        reports: list[shard_pb2.ShardCommand] = []
        suspects, self.suspects = self.suspects, {}
        for user_id in sorted(suspects):
            first, second = suspects[user_id], self._look(shard, matchers, user_id)
            stable = stable_drift(first, second)
            if len(stable) < len(second.drift):
                second.looks = first.looks + 1
                if second.looks < MAX_LOOKS:
                    self.suspects[user_id] = second
            world.figures["reconcile_drift_confirmed"] += len(stable)
            reports.extend(second.reports(stable))
        for user_id in list(shard.machine.state.actors):
            if user_id in suspects:
                continue
            finding = self._look(shard, matchers, user_id)
            if finding.drift:
                world.figures["reconcile_suspects"] += 1
                self.suspects[user_id] = finding
        if not reports:
            return
        world.figures["reconcile_reports"] += len(reports)

        def arrive() -> None:
            if shard.leading:
                shard.pending.extend(reports)

        world.network.unary(f"reconciler→{self.shard_id}", arrive)

    def _look(self, shard: Any, matchers: dict[str, Any], user_id: int) -> UserFinding:
        snapshots = {
            group: matcher.machine.open_orders(self.shard_id, user_id)
            for group, matcher in matchers.items()
            if matcher is not None
        }
        return look(user_id, actor_view(shard.machine, user_id), snapshots, self.group_of)
