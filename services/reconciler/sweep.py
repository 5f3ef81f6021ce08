"""One reconcile round: a capped window of the shard's users against their matchers.

Each round takes the next `max_users` resident users after the cursor
(`ListUsers`, all of them, not only those with orders: a user with no open
order can still have a phantom at the matcher or a leaked reservation) and
wraps to the start at the end. For each user it reads the shard's actor and,
per matcher group, the matcher's open orders of that user (`GetOpenOrders`,
stamped `as_of_sequence`). A report is one `Reconcile` command per (user,
group); the shard applies it once it has applied that sequence.

With `only_on_drift` (the default) a report is sent only where the two sides
disagree, and still disagree when looked at again after the whole round (an
event in transit explains most first disagreements). A report the shard
applies after newer events of the same user could misjudge them, so fewer
reports means fewer chances of that; without the filter every (user, group)
is reported every round, as the bare design says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TypeVar

import grpc
import structlog

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc, shard_pb2, shard_pb2_grpc
from services.reconciler.drift import GroupOf, group_drift, leaked_reservation

log = structlog.get_logger(__name__)
QUERY_TIMEOUT_S = 10.0
T = TypeVar("T")


@dataclass
class ReconcilerCounters:
    rounds: int = 0
    users_checked: int = 0
    reports_sent: int = 0
    users_drifting: int = 0  # disagreements seen at first look
    drift_confirmed: int = 0  # (user, group) still disagreeing at the second look
    round_errors: int = 0  # rounds lost to the shard being unreachable
    matcher_errors: int = 0  # (user, group) checks skipped: that matcher was unreachable
    window_wraps: int = 0  # the cursor passed the last resident user

    def plain(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}


@dataclass
class UserFinding:
    user_id: int
    snapshots: dict[str, matcher_pb2.OpenOrdersSnapshot]
    drift: dict[str, str] = field(default_factory=dict)  # group -> reason

    def reports(self, groups: Iterable[str]) -> list[shard_pb2.ShardCommand]:
        commands = []
        for group in groups:
            snapshot = self.snapshots[group]
            command = shard_pb2.ShardCommand()
            report = command.reconcile
            report.user_id = self.user_id
            report.matcher_group = group
            report.as_of_sequence = snapshot.as_of_sequence
            report.open_orders.extend(snapshot.orders)
            commands.append(command)
        return commands


class ReconcileSweep:
    def __init__(
        self,
        *,
        shard: shard_pb2_grpc.UserShardStub,
        matchers: Mapping[str, matcher_pb2_grpc.MatcherStub],
        shard_id: str,
        group_of: GroupOf,
        max_users: int,
        max_concurrent: int,
        only_on_drift: bool,
        counters: ReconcilerCounters,
    ) -> None:
        self.shard = shard
        self.matchers = dict(sorted(matchers.items()))
        self.shard_id = shard_id
        self.group_of = group_of
        self.max_users = max_users
        self.only_on_drift = only_on_drift
        self.counters = counters
        self.cursor = 0
        self._slots = asyncio.Semaphore(max_concurrent)

    async def round(self) -> list[shard_pb2.ShardCommand]:
        """Check the next window of users; the reports to send to the shard."""
        page = await self.shard.ListUsers(
            shard_pb2.UserPageRequest(after_user_id=self.cursor, limit=self.max_users),
            timeout=QUERY_TIMEOUT_S,
        )
        self.cursor = page.next_after_user_id
        if not self.cursor:
            self.counters.window_wraps += 1
        users = list(page.user_ids)
        findings = await self._check(users)
        self.counters.users_checked += len(users)
        if not self.only_on_drift:
            return [report for f in findings for report in f.reports(f.snapshots)]
        suspects = [finding.user_id for finding in findings if finding.drift]
        self.counters.users_drifting += len(suspects)
        if not suspects:
            return []
        reports: list[shard_pb2.ShardCommand] = []
        for finding in await self._check(suspects):
            for group, reason in finding.drift.items():
                log.warning(
                    "reconciler.drift",
                    user_id=finding.user_id,
                    matcher_group=group,
                    as_of_sequence=finding.snapshots[group].as_of_sequence,
                    reason=reason,
                )
            self.counters.drift_confirmed += len(finding.drift)
            reports.extend(finding.reports(finding.drift))
        return reports

    async def _check(self, users: Sequence[int]) -> list[UserFinding]:
        return list(await asyncio.gather(*(self._check_user(user) for user in users)))

    async def _check_user(self, user_id: int) -> UserFinding:
        # The matcher first: an order it still lists then is either in the shard's index
        # when the actor is read, or has left it through an event the matcher emitted
        # after this snapshot (then the second look no longer sees a disagreement).
        snapshots = await asyncio.gather(
            *(
                self._bounded(self._open_orders(group, stub, user_id))
                for group, stub in self.matchers.items()
            )
        )
        view = await self._bounded(
            self.shard.GetActor(shard_pb2.ActorQuery(user_id=user_id), timeout=QUERY_TIMEOUT_S)
        )
        finding = UserFinding(
            user_id,
            {
                group: snapshot
                for group, snapshot in zip(self.matchers, snapshots, strict=True)
                if snapshot is not None
            },
        )
        for group, snapshot in finding.snapshots.items():
            reason = group_drift(view, group, snapshot, self.group_of)
            if reason is not None:
                finding.drift[group] = reason
        leak = leaked_reservation(view)
        if leak is not None and not finding.drift and finding.snapshots:
            # The shard releases unbacked reservations on any report of the user.
            finding.drift[next(iter(finding.snapshots))] = f"leaked reservation: {leak}"
        return finding

    async def _open_orders(
        self, group: str, stub: matcher_pb2_grpc.MatcherStub, user_id: int
    ) -> matcher_pb2.OpenOrdersSnapshot | None:
        """The matcher's snapshot; None (this group skipped this round) if it is unreachable."""
        try:
            snapshot: matcher_pb2.OpenOrdersSnapshot = await stub.GetOpenOrders(
                matcher_pb2.OpenOrdersQuery(oms_shard=self.shard_id, user_id=user_id),
                timeout=QUERY_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            self.counters.matcher_errors += 1
            log.warning(
                "reconciler.matcher_unreachable", matcher_group=group, error=error.code().name
            )
            return None
        return snapshot

    async def _bounded(self, call: Awaitable[T]) -> T:
        async with self._slots:
            return await call
