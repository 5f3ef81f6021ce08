"""Orders are served ahead of ticks: marks wait while the ingress is busy, boundedly."""

from __future__ import annotations

from services.shard.tick_mailbox import MarkCadence, TickMailbox


def test_marks_wait_behind_a_busy_ingress_but_never_longer_than_the_bound() -> None:
    cadence = MarkCadence(busy_fraction=0.5, max_deferrals=3)
    assert cadence.due(0.1)
    assert [cadence.due(0.9) for _ in range(4)] == [False, False, False, True]
    assert cadence.due(0.9) is False  # the bound counts again from the last logged turn
    assert cadence.due(0.2)
    assert cadence.deferrals == 4


def test_ticks_keep_conflating_while_they_wait() -> None:
    mailbox = TickMailbox(max_symbols=2)
    for price in range(1, 100):
        mailbox.offer("BTC-USDT", price)
    mailbox.offer("ETH-USDT", 7)
    assert not mailbox.offer("SOL-USDT", 1)  # a third symbol passes the bound
    assert len(mailbox) == 2
    assert mailbox.drain() == [("BTC-USDT", 99), ("ETH-USDT", 7)]
    assert len(mailbox) == 0 and mailbox.statistics().replaced == 98
