"""An operator's controls as logged commands: limits, trading halts, restarts; each audited."""

from __future__ import annotations

import json

from services.shard.core.codec import (
    decode_command_batch,
    egress_to_protobuf,
    encode_command_batch,
    user_state_from_protobuf,
    user_state_to_protobuf,
)
from services.shard.core.commands import Command, SetRiskLimits, UserControl
from services.shard.core.egress import (
    BeginDehydrate,
    HydrateRequest,
    OperatorAudit,
    RiskAlert,
    ShardResult,
    SubmitToMatcher,
)
from services.shard.core.risk import RiskLimits
from services.shard.core.settings import FAULT_CORRUPT, FAULT_RAISE, InjectedFaultSpec
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.vocabulary import RejectReason, UserControlAction
from tests.shard.support import TTL_MS, ShardDriver, of_type, only, results, settings

HALT = int(UserControlAction.HALT_TRADING)
RESUME = int(UserControlAction.RESUME_TRADING)
RESTART = int(UserControlAction.RESTART)


def _control(driver: ShardDriver, user_id: int, action: int, note: str = "") -> UserControl:
    return UserControl(driver.next_correlation(), user_id, action, "admin-key", note)


def _pinned(
    driver: ShardDriver, user_id: int, action: int, request_id: str, version: int | None
) -> UserControl:
    """A control as the admin API sends it: its request's id, pinned to a control version."""
    return UserControl(
        driver.next_correlation(), user_id, action, "admin-key", "", request_id, version
    )


def _driver(*faults: tuple[int, str, str]) -> ShardDriver:
    specs = tuple(InjectedFaultSpec(user, client_id, mode) for user, client_id, mode in faults)
    driver = ShardDriver(settings(fault_injection=specs))
    driver.resident(1, USDT=10**6, BTC=10)
    driver.resident(2, USDT=10**6)
    return driver


def test_risk_limits_change_is_answered_and_audited_with_before_and_after() -> None:
    driver = _driver()
    command = SetRiskLimits(
        driver.next_correlation(), 1, RiskLimits(max_open_orders=1), False, "admin-key", "tighten"
    )
    out = driver.run(command)
    assert only(out, ShardResult).accepted
    audit = only(out, OperatorAudit)
    assert (audit.user_id, audit.operator, audit.action, audit.note) == (
        1,
        "admin-key",
        "set_risk_limits",
        "tighten",
    )
    detail = json.loads(audit.detail)
    assert detail["before"]["limits"]["max_open_orders"] == 0
    assert detail["after"]["limits"]["max_open_orders"] == 1
    driver.accepted_order(1, "first")
    refused = results(driver.run(driver.place(1, "second")))[0]
    assert refused.reject_reason == RejectReason.RISK_MAX_OPEN_ORDERS


def test_a_trading_halt_refuses_places_and_withdrawals_and_lets_cancels_through() -> None:
    driver = _driver()
    order_id = driver.accepted_order(1, "resting")
    out = driver.run(_control(driver, 1, HALT, "compliance hold"))
    assert only(out, ShardResult).accepted
    audit = only(out, OperatorAudit)
    assert audit.action == "halt_trading" and audit.accepted
    assert json.loads(audit.detail)["trading_halted"] is True
    before = driver.machine.state_hash()
    for command in (driver.place(1, "new"), driver.withdraw(1, "USDT", 5)):
        refused = only(driver.run(command), ShardResult)
        assert refused.reject_reason == RejectReason.TRADING_HALTED and not refused.retryable
    assert driver.machine.state_hash() == before  # refusals change nothing
    assert only(driver.run(driver.deposit(1, "USDT", 5)), ShardResult).accepted
    cancel = driver.run(driver.cancel(1, order_id=order_id))
    assert only(cancel, ShardResult).accepted
    # Other users trade on.
    assert results(driver.run(driver.place(2, "other")))[0].accepted
    resumed = driver.run(_control(driver, 1, RESUME))
    assert only(resumed, OperatorAudit).action == "resume_trading"
    assert results(driver.run(driver.place(1, "after")))[0].accepted
    assert driver.machine.statistics().counter("refused_trading_halted") == 2


