"""Rule 12: a failure stays its user's: resume, quarantine, halt; deterministically."""

from __future__ import annotations

from services.shard.core.egress import RiskAlert, ShardResult, SubmitToMatcher
from services.shard.core.settings import FAULT_CORRUPT, FAULT_RAISE, InjectedFaultSpec
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.vocabulary import EventKind, RejectReason
from tests.shard.support import ShardDriver, of_type, only, results, settings


def _driver(*faults: tuple[int, str, str]) -> ShardDriver:
    specs = tuple(InjectedFaultSpec(user, client_id, mode) for user, client_id, mode in faults)
    driver = ShardDriver(settings(fault_injection=specs))
    driver.resident(1, USDT=10**6)
    driver.resident(2, USDT=10**6)
    return driver


def test_a_failing_message_is_refused_and_nothing_else_moves() -> None:
    driver = _driver((1, "boom", FAULT_RAISE))
    before = driver.machine.state_hash()
    out = driver.run(
        driver.place(2, "fine-before"), driver.place(1, "boom"), driver.place(2, "fine-after")
    )
    verdicts = [(r.accepted, r.reject_reason) for r in results(out)]
    assert verdicts == [(True, 0), (False, RejectReason.INTERNAL_ERROR), (True, 0)]
    assert [s.request.user_id for s in of_type(out, SubmitToMatcher)] == [2, 2]
    actor = driver.machine.actor(1)
    assert actor is not None and actor.health == 0 and len(actor.failures) == 1
    assert actor.user_seq == 0 and not actor.orders
    assert driver.machine.statistics().counter("supervision_failures") == 1
    assert driver.machine.state_hash() != before  # user 2's orders and user 1's failure record


def test_an_actor_that_breaks_its_own_invariant_is_quarantined() -> None:
    driver = _driver((1, "corrupt", FAULT_CORRUPT))
    order_id = driver.accepted_order(1, "resting")
    out = driver.run(driver.place(1, "corrupt"))
    assert only(out, RiskAlert).kind == "supervision_quarantine"
    assert results(out)[0].reject_reason == RejectReason.INTERNAL_ERROR
    stats = driver.machine.statistics()
    assert stats.quarantined_users == 1 and stats.counter("supervision_quarantines") == 1
    # Client commands are refused until the user is hydrated afresh ...
    for command in (driver.place(1, "x"), driver.cancel(1, order_id=order_id)):
        refused = results(driver.run(command))[0]
        assert refused.reject_reason == RejectReason.USER_HALTED and refused.retryable
    # ... but money keeps moving: the fill settles.
    fill = driver.fill(order_id, 1, price_ticks=100, quantity_lots=1, done=True)
    driver.run(driver.events("g1", fill))
    assert driver.machine.statistics().counter("fills_settled") == 1
    # User 2 is untouched.
    assert results(driver.run(driver.place(2, "ok")))[0].accepted


def test_three_failures_within_ten_seconds_halt_the_actor_with_an_alert() -> None:
    driver = _driver(*((1, f"f{index}", FAULT_RAISE) for index in range(3)))
    driver.run(driver.place(1, "f0"))
    driver.run(driver.place(1, "f1"), advance_ms=4_000)
    out = driver.run(driver.place(1, "f2"), advance_ms=5_999)
    assert only(out, RiskAlert).kind == "supervision_halt"
    assert driver.machine.statistics().halted_users == 1
    refused = results(driver.run(driver.place(1, "later")))[0]
    assert refused.reject_reason == RejectReason.USER_HALTED and not refused.retryable
    assert results(driver.run(driver.place(2, "other")))[0].accepted


def test_failures_spread_wider_than_the_window_do_not_halt() -> None:
    driver = _driver(*((1, f"f{index}", FAULT_RAISE) for index in range(4)))
    for index in range(4):
        driver.run(driver.place(1, f"f{index}"), advance_ms=5_000)
    actor = driver.machine.actor(1)
    assert actor is not None and actor.health == 0
    assert driver.machine.statistics().counter("supervision_failures") == 4


def test_supervision_is_deterministic_across_replicas() -> None:
    faults = ((1, "boom", FAULT_RAISE), (1, "corrupt", FAULT_CORRUPT))
    first, second = _driver(*faults), _driver(*faults)
    for driver in (first, second):
        driver.run(driver.place(1, "boom"), driver.place(1, "corrupt"), driver.place(2, "a"))
    assert first.machine.state_hash() == second.machine.state_hash()
    replica = ShardMachine(first.settings)
    replica.restore(first.machine.snapshot())
    assert replica.state_hash() == first.machine.state_hash()


def test_a_failing_matcher_event_is_consumed_with_an_alert() -> None:
    driver = _driver()
    order_id = driver.accepted_order(1, "a")
    # Rejected after Accepted is not a lifecycle move: settlement raises, supervision answers.
    bad = driver.event("g1", EventKind.REJECTED, order_id, 1, reason=1)
    out = driver.run(driver.events("g1", bad))
    assert only(out, RiskAlert).kind == "settlement_failed"
    assert driver.machine.state.sequences["g1"] == bad.sequence
    assert of_type(out, ShardResult) == []
