"""The auditor's arithmetic on hand-made rows: a clean book, and each corruption named.

One market, XYZ-USD: a lot is 10 XYZ units, a tick 2 USD units a lot, maker 0.1%,
taker 0.2%. Bob sells 3 lots at 50,000 (resting: the maker), Alice buys them (the
taker): notional 50,000 * 2 * 3 = 300,000 USD; Bob's fee 300, Alice's 600.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from auditor.core.findings import EXAMPLES_PER_CHECK, AuditReport
from auditor.core.money_audit import MoneyAudit
from auditor.core.rows import (
    BUY,
    CANCELLED,
    FILLED,
    LIMIT,
    OPEN,
    SELL,
    AcknowledgedOrder,
    AcknowledgedTransfer,
    FillRow,
    LedgerItem,
    MarketUnits,
    OrderOfFill,
    OrderRow,
    UserAnswer,
)

XYZ = MarketUnits("XYZ-USD", "XYZ", "USD", 10, 2, 1_000, 2_000)
ALICE, BOB = 1, 2
ALICE_ORDER, BOB_ORDER = "s1:1:1", "s2:2:1"


def ledger(
    shard: str, position: int, reference: str, *rows: tuple[int, str, str, int]
) -> list[LedgerItem]:
    return [
        LedgerItem(shard, position, index, user, account, asset, amount, reference)
        for index, (user, account, asset, amount) in enumerate(rows)
    ]


@dataclass
class Story:
    ledger: list[LedgerItem]
    fills: list[FillRow]
    orders: list[OrderRow]


def book() -> Story:
    """The clean story: two deposits, one trade between two shards, a withdrawal."""
    return Story(
        ledger=[
            *ledger(
                "s1",
                1,
                "dep-a",
                (ALICE, "user", "USD", 1_000_000),
                (0, "external", "USD", -1_000_000),
            ),
            *ledger(
                "s1",
                5,
                f"trade:1:{ALICE_ORDER}",
                (ALICE, "user", "USD", -300_600),
                (0, "clearing", "USD", 300_000),
                (0, "fees", "USD", 600),
                (ALICE, "user", "XYZ", 30),
                (0, "clearing", "XYZ", -30),
            ),
            *ledger("s2", 1, "dep-b", (BOB, "user", "XYZ", 100), (0, "external", "XYZ", -100)),
            *ledger(
                "s2",
                4,
                f"trade:1:{BOB_ORDER}",
                (BOB, "user", "XYZ", -30),
                (0, "clearing", "XYZ", 30),
                (BOB, "user", "USD", 299_700),
                (0, "clearing", "USD", -300_000),
                (0, "fees", "USD", 300),
            ),
            *ledger("s2", 6, "wd-b", (BOB, "user", "USD", -99_700), (0, "external", "USD", 99_700)),
        ],
        fills=[
            FillRow(
                ALICE_ORDER,
                1,
                ALICE,
                "XYZ-USD",
                BUY,
                50_000,
                3,
                600,
                False,
                "s1",
                5,
                OrderOfFill(ALICE, "XYZ-USD", BUY, LIMIT, 51_000),
            ),
            FillRow(
                BOB_ORDER,
                1,
                BOB,
                "XYZ-USD",
                SELL,
                50_000,
                3,
                300,
                True,
                "s2",
                4,
                OrderOfFill(BOB, "XYZ-USD", SELL, LIMIT, 50_000),
            ),
        ],
        orders=[
            OrderRow(ALICE_ORDER, ALICE, "a-1", "XYZ-USD", BUY, LIMIT, 3, FILLED, 3, 0, 3),
            OrderRow(BOB_ORDER, BOB, "b-1", "XYZ-USD", SELL, LIMIT, 5, CANCELLED, 3, 0, 3),
        ],
    )


CURSORS = {"s1": 5, "s2": 6}  # each shard's persister has written through its last row
ALICE_HOLDS = {"USD": (699_400, 0), "XYZ": (30, 0)}
BOB_HOLDS = {"USD": (200_000, 0), "XYZ": (70, 0)}
ANSWERS = [UserAnswer(ALICE, True, ALICE_HOLDS, 0), UserAnswer(BOB, False, BOB_HOLDS, 0)]
TRANSFERS = [
    AcknowledgedTransfer(ALICE, "dep-a", "USD", 1_000_000),
    AcknowledgedTransfer(BOB, "dep-b", "XYZ", 100),
    AcknowledgedTransfer(BOB, "wd-b", "USD", -99_700),
]
ACKNOWLEDGED = [
    AcknowledgedOrder(ALICE_ORDER, ALICE, "a-1"),
    AcknowledgedOrder(BOB_ORDER, BOB, "b-1"),
]


def audit(
    story: Story,
    *,
    answers: Sequence[UserAnswer] = ANSWERS,
    stored: dict[int, dict[str, int]] | None = None,
    acknowledged: Sequence[AcknowledgedOrder] = ACKNOWLEDGED,
    transfers: Sequence[AcknowledgedTransfer] = TRANSFERS,
    flat: bool = True,
    cursors: dict[str, int] | None = None,
) -> AuditReport:
    money = MoneyAudit([XYZ], acknowledged_transfers=transfers)
    money.persister_cursors(CURSORS if cursors is None else cursors)
    for item in story.ledger:
        money.ledger_item(item)
    for fill in story.fills:
        money.fill(fill)
    for order in story.orders:
        money.order(order, flat=flat)
    money.finish()
    stored_orders = {o.order_id: (o.user_id, o.client_order_id) for o in story.orders}
    money.acknowledged_orders(acknowledged, stored_orders)
    money.compare_stored({BOB: {"USD": 200_000, "XYZ": 70}} if stored is None else stored)
    money.compare_answers(answers, flat=flat)
    return money.report()


def violated(report: AuditReport) -> set[str]:
    return set(report.counts)


def test_a_clean_book_is_clean_and_counted() -> None:
    report = audit(book())
    assert report.clean, report.examples
    figures = report.figures
    assert (figures["postings"], figures["deposits"], figures["withdrawals"]) == (5, 2, 1)
    assert (figures["fills"], figures["trades"], figures["orders"], figures["users"]) == (
        2,
        1,
        2,
        2,
    )
    assert figures["unpaired_trades"] == 0
    assert report.evaluated > 40


def test_a_fee_off_by_one_is_named_where_it_shows() -> None:
    story = book()
    story.fills[0] = dataclasses.replace(story.fills[0], fee=601)
    # The fill's own fee, Alice's money (fills say 601, her ledger and her shard 600), the
    # fee account.
    assert violated(audit(story)) == {
        "fill-fee",
        "ledger-user",
        "fees-account",
        "answered-balance",
    }


def test_a_fee_at_the_other_rate_is_a_fill_fee() -> None:
    story = book()
    # Bob's fee charged at the taker's rate, consistently everywhere: only the rate shows it.
    story.fills[1] = dataclasses.replace(story.fills[1], fee=600)
    story.ledger[11] = dataclasses.replace(story.ledger[11], amount=299_400)
    story.ledger[13] = dataclasses.replace(story.ledger[13], amount=600)
    report = audit(story, answers=[ANSWERS[0]], stored={})
    assert violated(report) == {"fill-fee"}, report.examples


def test_a_trade_with_one_side_is_unpaired_and_leaves_clearing_alone() -> None:
    story = book()
    del story.fills[1]
    del story.ledger[9:16]  # Bob's side and after: not yet written by his persister
    story.orders[1] = dataclasses.replace(story.orders[1], filled_lots=0, fills_lots=0)
    report = audit(story, answers=[ANSWERS[0]], stored={}, transfers=TRANSFERS[:2])
    assert violated(report) == {"trade-pair"}
    assert report.figures["unpaired_trades"] == 1


def test_a_posting_written_twice_shows_in_money_and_clearing() -> None:
    story = book()
    rows = [(i.user_id, i.account, i.asset, i.amount) for i in story.ledger[9:14]]
    story.ledger[14:14] = ledger("s2", 5, f"trade:1:{BOB_ORDER}", *rows)
    # The fills say one trade: Bob's ledger, clearing and fees say two. (His stored and
    # answered balances agree with the fills: the shard applied it once.)
    assert violated(audit(story)) == {"ledger-user", "clearing-account", "fees-account"}


def test_a_tampered_ledger_row_unbalances_its_posting() -> None:
    story = book()
    story.ledger[0] = dataclasses.replace(story.ledger[0], amount=1_000_001)
    # Transfers are recomputed from their postings: the posting, the acknowledged amount
    # and what Alice's shard answers show it.
    assert violated(audit(story)) == {
        "posting-balanced",
        "transfer-acknowledged",
        "answered-balance",
    }


def test_orders_against_their_fills() -> None:
    story = book()
    story.orders[0] = dataclasses.replace(story.orders[0], filled_lots=2, remaining_lots=1)
    assert violated(audit(story)) == {"order-fills", "order-status"}
    story = book()
    story.orders[1] = dataclasses.replace(story.orders[1], remaining_lots=3)
    assert violated(audit(story)) == {"order-fills"}  # 3 filled + 3 left of 5


def test_a_fill_outside_its_limit_or_of_another_order() -> None:
    story = book()
    limit = OrderOfFill(ALICE, "XYZ-USD", BUY, LIMIT, 49_999)
    story.fills[0] = dataclasses.replace(story.fills[0], order=limit)
    assert violated(audit(story)) == {"fill-price"}
    story = book()
    story.fills[0] = dataclasses.replace(story.fills[0], order=None)
    assert violated(audit(story)) == {"fill-order"}
    story = book()
    other = OrderOfFill(BOB, "XYZ-USD", BUY, LIMIT, 51_000)
    story.fills[0] = dataclasses.replace(story.fills[0], order=other)
    assert violated(audit(story)) == {"fill-order"}


def test_a_trade_of_one_user_with_itself_or_of_two_prices() -> None:
    story = book()
    story.fills[1] = dataclasses.replace(story.fills[1], user_id=ALICE)
    assert "trade-pair" in violated(audit(story))
    story = book()
    story.fills[1] = dataclasses.replace(story.fills[1], price_ticks=50_001, fee=300)
    assert "trade-pair" in violated(audit(story))


def test_flat_means_nothing_live_and_nothing_reserved() -> None:
    story = book()
    story.orders[1] = dataclasses.replace(story.orders[1], status=OPEN, remaining_lots=2)
    assert violated(audit(story)) == {"order-final"}
    assert audit(story, flat=False).clean
    holding = UserAnswer(ALICE, True, {"USD": (699_400, 5), "XYZ": (30, 0)}, 1)
    assert violated(audit(book(), answers=[holding, ANSWERS[1]])) == {"answered-flat"}


def test_stored_and_answered_balances_against_the_recomputation() -> None:
    assert violated(audit(book(), stored={BOB: {"USD": 200_000, "XYZ": 71}})) == {"stored-balance"}
    wrong = UserAnswer(ALICE, True, {"USD": (699_400, 0)}, 0)
    assert violated(audit(book(), answers=[wrong, ANSWERS[1]])) == {"answered-balance"}


def test_acknowledged_orders_and_transfers_must_be_there_once() -> None:
    missing = [*ACKNOWLEDGED, AcknowledgedOrder("s1:1:2", ALICE, "a-2")]
    assert violated(audit(book(), acknowledged=missing)) == {"acknowledged-order"}
    renamed = [AcknowledgedOrder(ALICE_ORDER, ALICE, "a-9")]
    assert violated(audit(book(), acknowledged=renamed)) == {"acknowledged-order"}
    lost = [*TRANSFERS, AcknowledgedTransfer(ALICE, "dep-a2", "USD", 5)]
    assert violated(audit(book(), transfers=lost)) == {"transfer-acknowledged"}
    story = book()
    story.ledger[2:2] = ledger(
        "s1", 2, "dep-a", (ALICE, "user", "USD", 1_000_000), (0, "external", "USD", -1_000_000)
    )
    # Twice in the ledger: the acknowledged transfer, and what Alice's shard answers.
    assert violated(audit(story)) == {"transfer-acknowledged", "answered-balance"}


def test_a_withdrawal_beyond_the_balance_is_negative() -> None:
    story = book()
    story.ledger += ledger("s2", 9, "wd-b2", (BOB, "user", "XYZ", -71), (0, "external", "XYZ", 71))
    report = audit(
        story, stored={BOB: {"USD": 200_000}}, answers=[ANSWERS[0]], cursors={"s1": 5, "s2": 9}
    )
    assert violated(report) == {"balance-negative", "stored-balance"}


def test_a_posting_of_no_known_shape() -> None:
    story = book()
    story.ledger += ledger("s2", 9, "odd", (BOB, "user", "XYZ", -1), (ALICE, "user", "XYZ", 1))
    assert "posting-shape" in violated(audit(story, answers=[], stored={}))


def test_examples_are_bounded_and_counts_are_not() -> None:
    money = MoneyAudit([XYZ])
    for n in range(1, 1001):
        money.ledger_item(LedgerItem("s1", n, 0, ALICE, "user", "USD", 1, f"r{n}"))
    money.finish()
    report = money.report()
    assert report.counts["posting-balanced"] == 1000
    assert len([f for f in report.examples if f.check == "posting-balanced"]) == EXAMPLES_PER_CHECK


def test_a_row_past_its_shards_cursor() -> None:
    # s2's persister says it wrote through 5, but its withdrawal row is at 6.
    report = audit(book(), cursors={"s1": 5, "s2": 5})
    assert violated(report) == {"written-past-cursor"}
    assert report.counts["written-past-cursor"] == 2  # the posting's two rows
