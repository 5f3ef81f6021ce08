"""The admin API's controls of one user, its user list and the audit.

- SetRiskLimits, HaltUser, ResumeUser, RestartUser: logged shard commands
  (`services/shard/core/operator_controls.py`) routed to the user's shard like any
  client command, carrying the admin key id as the operator and the caller's note.
  The shard decides; its `OperatorAudit` egress becomes the `admin_audit` row, so
  the audit says what was decided at which log position, and replicas agree on it.
  A refusal for the user's state (USER_NOT_FLAT for a restart) is an AdminAck with
  `accepted = false` and the reason; an unknown user is NOT_FOUND/UNKNOWN_USER.
  Each is decided once: it carries the request's id (the caller's, else one made
  here) and the user's control version it is decided against (the caller's, else the
  one read here before sending), so a copy of it decided already is answered again and
  a late one, after another control, is refused CONTROL_VERSION_STALE.
- ListUsers: a page of users from PostgreSQL (every user has a row there), each
  resident one overlaid with its shard's view now (one GetActorBatch per cluster).
- ListAdminAudit: the audit rows, newest first.
"""

from __future__ import annotations

import uuid
from typing import Any

from gateway.authentication import caller
from gateway.clusters import PersisterPool, ShardCluster
from gateway.core.refusals import GatewayError
from gateway.core.validation import check_note, check_request_id, check_risk_limits, check_user_id
from gateway.routing import ShardRouter
from protos.oms.v1 import gateway_pb2, persister_pb2, shard_pb2

Context = Any  # grpc.aio.ServicerContext (grpc ships no type information)
G = gateway_pb2
MAX_PAGE = 1_000
_CONTROLS = {
    "halt": shard_pb2.USER_CONTROL_ACTION_HALT_TRADING,
    "resume": shard_pb2.USER_CONTROL_ACTION_RESUME_TRADING,
    "restart": shard_pb2.USER_CONTROL_ACTION_RESTART,
}
_DONE = {
    "halt": "trading halted",
    "resume": "trading resumed",
    # The shard has begun the flush; the user leaves memory once PostgreSQL has it
    # (ListUsers then shows it cold). Activity before that calls the restart off.
    "restart": "flush to PostgreSQL started; its next command hydrates it afresh",
}


def _page_limit(limit: int) -> int:
    if limit > MAX_PAGE:
        raise GatewayError(G.GATEWAY_ERROR_REASON_OUT_OF_RANGE, f"limit: at most {MAX_PAGE}")
    return limit or 100


