"""A user's mailbox (services/shard/core/mailbox.py): bounded, risk-reducing commands first
in line for room, fills never refused, nothing dropped silently, the log's order kept."""

from __future__ import annotations

from services.shard.core.commands import UserControl
from services.shard.core.egress import HydrateRequest, ShardResult
from services.shard.core.vocabulary import RejectReason, UserControlAction
from tests.shard.support import ShardDriver, of_type, only, results, settings

PER_USER = 8  # a reserve of 2 for cancels and an operator's commands
TOTAL = 100  # a reserve of 10


def _cold_user_mailbox() -> tuple[ShardDriver, int]:
    """User 5 is cold: its first command asks for its hydration; the epoch of that ask."""
    driver = ShardDriver(settings(max_parked_per_user=PER_USER, max_parked_total=TOTAL))
    out = driver.run(driver.place(5, "p0"))
    return driver, only(out, HydrateRequest).epoch


def test_a_full_mailbox_refuses_places_retryably_and_changes_nothing() -> None:
    driver, _ = _cold_user_mailbox()
    for index in range(1, PER_USER):
        assert only(driver.run(driver.place(5, f"p{index}")), ShardResult).parked
    before = driver.machine.state_hash()
    refused = only(driver.run(driver.place(5, "one-too-many")), ShardResult)
    assert refused.reject_reason == RejectReason.BACKPRESSURE and refused.retryable
    assert driver.machine.state_hash() == before
    statistics = driver.machine.statistics()
    assert statistics.parked_commands == PER_USER
    assert statistics.counter("refused_mailbox_full") == 1
    # Another user's mailbox is its own.
    assert only(driver.run(driver.place(6, "other")), ShardResult).parked


def test_cancels_and_operator_commands_find_room_a_flood_of_places_left() -> None:
    driver, epoch = _cold_user_mailbox()
    for index in range(1, PER_USER):
        driver.run(driver.place(5, f"p{index}"))
    cancel = driver.cancel(5, client_order_id="p3")
    assert only(driver.run(cancel), ShardResult).parked
    halt = UserControl(driver.next_correlation(), 5, int(UserControlAction.HALT_TRADING), "k", "")
    assert only(driver.run(halt), ShardResult).parked
    # The cancels' reserve is bounded too ...
    refused = only(driver.run(driver.cancel(5, client_order_id="p4")), ShardResult)
    assert refused.reject_reason == RejectReason.BACKPRESSURE and refused.retryable
    # ... and cancels filling it leave the operator a share of its own.
    resume = UserControl(
        driver.next_correlation(), 5, int(UserControlAction.RESUME_TRADING), "k", ""
    )
    assert only(driver.run(resume), ShardResult).parked
    # Hydrated: the mailbox is served in the log's order, so the cancel finds the
    # place it cancels, and the halt comes after every place before it.
    out = driver.run(driver.hydrate(5, epoch=epoch, balances={"USDT": 10**9}))
    verdicts = {result.correlation_id: result for result in results(out)}
    assert all(verdicts[n].accepted for n in range(1, PER_USER + 1))  # the eight places
    assert verdicts[cancel.correlation_id].accepted
    assert verdicts[halt.correlation_id].accepted
    assert verdicts[resume.correlation_id].accepted  # after the halt, in log order
    actor = driver.machine.actor(5)
    assert actor is not None and not actor.trading_halted
    assert actor.orders["s1:5:4"].cancel_in_flight
    assert driver.machine.statistics().parked_commands == 0


def test_matcher_events_are_never_refused_by_a_full_mailbox() -> None:
    driver, _ = _cold_user_mailbox()
    for index in range(1, PER_USER + 2):
        driver.run(driver.place(5, f"p{index}"))
    fills = [driver.fill(f"s1:5:{n}", 5, price_ticks=1, quantity_lots=1) for n in range(1, 4)]
    driver.run(driver.events("g1", *fills))
    assert driver.machine.statistics().counter("matcher_events_parked") == 3


def test_the_shard_wide_bound_holds_across_users_with_its_own_reserve() -> None:
    driver = ShardDriver(settings(max_parked_per_user=PER_USER, max_parked_total=TOTAL))
    parked = 0
    for user in range(10, 100):
        for index in range(PER_USER):
            if parked >= TOTAL:
                break
            assert only(driver.run(driver.place(user, f"p{index}")), ShardResult).parked
            parked += 1
    refused = only(driver.run(driver.place(500, "late")), ShardResult)
    assert refused.reject_reason == RejectReason.BACKPRESSURE
    assert not of_type(driver.history[-1:], HydrateRequest)  # user 500 asked for nothing
    cancels = [driver.cancel(10 + n, client_order_id="p0") for n in range(TOTAL // 10 + 1)]
    answers = [only(driver.run(cancel), ShardResult) for cancel in cancels]
    assert [a.parked for a in answers] == [True] * (TOTAL // 10) + [False]
    assert driver.machine.statistics().parked_commands == TOTAL + TOTAL // 10
    halt = UserControl(driver.next_correlation(), 11, int(UserControlAction.HALT_TRADING), "k", "")
    assert only(driver.run(halt), ShardResult).parked  # the operator's own share