def test_a_trading_halt_survives_eviction_and_hydration() -> None:
    driver = _driver()
    driver.run(_control(driver, 1, HALT))
    out = driver.tick(TTL_MS)
    begin = next(b for b in of_type(out, BeginDehydrate) if b.user_id == 1)
    assert begin.state.trading_halted
    # The wire form keeps it, as PostgreSQL will.
    assert user_state_from_protobuf(user_state_to_protobuf(begin.state)).trading_halted
    driver.run(driver.flush_complete(1, begin.epoch, begin.state.db_version + 1))
    assert driver.machine.actor(1) is None
    parked = driver.run(driver.place(1, "cold"))
    request = only(parked, HydrateRequest)
    hydrate = driver.hydrate(
        1, epoch=request.epoch, balances={"USDT": 10**6}, db_version=1, trading_halted=True
    )
    assert only(driver.run(hydrate), ShardResult).reject_reason == RejectReason.TRADING_HALTED


def test_a_control_of_a_cold_user_hydrates_it_first_and_is_audited_then() -> None:
    driver = _driver()
    out = driver.run(_control(driver, 7, HALT))
    assert only(out, ShardResult).parked and not of_type(out, OperatorAudit)
    request = only(out, HydrateRequest)
    out = driver.run(driver.hydrate(7, epoch=request.epoch, balances={"USDT": 1}))
    assert only(out, ShardResult).accepted
    assert only(out, OperatorAudit).user_id == 7
    actor = driver.machine.actor(7)
    assert actor is not None and actor.trading_halted


def test_restart_brings_a_quarantined_actor_back_through_postgresql() -> None:
    """The quarantined-forever case: flat, but its own check fails, so no sweep evicts it."""
    driver = _driver((1, "corrupt", FAULT_CORRUPT))
    order_id = driver.accepted_order(1, "resting")
    driver.run(driver.place(1, "corrupt"))
    fill = driver.fill(order_id, 1, price_ticks=100, quantity_lots=1, done=True)
    driver.run(driver.events("g1", fill))
    actor = driver.machine.actor(1)
    assert actor is not None and actor.health == 1 and actor.is_flat()
    swept = driver.tick(10 * TTL_MS)
    assert not [b for b in of_type(swept, BeginDehydrate) if b.user_id == 1]
    out = driver.run(_control(driver, 1, RESTART, "after incident 42"))
    assert only(out, ShardResult).accepted
    audit = only(out, OperatorAudit)
    assert audit.action == "restart" and json.loads(audit.detail)["health"] == "quarantined"
    begin = only(out, BeginDehydrate)
    assert dict(begin.state.balances)["BTC"] > 10  # the fill is in what is flushed
    driver.run(driver.flush_complete(1, begin.epoch, begin.state.db_version + 1))
    statistics = driver.machine.statistics()
    assert driver.machine.actor(1) is None and statistics.quarantined_users == 0
    # Its next order hydrates it afresh (from the flushed row) and healthy.
    request = only(driver.run(driver.place(1, "again")), HydrateRequest)
    stored = begin.state
    hydrate = driver.hydrate(
        1,
        epoch=request.epoch,
        balances=dict(stored.balances),
        db_version=stored.db_version + 1,
        positions=stored.positions,
        user_seq=stored.user_seq,
    )
    out = driver.run(hydrate)
    assert only(out, ShardResult).accepted and of_type(out, SubmitToMatcher)
    rebuilt = driver.machine.actor(1)
    assert rebuilt is not None and rebuilt.health == 0 and not rebuilt.failures


def test_restart_brings_a_halted_actor_back() -> None:
    driver = _driver(*((1, f"f{index}", FAULT_RAISE) for index in range(3)))
    for index in range(3):
        driver.run(driver.place(1, f"f{index}"), advance_ms=1_000)
    assert driver.machine.statistics().halted_users == 1
    assert any(alert.kind == "supervision_halt" for alert in of_type(driver.history, RiskAlert))
    out = driver.run(_control(driver, 1, RESTART))
    begin = only(out, BeginDehydrate)
    driver.run(driver.flush_complete(1, begin.epoch, begin.state.db_version + 1))
    assert driver.machine.statistics().halted_users == 0
    assert driver.machine.statistics().counter("operator_restarts") == 1