class UserAdmin:
    def __init__(self, router: ShardRouter, persister: PersisterPool) -> None:
        self.router = router
        self.persister = persister

    # --- controls -------------------------------------------------------------------

    async def set_risk_limits(
        self, request: gateway_pb2.SetRiskLimitsRequest, context: Context
    ) -> gateway_pb2.AdminAck:
        check_user_id(request.user_id)
        check_risk_limits(request.risk_limits)
        check_note(request.note)
        check_request_id(request.request_id)
        command = shard_pb2.ShardCommand()
        limits = command.set_risk_limits
        limits.user_id = request.user_id
        limits.limits.CopyFrom(request.risk_limits)
        limits.clear_reduce_only = request.clear_reduce_only
        limits.operator = caller.get().api_key
        limits.note = request.note
        limits.request_id = request.request_id or uuid.uuid4().hex
        limits.if_control_version = await self._pinned_version(request)
        result = await self.router.execute(request.user_id, command)
        return self._ack(request.user_id, result, "risk limits set")

    async def halt_user(
        self, request: gateway_pb2.UserControlRequest, context: Context
    ) -> gateway_pb2.AdminAck:
        return await self._control(request, "halt")

    async def resume_user(
        self, request: gateway_pb2.UserControlRequest, context: Context
    ) -> gateway_pb2.AdminAck:
        return await self._control(request, "resume")

    async def restart_user(
        self, request: gateway_pb2.UserControlRequest, context: Context
    ) -> gateway_pb2.AdminAck:
        # The shard accepts a restart of a user it does not hold (nothing to rebuild),
        # which would say nothing of a user id that has no account: ask PostgreSQL.
        check_user_id(request.user_id)
        query = persister_pb2.StoredUserPageQuery(after_user_id=request.user_id - 1, limit=1)
        page = await self.persister.admin_call(
            "ListStoredUsers", query, persister_pb2.StoredUserPage
        )
        if not page.users or page.users[0].state.user_id != request.user_id:
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_UNKNOWN_USER, f"user {request.user_id} is unknown"
            )
        return await self._control(request, "restart")

    async def _control(self, request: gateway_pb2.UserControlRequest, which: str) -> G.AdminAck:
        check_user_id(request.user_id)
        check_note(request.note)
        check_request_id(request.request_id)
        command = shard_pb2.ShardCommand()
        control = command.user_control
        control.user_id = request.user_id
        control.action = _CONTROLS[which]
        control.operator = caller.get().api_key
        control.note = request.note
        control.request_id = request.request_id or uuid.uuid4().hex
        control.if_control_version = await self._pinned_version(request)
        result = await self.router.execute(request.user_id, command)
        return self._ack(request.user_id, result, _DONE[which])

    async def _pinned_version(
        self, request: gateway_pb2.UserControlRequest | gateway_pb2.SetRiskLimitsRequest
    ) -> int:
        """The control version the command is decided against: the caller's, else the
        user's now (its shard's actor when resident, else its PostgreSQL row, which is
        complete for a user no shard holds: a shard lets go only once its flush commits).
        A read that races a hydration or a move is at worst stale: the shard refuses the
        command CONTROL_VERSION_STALE, changing nothing, and the caller asks again."""
        if request.HasField("if_control_version"):
            return request.if_control_version
        user_id = request.user_id
        view = (await self._resident_views([user_id])).get(user_id)
        if view is not None:
            return view.state.control_version
        page = await self._stored_users(
            persister_pb2.StoredUserPageQuery(after_user_id=user_id - 1, limit=1)
        )
        if not page.users or page.users[0].state.user_id != user_id:
            raise GatewayError(G.GATEWAY_ERROR_REASON_UNKNOWN_USER, f"user {user_id} is unknown")
        return page.users[0].state.control_version

    @staticmethod
    def _ack(user_id: int, result: shard_pb2.ShardResult, done: str) -> gateway_pb2.AdminAck:
        reason = result.reject_reason
        if reason == shard_pb2.SHARD_REJECT_REASON_UNKNOWN_USER:
            raise GatewayError(G.GATEWAY_ERROR_REASON_UNKNOWN_USER, f"user {user_id} is unknown")
        if result.accepted:
            return G.AdminAck(accepted=True, detail=f"user {user_id}: {done}")
        name = shard_pb2.ShardRejectReason.Name(reason)
        return G.AdminAck(accepted=False, detail=f"user {user_id}: {name}", reject_reason=reason)

    # --- reads ----------------------------------------------------------------------

    async def list_users(
        self, request: gateway_pb2.ListUsersRequest, context: Context
    ) -> gateway_pb2.UserSummaries:
        query = persister_pb2.StoredUserPageQuery(
            after_user_id=request.after_user_id, limit=_page_limit(request.limit)
        )
        first = await self._stored_users(query)
        hot = await self._resident_views([stored.state.user_id for stored in first.users])
        # PostgreSQL again, after the shards: a shard lets a user go only once its flush
        # is committed, so a user a shard no longer held when asked shows that flush.
        # (Read only before, a user flushed between the two reads would show its row
        # from before the flush: cold, and at the old version.)
        page = await self._stored_users(query)
        asked = {stored.state.user_id for stored in first.users}
        late = [stored.state.user_id for stored in page.users if stored.state.user_id not in asked]
        if late:
            hot.update(await self._resident_views(late))
        summaries = [_cold(stored.state) for stored in page.users]
        for summary in summaries:
            cluster = self.router.routing.route(summary.user_id).cluster
            if cluster is not None:  # else in transit between shards: cold, as served
                summary.cluster = cluster.cluster_id
            view = hot.get(summary.user_id)
            if view is not None:
                _overlay(summary, view)
        return G.UserSummaries(users=summaries, more=page.more)

    async def _stored_users(
        self, query: persister_pb2.StoredUserPageQuery
    ) -> persister_pb2.StoredUserPage:
        return await self.persister.admin_call(
            "ListStoredUsers", query, persister_pb2.StoredUserPage
        )

    async def _resident_views(self, user_ids: list[int]) -> dict[int, shard_pb2.ActorView]:
        """The actors the users' shards hold now, by user (one call per cluster)."""
        by_cluster: dict[str, tuple[ShardCluster, list[int]]] = {}
        for user_id in user_ids:
            cluster = self.router.routing.route(user_id).cluster
            if cluster is not None:
                by_cluster.setdefault(cluster.cluster_id, (cluster, []))[1].append(user_id)
        hot: dict[int, shard_pb2.ActorView] = {}
        for cluster, ids in by_cluster.values():
            batch = await cluster.shard.actor_batch(ids)
            hot.update((view.user_id, view) for view in batch.views if view.resident)
        return hot

    async def list_admin_audit(
        self, request: gateway_pb2.ListAdminAuditRequest, context: Context
    ) -> gateway_pb2.AdminAuditEntries:
        if request.user_id:
            check_user_id(request.user_id)
        query = persister_pb2.AdminAuditQuery(
            user_id=request.user_id,
            before_audit_id=request.before_audit_id,
            limit=_page_limit(request.limit),
        )
        page = await self.persister.admin_call(
            "ListAdminAudit", query, persister_pb2.AdminAuditPage
        )
        # The persister's row and the gateway's entry have the same fields by number.
        entries = [G.AdminAuditEntry.FromString(row.SerializeToString()) for row in page.rows]
        return G.AdminAuditEntries(entries=entries, more=page.more)


def _cold(state: shard_pb2.UserState) -> gateway_pb2.UserSummary:
    summary = G.UserSummary(
        user_id=state.user_id,
        tier=state.tier,
        lifecycle="cold",
        health="healthy",
        trading_halted=state.trading_halted,
        reduce_only=state.reduce_only,
        db_version=state.db_version,
        control_version=state.control_version,
    )
    summary.risk_limits.CopyFrom(state.risk_limits)
    summary.balances.extend(state.balances)
    return summary


def _overlay(summary: gateway_pb2.UserSummary, view: shard_pb2.ActorView) -> None:
    state = view.state
    summary.resident = True
    summary.lifecycle = "dehydrating" if view.dehydrating else "resident"
    summary.health = "halted" if view.halted else "quarantined" if view.quarantined else "healthy"
    summary.trading_halted = state.trading_halted
    summary.control_version = state.control_version
    summary.reduce_only = state.reduce_only
    summary.risk_limits.CopyFrom(state.risk_limits)
    summary.open_orders = len(view.open_orders)
    del summary.balances[:]
    summary.balances.extend(state.balances)
