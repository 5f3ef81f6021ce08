"""One reconcile round: a capped window of the shard's users against their matchers.

Each round takes the next `max_users` resident users after the cursor
(`ListUsers`, all of them, not only those with orders: a user with no open
order can still have a phantom at the matcher or a leaked reservation) and
wraps to the start at the end. For the window it reads, per matcher group, the
matcher's open orders of those users (one `GetOpenOrderBatch` per group, each
snapshot stamped `as_of_sequence`), then the shard's actors (one
`GetActorBatch`): a round costs a handful of calls whatever the window, where a
call per user and group once kept an idle mesh at a tenth of a core. A report
is one `Reconcile` command per (user, group); the shard applies it once it has
applied that sequence.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import grpc
import structlog

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc, shard_pb2, shard_pb2_grpc
from services.reconciler.drift import (
    MAX_LOOKS,
    GroupOf,
    UserFinding,
    look,
    stable_drift,
)
from services.serving.user_batches import user_chunks

log = structlog.get_logger(__name__)
QUERY_TIMEOUT_S = 10.0


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


class ReconcileSweep:
    def __init__(
        self,
        *,
        shard: shard_pb2_grpc.UserShardStub,
        matchers: Mapping[str, matcher_pb2_grpc.MatcherStub],
        shard_id: str,
        group_of: GroupOf,
        max_users: int,
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
        stable = stable_drift(first, second)
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
        findings: list[UserFinding] = []
        for chunk in user_chunks(users):
            findings.extend(await self._check_chunk(chunk))
        return findings

    async def _check_chunk(self, users: Sequence[int]) -> list[UserFinding]:
        if not users:
            return []
        # The matchers first, then the shard: what a matcher lists is then either in the
        # shard's index or on its way out through an event emitted after the snapshot.
        per_group = await asyncio.gather(
            *(self._open_orders(group, stub, users) for group, stub in self.matchers.items())
        )
        actors = await self.shard.GetActorBatch(
            shard_pb2.ActorBatchQuery(user_ids=users), timeout=QUERY_TIMEOUT_S
        )
        findings = []
        for index, (user_id, view) in enumerate(zip(users, actors.views, strict=True)):
            snapshots = {
                group: per_user[index]
                for group, per_user in zip(self.matchers, per_group, strict=True)
                if per_user is not None
            }
            finding = look(user_id, view, snapshots, self.group_of)
            findings.append(finding)
        return findings

    async def _open_orders(
        self, group: str, stub: matcher_pb2_grpc.MatcherStub, users: Sequence[int]
    ) -> Sequence[matcher_pb2.OpenOrdersSnapshot] | None:
        """The matcher's snapshots, one per user in order; None (this group skipped for
        these users this round) if it is unreachable."""
        try:
            batch: matcher_pb2.OpenOrdersBatch = await stub.GetOpenOrderBatch(
                matcher_pb2.OpenOrdersBatchQuery(oms_shard=self.shard_id, user_ids=users),
                timeout=QUERY_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            self.counters.matcher_errors += len(users)
            log.warning(
                "reconciler.matcher_unreachable", matcher_group=group, error=error.code().name
            )
            return None
        return batch.snapshots
