"""An operator's controls of one user through the admin API and `oms client admin`.

On the shared mesh of real processes and PostgreSQL: risk limits, a trading halt and
its resumption, a restart through PostgreSQL, the user list, and the audit rows
every control leaves (who, when, what, where in the shard's log), written behind
the shard by the persister.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from gateway.client import AdminClient
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from services.command_line import main
from tests.full_mesh import FullMesh
from tests.gateway.accounts import (
    buy,
    eventually,
    open_account,
    refusal,
)
from tests.gateway.gateway_process import ADMIN_KEY, ADMIN_SECRET

C = common_pb2
FUNDS = {"USDT": 10_000_000_000}


async def _audit(admin: AdminClient, user_id: int, count: int) -> list[gateway_pb2.AdminAuditEntry]:
    """The user's newest `count` logged controls (not key changes), oldest first, once the
    persister has written them."""

    async def logged() -> list[gateway_pb2.AdminAuditEntry]:
        page = await admin.list_admin_audit(user_id=user_id)
        return [entry for entry in page.entries if entry.shard_id]

    entries = await eventually(logged, lambda entries: len(entries) >= count)
    return list(reversed(entries[:count]))


async def _summary(admin: AdminClient, user_id: int) -> gateway_pb2.UserSummary:
    page = await admin.list_users(after_user_id=user_id - 1, limit=1)
    assert page.users and page.users[0].user_id == user_id, page
    return page.users[0]


async def test_risk_limits_are_changed_logged_and_audited(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS)
    async with account.client(shared_mesh.gateway.address) as client:
        first = await client.place_order(buy(client, "before", 1))
        assert first.accepted, first
        ack = await admin.set_risk_limits(
            account.user_id, shard_pb2.RiskLimits(max_open_orders=1), note="desk request 17"
        )
        assert ack.accepted, ack
        second = await client.place_order(buy(client, "over-the-limit", 1))
        assert not second.accepted
        assert second.reject_reason == shard_pb2.SHARD_REJECT_REASON_RISK_MAX_OPEN_ORDERS
    summary = await _summary(admin, account.user_id)
    assert summary.risk_limits.max_open_orders == 1 and summary.resident
    (entry,) = await _audit(admin, account.user_id, 1)
    assert (entry.actor, entry.action, entry.note) == (
        ADMIN_KEY,
        "set_risk_limits",
        "desk request 17",
    )
    assert entry.accepted and entry.shard_id == "s1" and entry.position > 0
    detail = json.loads(entry.detail)
    assert detail["before"]["limits"]["max_open_orders"] == 0
    assert detail["after"]["limits"]["max_open_orders"] == 1
    # Bad input is refused at the gateway and changes nothing.
    negative = shard_pb2.RiskLimits(max_open_orders=-1)
    error = await refusal(admin.set_risk_limits(account.user_id, negative))
    assert error.reason == "GATEWAY_ERROR_REASON_OUT_OF_RANGE"
    listed = (await admin.list_admin_audit(user_id=account.user_id)).entries
    assert [entry.action for entry in listed] == ["set_risk_limits", "api_key.create"]


async def test_a_halted_user_cannot_place_or_withdraw_but_cancels_until_resumed(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS)
    async with account.client(shared_mesh.gateway.address) as client:
        resting = await client.place_order(buy(client, "resting", 1))
        assert resting.accepted, resting
        halted = await admin.halt_user(account.user_id, note="compliance hold")
        assert halted.accepted, halted
        refused = await client.place_order(buy(client, "while-halted", 1))
        assert not refused.accepted
        assert refused.reject_reason == shard_pb2.SHARD_REJECT_REASON_TRADING_HALTED
        withdrawal = await admin.withdraw(account.user_id, "USDT", 1, "w-halted")
        assert withdrawal.reject_reason == shard_pb2.SHARD_REJECT_REASON_TRADING_HALTED
        assert (await _summary(admin, account.user_id)).trading_halted
        cancel = await client.cancel(order_id=resting.order_id)
        assert cancel.accepted, cancel
        resumed = await admin.resume_user(account.user_id)
        assert resumed.accepted, resumed
        again = await client.place_order(buy(client, "after-resume", 1))
        assert again.accepted, again
    halt, resume = await _audit(admin, account.user_id, 2)
    assert (halt.action, halt.note, resume.action) == (
        "halt_trading",
        "compliance hold",
        "resume_trading",
    )
    assert halt.position < resume.position and halt.at_ms <= resume.at_ms


async def test_restart_needs_a_flat_user_then_rehydrates_it_from_postgresql(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS)
    async with account.client(shared_mesh.gateway.address) as client:
        resting = await client.place_order(buy(client, "resting", 2))
        assert resting.accepted, resting
        refused = await admin.restart_user(account.user_id, note="try")
        assert not refused.accepted
        assert refused.reject_reason == shard_pb2.SHARD_REJECT_REASON_USER_NOT_FLAT
        await client.cancel(order_id=resting.order_id)
        await eventually(client.open_orders, lambda orders: not orders)
        before = await client.balances()
        restarted = await admin.restart_user(account.user_id, note="after incident")
        assert restarted.accepted, restarted
        # Flushed and dropped: PostgreSQL holds the user, the shard no longer does.
        cold = await eventually(
            lambda: _summary(admin, account.user_id), lambda user: not user.resident
        )
        assert cold.lifecycle == "cold" and cold.db_version >= 1
        assert {b.asset: b.total for b in cold.balances} == {a: b.total for a, b in before.items()}
        # A control of a cold user waits for its hydration, then applies.
        halted = await admin.halt_user(account.user_id)
        assert halted.accepted, halted
        assert (await _summary(admin, account.user_id)).trading_halted
        assert (await admin.resume_user(account.user_id)).accepted
        # The next order is served by an actor hydrated afresh, with the same money.
        after = await client.place_order(buy(client, "after-restart", 1))
        assert after.accepted, after
        assert (await _summary(admin, account.user_id)).health == "healthy"
    refusal_row, restart_row, _, _ = await _audit(admin, account.user_id, 4)
    assert (
        not refusal_row.accepted
        and refusal_row.reject_reason == "SHARD_REJECT_REASON_USER_NOT_FLAT"
    )
    assert json.loads(refusal_row.detail)["open_orders"] == 1
    assert restart_row.accepted and restart_row.note == "after incident"
    # The rows are PostgreSQL's, at the command's log place, written once.
    connection = await asyncpg.connect(shared_mesh.database_url)
    try:
        rows = await connection.fetch(
            "SELECT action, shard_id, position, accepted FROM admin_audit WHERE user_id = $1 "
            "AND shard_id IS NOT NULL ORDER BY position",
            account.user_id,
        )
    finally:
        await connection.close()
    assert [(row["action"], row["accepted"]) for row in rows] == [
        ("restart", False),
        ("restart", True),
        ("halt_trading", True),
        ("resume_trading", True),
    ]


async def test_a_control_is_decided_once_and_a_late_copy_cannot_undo_a_later_one(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    """The late halt (simulation seed 852): a halt's copy decided after the resume."""
    account = await open_account(admin, FUNDS)
    user_id = account.user_id
    start = (await _summary(admin, user_id)).control_version
    assert (await admin.halt_user(user_id, request_id="halt-1")).accepted
    # The caller's retry of the same request (its answer lost): answered, nothing redone.
    again = await admin.halt_user(user_id, request_id="halt-1", if_control_version=start)
    assert again.accepted, again
    assert (await admin.resume_user(user_id, request_id="resume-1")).accepted
    late = await admin.halt_user(user_id, request_id="halt-1", if_control_version=start)
    assert not late.accepted
    assert late.reject_reason == shard_pb2.SHARD_REJECT_REASON_CONTROL_VERSION_STALE
    summary = await _summary(admin, user_id)
    assert not summary.trading_halted and summary.control_version == start + 2
    # Two operators read the same version; the second to land is told to look again.
    limits = shard_pb2.RiskLimits(max_open_orders=4)
    first = await admin.set_risk_limits(user_id, limits, if_control_version=start + 2)
    second = await admin.set_risk_limits(user_id, limits, if_control_version=start + 2)
    assert first.accepted and not second.accepted, (first, second)
    assert "CONTROL_VERSION_STALE" in second.detail
    rows = await _audit(admin, user_id, 6)
    assert [(row.action, row.accepted) for row in rows] == [
        ("halt_trading", True),
        ("halt_trading", True),  # the retry, answered as decided
        ("resume_trading", True),
        ("halt_trading", False),
        ("set_risk_limits", True),
        ("set_risk_limits", False),
    ]
    assert json.loads(rows[1].detail)["duplicate"] is True
    error = await refusal(admin.halt_user(user_id, request_id="x" * 65))
    assert error.reason == "GATEWAY_ERROR_REASON_OUT_OF_RANGE", error