def test_restart_of_a_user_with_open_orders_is_refused_and_changes_nothing() -> None:
    driver = _driver()
    driver.accepted_order(1, "resting")
    before = driver.machine.state_hash()
    out = driver.run(_control(driver, 1, RESTART))
    refused = only(out, ShardResult)
    assert refused.reject_reason == RejectReason.USER_NOT_FLAT
    audit = only(out, OperatorAudit)
    assert not audit.accepted and audit.reject_reason == RejectReason.USER_NOT_FLAT
    assert json.loads(audit.detail)["open_orders"] == 1
    assert not of_type(out, BeginDehydrate)
    assert driver.machine.state_hash() == before


def test_restart_of_a_user_not_resident_is_accepted_with_nothing_to_do() -> None:
    driver = _driver()
    out = driver.run(_control(driver, 9, RESTART))
    assert only(out, ShardResult).accepted and not of_type(out, HydrateRequest)
    assert json.loads(only(out, OperatorAudit).detail) == {"hydrating": False, "resident": False}


def test_an_unknown_action_is_malformed_and_changes_nothing() -> None:
    driver = _driver()
    before = driver.machine.state_hash()
    out = driver.run(_control(driver, 1, 99))
    assert only(out, ShardResult).reject_reason == RejectReason.MALFORMED
    assert not of_type(out, OperatorAudit)
    assert driver.machine.state_hash() == before


def test_controls_travel_the_wire_and_replicas_agree() -> None:
    driver = _driver()
    commands: list[Command] = [
        _control(driver, 1, HALT, "note"),
        SetRiskLimits(driver.next_correlation(), 2, RiskLimits(max_drawdown=5), True, "k", "n"),
        _control(driver, 8, RESUME),  # parked behind a hydration: in the snapshot
    ]
    assert decode_command_batch(encode_command_batch(commands)) == commands
    twin = ShardMachine(driver.settings)
    twin.restore(driver.machine.snapshot())
    out = driver.run_bytes(commands)
    twin_out = twin.apply_commands(decode_command_batch(encode_command_batch(commands)), driver.now)
    assert out == twin_out
    assert driver.machine.state_hash() == twin.state_hash()
    restored = driver.replica()
    assert restored.state_hash() == driver.machine.state_hash()
    actor = restored.actor(1)
    assert actor is not None and actor.trading_halted
    message = egress_to_protobuf(only(out[:3], OperatorAudit), 5, 6)
    assert message.operator_audit.action == "halt_trading"
    assert message.operator_audit.operator == "admin-key"


# --- each control decided once: request ids and control versions -------------------------


def test_every_accepted_control_adds_a_control_version_and_names_its_request() -> None:
    driver = _driver()
    out = driver.run(_pinned(driver, 1, HALT, "req-1", 0))
    assert only(out, ShardResult).accepted
    assert json.loads(only(out, OperatorAudit).detail)["control_version"] == 1
    limits = SetRiskLimits(
        driver.next_correlation(), 1, RiskLimits(max_open_orders=2), False, "k", "", "req-2", 1
    )
    assert only(driver.run(limits), ShardResult).accepted
    actor = driver.machine.actor(1)
    assert actor is not None and (actor.control_version, actor.last_control_id) == (2, "req-2")


def test_a_copy_of_a_control_decided_already_is_answered_again_and_changes_nothing() -> None:
    driver = _driver()
    driver.run(_pinned(driver, 1, HALT, "req-1", 0))
    before = driver.machine.state_hash()
    out = driver.run(_pinned(driver, 1, HALT, "req-1", 0))  # the admin API's retry
    assert only(out, ShardResult).accepted
    audit = only(out, OperatorAudit)
    assert audit.accepted and json.loads(audit.detail)["duplicate"] is True
    assert driver.machine.state_hash() == before
    actor = driver.machine.actor(1)
    assert actor is not None and actor.control_version == 1


