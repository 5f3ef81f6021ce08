"""Rule 2: deposits and withdrawals, idempotent by transfer id; withdraw only what is available."""

from __future__ import annotations

from typing import Any

from services.shard.core.commands import Command
from services.shard.core.egress import BeginDehydrate, LedgerPosting
from services.shard.core.settings import FAULT_RAISE, InjectedFaultSpec
from services.shard.core.user_state import UserState
from services.shard.core.vocabulary import RejectReason
from tests.shard.support import (
    ShardDriver,
    of_type,
    only,
    results,
    settings,
    unbalanced_postings,
)


def test_deposit_credits_and_writes_a_balanced_posting() -> None:
    driver = ShardDriver()
    driver.resident(1)
    out = driver.run(driver.deposit(1, "USDT", 500, "t1"))
    assert only(out, type(results(out)[0])).accepted
    assert driver.balance(1, "USDT") == (500, 0)
    posting = only(out, LedgerPosting)
    assert posting.reference == "t1"
    assert posting.rows == ((1, "user", "USDT", 500), (0, "external", "USDT", -500))
    assert unbalanced_postings(out) == []
    accounts = driver.machine.state.accounts
    assert accounts.deposits["USDT"] == 500


def test_same_transfer_again_returns_the_original_result_and_changes_nothing() -> None:
    driver = ShardDriver()
    driver.resident(1)
    driver.run(driver.deposit(1, "USDT", 500, "t1"))
    before = driver.machine.state_hash()
    out = driver.run(driver.deposit(1, "USDT", 500, "t1"))
    result = results(out)[0]
    assert result.accepted and result.duplicate
    assert of_type(out, LedgerPosting) == []
    assert driver.balance(1, "USDT") == (500, 0)
    assert driver.machine.state_hash() == before


def test_same_transfer_id_with_different_content_is_refused() -> None:
    driver = ShardDriver()
    driver.resident(1)
    driver.run(driver.deposit(1, "USDT", 500, "t1"))
    before = driver.machine.state_hash()
    for command in (
        driver.deposit(1, "USDT", 501, "t1"),
        driver.deposit(1, "BTC", 500, "t1"),
        driver.withdraw(1, "USDT", 500, "t1"),
    ):
        result = results(driver.run(command))[0]
        assert not result.accepted
        assert result.reject_reason == RejectReason.DUPLICATE_TRANSFER
    assert driver.machine.state_hash() == before


def test_withdraw_takes_only_available_funds() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10_000)
    driver.run(driver.place(1, "o1", price_ticks=100, quantity_lots=5))  # reserves 5_010
    assert driver.balance(1, "USDT") == (10_000, 5_010)
    before = driver.machine.state_hash()
    refused = results(driver.run(driver.withdraw(1, "USDT", 4_991)))[0]
    assert refused.reject_reason == RejectReason.INSUFFICIENT_FUNDS
    assert driver.machine.state_hash() == before
    out = driver.run(driver.withdraw(1, "USDT", 4_990, "w-ok"))
    assert results(out)[0].accepted
    assert driver.balance(1, "USDT") == (5_010, 5_010)
    assert only(out, LedgerPosting).rows == (
        (1, "user", "USDT", -4_990),
        (0, "external", "USDT", 4_990),
    )
    assert driver.machine.state.accounts.withdrawals["USDT"] == 4_990


def test_transfer_ids_survive_an_eviction() -> None:
    driver = ShardDriver()
    driver.resident(1)
    driver.run(driver.deposit(1, "USDT", 700, "t1"))
    flush = driver.tick(60_000)
    begin = next(item for item in flush if isinstance(item, BeginDehydrate))
    driver.run(driver.flush_complete(1, begin.epoch))
    assert driver.machine.actor(1) is None
    # The persister hydrates the flushed state; the retry is still recognised.
    out = driver.run(driver.deposit(1, "USDT", 700, "t1"))
    assert results(out)[0].parked
    driver.run(driver.hydrate(1, **_as_hydration(begin.state)))
    final = [
        r for r in results(driver.history) if r.correlation_id == results(out)[0].correlation_id
    ]
    assert final[-1].accepted and final[-1].duplicate
    assert driver.balance(1, "USDT") == (700, 0)


def _as_hydration(state: UserState) -> dict[str, Any]:
    return {
        "balances": dict(state.balances),
        "db_version": state.db_version + 1,
        "user_seq": state.user_seq,
        "recent": state.recent,
    }


def test_bad_transfers_are_refused_before_the_user_is_looked_up() -> None:
    driver = ShardDriver()
    before = driver.machine.state_hash()
    cases: list[tuple[Command, RejectReason]] = [
        (driver.deposit(9, "DOGE", 5), RejectReason.UNKNOWN_ASSET),
        (driver.deposit(9, "USDT", 0), RejectReason.INVALID_AMOUNT),
        (driver.deposit(9, "USDT", -5), RejectReason.INVALID_AMOUNT),
        (driver.withdraw(9, "USDT", 0), RejectReason.INVALID_AMOUNT),
    ]
    for command, reason in cases:
        out = driver.run(command)
        assert [r.reject_reason for r in results(out)] == [reason]
    assert driver.machine.state_hash() == before
    assert driver.machine.statistics().hydrating_users == 0


def test_halted_user_still_receives_deposits_but_cannot_withdraw() -> None:
    faults = tuple(InjectedFaultSpec(1, f"bad{i}", FAULT_RAISE) for i in range(3))
    driver = ShardDriver(settings(fault_injection=faults))
    driver.resident(1, USDT=1_000)
    for index in range(3):
        driver.run(driver.place(1, f"bad{index}"))
    actor = driver.machine.actor(1)
    assert actor is not None and actor.health == 2
    assert results(driver.run(driver.deposit(1, "USDT", 5)))[0].accepted
    refused = results(driver.run(driver.withdraw(1, "USDT", 5)))[0]
    assert refused.reject_reason == RejectReason.USER_HALTED