async def test_controls_of_an_unknown_user_are_refused(admin: AdminClient) -> None:
    for control in (admin.halt_user, admin.restart_user):
        error = await refusal(control(9_000_000_001))
        assert error.reason == "GATEWAY_ERROR_REASON_UNKNOWN_USER", error
    error = await refusal(admin.halt_user(1, note="bad\x00note"))
    assert error.reason == "GATEWAY_ERROR_REASON_INVALID_FIELD", error
    # A user id past 2^31 reads its (empty) audit.
    assert not (await admin.list_admin_audit(user_id=3_000_000_000)).entries
    error = await refusal(admin.halt_user(0))
    assert error.reason == "GATEWAY_ERROR_REASON_INVALID_FIELD", error


def test_oms_client_admin_from_the_command_line(
    shared_mesh: FullMesh, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def create() -> int:
        async with shared_mesh.admin() as admin:
            return (await open_account(admin, FUNDS)).user_id

    user_id = asyncio.run(create())
    monkeypatch.setenv("OMS_GATEWAY_ADDRESS", shared_mesh.gateway.address)
    monkeypatch.setenv("OMS_ADMIN_API_KEY", ADMIN_KEY)
    monkeypatch.setenv("OMS_ADMIN_API_SECRET", ADMIN_SECRET)

    def admin_command(*arguments: str) -> tuple[int, str]:
        code = main(["client", "admin", *arguments])
        return code, capsys.readouterr().out

    code, out = admin_command("limits", str(user_id), "--max-open-orders", "3", "--note", "cli")
    assert (code, out.strip()) == (0, f"done: user {user_id}: risk limits set")
    # Only the limit given changed; the next one keeps it.
    code, _ = admin_command("limits", str(user_id), "--max-drawdown", "500")
    assert code == 0
    code, out = admin_command("halt", str(user_id), "--note", "from the terminal")
    assert code == 0 and "trading halted" in out
    code, out = admin_command("users", "--after", str(user_id - 1), "--limit", "1")
    assert code == 0
    line = out.strip().splitlines()[0]
    assert line.startswith(f"user {user_id} resident healthy")
    assert "max_open_orders=3" in line and "max_drawdown=500" in line and "TRADING_HALTED" in line
    assert "control_version=3" in line  # two limits and the halt
    code, out = admin_command("resume", str(user_id), "--if-control-version", "2")
    assert code == 1 and "CONTROL_VERSION_STALE" in out
    code, out = admin_command("resume", str(user_id))
    assert code == 0
    code, out = admin_command("restart", str(user_id))
    assert code == 0 and "flush to PostgreSQL started" in out

    async def audit_written() -> None:
        async with shared_mesh.admin() as admin:
            await _audit(admin, user_id, 6)

    asyncio.run(audit_written())
    code, out = admin_command("audit", "--user", str(user_id))
    assert code == 0
    actions = [line.split()[3] for line in out.strip().splitlines()]
    assert actions == [
        "restart",
        "resume_trading",
        "resume_trading",  # refused: pinned to a version passed
        "halt_trading",
        "set_risk_limits",
        "set_risk_limits",
        "api_key.create",  # the account's first key
    ]
    assert 'note="from the terminal"' in out
    # A refusal exits 1: here, a user with no account.
    code, _ = admin_command("halt", "9000000001")
    assert code == 1