def test_a_late_copy_of_a_halt_cannot_undo_the_resume_that_followed_it() -> None:
    """Seed 852's defect: the halt delivered twice, one copy late, after the resume."""
    driver = _driver()
    driver.run(_pinned(driver, 1, HALT, "halt", 0))
    assert only(driver.run(_pinned(driver, 1, RESUME, "resume", 1)), ShardResult).accepted
    before = driver.machine.state_hash()
    out = driver.run(_pinned(driver, 1, HALT, "halt", 0))  # the late copy
    refused = only(out, ShardResult)
    assert refused.reject_reason == RejectReason.CONTROL_VERSION_STALE and not refused.retryable
    audit = only(out, OperatorAudit)
    assert not audit.accepted and audit.reject_reason == RejectReason.CONTROL_VERSION_STALE
    assert json.loads(audit.detail)["if_control_version"] == 0
    assert driver.machine.state_hash() == before
    assert results(driver.run(driver.place(1, "trades")))[0].accepted


def test_a_control_pinned_to_a_version_passed_is_refused_and_changes_nothing() -> None:
    """Two operators read version 0; the second to land is told to read again."""
    driver = _driver()
    driver.run(_pinned(driver, 1, HALT, "alice", 0))
    before = driver.machine.state_hash()
    limits = SetRiskLimits(driver.next_correlation(), 1, RiskLimits(), True, "k", "", "bob", 0)
    out = driver.run(limits)
    assert only(out, ShardResult).reject_reason == RejectReason.CONTROL_VERSION_STALE
    assert driver.machine.state_hash() == before
    # Unpinned, only the request id is checked: decided.
    assert only(driver.run(_pinned(driver, 1, RESUME, "carol", None)), ShardResult).accepted


def test_the_control_version_survives_a_restart_through_postgresql() -> None:
    driver = _driver()
    driver.run(_pinned(driver, 1, HALT, "halt", 0))
    out = driver.run(_pinned(driver, 1, RESTART, "restart", 1))
    begin = only(out, BeginDehydrate)
    assert (begin.state.control_version, begin.state.last_control_id) == (2, "restart")
    wire = user_state_from_protobuf(user_state_to_protobuf(begin.state))
    assert (wire.control_version, wire.last_control_id) == (2, "restart")
    driver.run(driver.flush_complete(1, begin.epoch, begin.state.db_version + 1))
    request = only(driver.run(_pinned(driver, 1, HALT, "halt", 0)), HydrateRequest)
    hydrate = driver.hydrate(
        1,
        epoch=request.epoch,
        balances=dict(begin.state.balances),
        db_version=begin.state.db_version + 1,
        trading_halted=True,
        control_version=2,
        last_control_id="restart",
    )
    out = driver.run(hydrate)  # the late halt, decided once hydrated: stale
    assert only(out, ShardResult).reject_reason == RejectReason.CONTROL_VERSION_STALE
    out = driver.run(_pinned(driver, 1, RESTART, "restart", 1))  # the restart's retry
    assert only(out, ShardResult).accepted and not of_type(out, BeginDehydrate)


def test_a_refused_control_adds_no_version() -> None:
    driver = _driver()
    driver.accepted_order(1, "resting")
    out = driver.run(_pinned(driver, 1, RESTART, "restart", 0))
    assert only(out, ShardResult).reject_reason == RejectReason.USER_NOT_FLAT
    actor = driver.machine.actor(1)
    assert actor is not None and (actor.control_version, actor.last_control_id) == (0, "")


def test_pinned_controls_travel_the_wire_and_a_restored_replica_decides_alike() -> None:
    driver = _driver()
    commands: list[Command] = [
        _pinned(driver, 1, HALT, "a", 0),
        SetRiskLimits(driver.next_correlation(), 2, RiskLimits(), False, "k", "", "b", None),
        _pinned(driver, 8, RESUME, "c", 0),  # parked behind a hydration: in the snapshot
    ]
    assert decode_command_batch(encode_command_batch(commands)) == commands
    driver.run_bytes(commands)
    restored = driver.replica()
    assert restored.state_hash() == driver.machine.state_hash()
    late = [_pinned(driver, 1, HALT, "a", 0), _pinned(driver, 1, RESUME, "d", 0)]
    twin_out = restored.apply_commands(late, driver.now)
    assert driver.run_bytes(late) == twin_out
    assert restored.state_hash() == driver.machine.state_hash()
    assert [r.accepted for r in results(twin_out)] == [True, False]
