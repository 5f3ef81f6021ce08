"""One reconcile round: a capped window of the shard's users against their matchers.

Each round takes the next `max_users` resident users after the cursor
(`ListUsers`, all of them, not only those with orders: a user with no open
order can still have a phantom at the matcher or a leaked reservation) and
wraps to the start at the end. For each user it reads, per matcher group, the
matcher's open orders of that user (`GetOpenOrders`, stamped
`as_of_sequence`), then the shard's actor. A report is one `Reconcile`
command per (user, group); the shard applies it once it has applied that
sequence.

With `only_on_drift` (the default) a (user, group) is reported only when the
two sides disagree and nothing moved on either side between two looks one
round apart: the first look makes it a suspect, the next round looks again
first. The shard applies a report as of its sequence but judges it against
its index at the time it applies it, so a report on an actively trading user
can close live orders (see the report of this issue); reporting only stable
disagreements keeps that window to the few milliseconds between the second
look and the shard applying the report. Without the filter every (user,
group) is reported every round, as the bare design says: safe only while the
shard ignores orders that moved after the report's sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TypeVar

import grpc
import structlog

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc, shard_pb2, shard_pb2_grpc
from services.reconciler.drift import (
    Fingerprint,
    GroupOf,
    group_drift,
    group_fingerprint,
    leaked_reservation,
)

log = structlog.get_logger(__name__)
QUERY_TIMEOUT_S = 10.0
MAX_LOOKS = 3  # looks at a suspect that keeps moving before it waits for the next pass
T = TypeVar("T")


@dataclass
class ReconcilerCounters:
    rounds: int = 0
    users_checked: int = 0
    reports_sent: int = 0
    users_drifting: int = 0  # users disagreeing at a first look: suspects for next round
    drift_confirmed: int = 0  # (user, group) disagreeing, unchanged, at the second look
    drift_unsettled: int = 0  # suspects still moving after MAX_LOOKS looks: left for later
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
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)  # group -> both sides
    looks: int = 1

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
        self.suspects: dict[int, UserFinding] = {}  # user -> first look, checked next round
        self._slots = asyncio.Semaphore(max_concurrent)

    async def round(self) -> list[shard_pb2.ShardCommand]:
        """Look again at last round's suspects, then at the next window of users.

        Returns the reports to send to the shard.
        """
        reports: list[shard_pb2.ShardCommand] = []
        suspects, self.suspects = self.suspects, {}
        if suspects:
            for finding in await self._check(list(suspects)):
                reports.extend(self._confirm(suspects[finding.user_id], finding))
        page = await self.shard.ListUsers(
            shard_pb2.UserPageRequest(after_user_id=self.cursor, limit=self.max_users),
            timeout=QUERY_TIMEOUT_S,
        )
        self.cursor = page.next_after_user_id
        if not self.cursor:
            self.counters.window_wraps += 1
        users = [user for user in page.user_ids if user not in suspects]
        findings = await self._check(users)
        self.counters.users_checked += len(users)
        if not self.only_on_drift:
            reports.extend(r for f in findings for r in f.reports(f.snapshots))
            return reports
        for finding in findings:
            if finding.drift and len(self.suspects) < self.max_users:
                self.counters.users_drifting += 1
                self.suspects[finding.user_id] = finding
        return reports

    def _confirm(self, first: UserFinding, second: UserFinding) -> list[shard_pb2.ShardCommand]:
        """Reports for the groups that still disagree, unchanged since the first look."""
        stable = {
            group: reason
            for group, reason in second.drift.items()
            if first.fingerprints.get(group) == second.fingerprints[group]
        }
        if len(stable) < len(second.drift):
            # Still moving: look again next round, a bounded number of times (a user who
            # trades all the time is looked at again when the window comes round).
            second.looks = first.looks + 1
            if second.looks < MAX_LOOKS and len(self.suspects) < self.max_users:
                self.suspects[second.user_id] = second
            else:
                self.counters.drift_unsettled += 1
        for group, reason in stable.items():
            log.warning(
                "reconciler.drift",
                user_id=second.user_id,
                matcher_group=group,
                as_of_sequence=second.snapshots[group].as_of_sequence,
                reason=reason,
            )
        self.counters.drift_confirmed += len(stable)
        return second.reports(stable)

    async def _check(self, users: Sequence[int]) -> list[UserFinding]:
        return list(await asyncio.gather(*(self._check_user(user) for user in users)))

    async def _check_user(self, user_id: int) -> UserFinding:
        # The matcher first, then the shard: what the matcher lists is then either in the
        # shard's index or on its way out through an event emitted after the snapshot.
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
            finding.fingerprints[group] = group_fingerprint(view, group, snapshot, self.group_of)
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
