"""The auditor's own arithmetic: balances recomputed from transfers and fills.

Fed the ledger in log order, the fills by trade and the orders (any order), it holds
per user and asset what the transfers moved and what the fills moved, computed from the
fill's price, quantity and fee with the catalog's units:

    notional = price_ticks * tick_size * quantity_lots
    buyer:  base + quantity_lots * lot_size, quote - (notional + fee)
    seller: base - quantity_lots * lot_size, quote + (notional - fee)
    fee = notional * (maker_fee_ppm or taker_fee_ppm) // 1,000,000

and, once `finish` is called, compares that with the ledger's own user rows, the fee
and clearing accounts; then with stored and answered balances (`compare_stored`,
`compare_answers`). It keeps one number per user and asset, one per order in a trade
not yet closed, and a bounded set of examples: a large database streams through it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from auditor.core.findings import AuditReport, Findings
from auditor.core.rows import (
    BUY,
    CLEARING,
    EXTERNAL,
    FEES,
    FILLED,
    KNOWN_STATUSES,
    LIMIT,
    LIVE_STATUSES,
    PPM,
    SELL,
    USER,
    AcknowledgedOrder,
    AcknowledgedTransfer,
    FillRow,
    LedgerItem,
    MarketUnits,
    OrderRow,
    UserAnswer,
)

Amounts = defaultdict[str, int]


def _amounts() -> Amounts:
    return defaultdict(int)


def fill_effect(
    units: MarketUnits, side: int, price_ticks: int, lots: int, fee: int
) -> dict[str, int]:
    """What one fill moves in and out of its user's account, per asset."""
    notional = price_ticks * units.tick_size * lots
    base = lots * units.lot_size
    if side == BUY:
        return {units.base_asset: base, units.quote_asset: -(notional + fee)}
    return {units.base_asset: -base, units.quote_asset: notional - fee}


def expected_fee(units: MarketUnits, price_ticks: int, lots: int, maker: bool) -> int:
    rate = units.maker_fee_ppm if maker else units.taker_fee_ppm
    return price_ticks * units.tick_size * lots * rate // PPM


class MoneyAudit:
    """One audit pass. Feed `ledger_item` (log order), `fill` (trade order) and `order`,
    then `finish`, then the comparisons, then `report`."""

    def __init__(
        self,
        markets: Iterable[MarketUnits],
        *,
        acknowledged_transfers: Sequence[AcknowledgedTransfer] = (),
    ) -> None:
        self.markets = {market.symbol: market for market in markets}
        self.findings = Findings()
        self.transferred: defaultdict[int, Amounts] = defaultdict(_amounts)
        self.traded: defaultdict[int, Amounts] = defaultdict(_amounts)
        self.ledger_users: defaultdict[int, Amounts] = defaultdict(_amounts)
        self.accounts: defaultdict[str, Amounts] = defaultdict(_amounts)  # clearing, fees
        self.fees_of_fills: Amounts = _amounts()
        self.figures: dict[str, int] = defaultdict(int)
        self._posting: list[LedgerItem] = []
        self._trade: list[FillRow] = []
        self._unpaired = 0
        # (user, transfer id) -> the acknowledged (asset, amount) and how often it is seen
        self._acknowledged_transfers = {
            (t.user_id, t.transfer_id): (t.asset, t.amount) for t in acknowledged_transfers
        }
        self._transfers_seen: defaultdict[tuple[int, str], list[tuple[str, int]]] = defaultdict(
            list
        )
        self.expected: dict[int, dict[str, int]] = {}
        self.cursors: dict[str, int] | None = None  # shard -> its persister's cursor

    def persister_cursors(self, cursors: Mapping[str, int]) -> None:
        """Each shard's `persister_cursor`: no row of that shard may be stamped past it.
        Given before the rows."""
        self.cursors = dict(cursors)

    def _within_cursor(self, shard_id: str, position: int, subject: str) -> None:
        if self.cursors is None:
            return  # not told: not checked
        cursor = self.cursors.get(shard_id, 0)
        self.findings.checked(
            position <= cursor,
            "written-past-cursor",
            subject,
            f"{shard_id} position {position}, its cursor {cursor}",
        )

    # --- the ledger -----------------------------------------------------------------

    def ledger_item(self, item: LedgerItem) -> None:
        current = self._posting
        if current:
            first = current[0]
            if (first.shard_id, first.position, first.reference) != (
                item.shard_id,
                item.position,
                item.reference,
            ):
                self._close_posting()
        self._posting.append(item)
        self.figures["ledger_rows"] += 1
        self._within_cursor(item.shard_id, item.position, f"ledger {item.reference}")
        if item.account == USER:
            self.ledger_users[item.user_id][item.asset] += item.amount
        elif item.account != EXTERNAL:
            self.accounts[item.account][item.asset] += item.amount

    def _close_posting(self) -> None:
        rows = self._posting
        self._posting = []
        first = rows[0]
        subject = f"{first.shard_id}@{first.position} {first.reference}"
        self.figures["postings"] += 1
        sums: Amounts = _amounts()
        for row in rows:
            sums[row.asset] += row.amount
        unbalanced = {asset: amount for asset, amount in sums.items() if amount}
        self.findings.checked(not unbalanced, "posting-balanced", subject, f"sums {unbalanced}")
        accounts = [row.account for row in rows]
        users = {row.user_id for row in rows if row.account == USER}
        if EXTERNAL in accounts:
            ok = sorted(accounts) == [EXTERNAL, USER] and rows[0].asset == rows[1].asset
            if self.findings.checked(ok, "posting-shape", subject, f"accounts {accounts}"):
                user_row = next(row for row in rows if row.account == USER)
                self.transferred[user_row.user_id][user_row.asset] += user_row.amount
                self.figures["deposits" if user_row.amount > 0 else "withdrawals"] += 1
                key = (user_row.user_id, first.reference)
                if key in self._acknowledged_transfers:
                    self._transfers_seen[key].append((user_row.asset, user_row.amount))
        else:
            ok = len(users) == 1 and set(accounts) <= {USER, CLEARING, FEES}
            self.findings.checked(ok, "posting-shape", subject, f"accounts {accounts}")

    # --- fills ------------------------------------------------------------------------

    def fill(self, row: FillRow) -> None:
        current = self._trade
        if current and (current[0].symbol, current[0].trade_id) != (row.symbol, row.trade_id):
            self._close_trade()
        self._trade.append(row)
        self.figures["fills"] += 1
        subject = f"fill {row.order_id}#{row.trade_id}"
        self._within_cursor(row.shard_id, row.position, subject)
        units = self.markets.get(row.symbol)
        if not self.findings.checked(units is not None, "fill-market", subject, row.symbol):
            return
        assert units is not None
        fee = expected_fee(units, row.price_ticks, row.quantity_lots, row.maker)
        self.findings.checked(
            row.fee == fee, "fill-fee", subject, f"fee {row.fee}, the rate makes {fee}"
        )
        order = row.order
        if order is None:
            self.findings.checked(False, "fill-order", subject, "no order row")
        else:
            same = (order.user_id, order.symbol, order.side) == (row.user_id, row.symbol, row.side)
            self.findings.checked(
                same,
                "fill-order",
                subject,
                f"fill of user {row.user_id} {row.symbol} side {row.side}, order of user"
                f" {order.user_id} {order.symbol} side {order.side}",
            )
            if order.order_type == LIMIT:
                inside = (
                    row.price_ticks <= order.price_ticks
                    if row.side == BUY
                    else row.price_ticks >= order.price_ticks
                )
                self.findings.checked(
                    inside,
                    "fill-price",
                    subject,
                    f"at {row.price_ticks}, limit {order.price_ticks}",
                )
        for asset, amount in fill_effect(
            units, row.side, row.price_ticks, row.quantity_lots, row.fee
        ).items():
            self.traded[row.user_id][asset] += amount
        self.fees_of_fills[units.quote_asset] += row.fee

    def _close_trade(self) -> None:
        legs = self._trade
        self._trade = []
        self.figures["trades"] += 1
        first = legs[0]
        subject = f"trade {first.symbol}#{first.trade_id}"
        if len(legs) == 1:
            # The other side may be on another shard whose persister has not written it
            # yet: a finding that goes away; `report` counts it as unpaired.
            self._unpaired += 1
            self.findings.checked(False, "trade-pair", subject, f"one side only: {first.order_id}")
            return
        shape = sorted((leg.maker, leg.side) for leg in legs)
        ok = (
            len(legs) == 2
            and [maker for maker, _ in shape] == [False, True]
            and {side for _, side in shape} == {BUY, SELL}
            and legs[0].price_ticks == legs[1].price_ticks
            and legs[0].quantity_lots == legs[1].quantity_lots
            and legs[0].user_id != legs[1].user_id
        )
        self.findings.checked(
            ok,
            "trade-pair",
            subject,
            "; ".join(
                f"{leg.order_id} user {leg.user_id} side {leg.side} maker {leg.maker}"
                f" {leg.quantity_lots}@{leg.price_ticks}"
                for leg in legs
            ),
        )

    # --- orders -----------------------------------------------------------------------

    def order(self, row: OrderRow, *, flat: bool) -> None:
        self.figures["orders"] += 1
        subject = row.order_id
        findings = self.findings
        if row.shard_id:
            self._within_cursor(row.shard_id, row.updated_position, subject)
        findings.checked(
            row.filled_lots == row.fills_lots,
            "order-fills",
            subject,
            f"filled {row.filled_lots}, its fills add up to {row.fills_lots}",
        )
        if row.order_type == LIMIT:
            findings.checked(
                row.filled_lots + row.remaining_lots <= row.quantity_lots,
                "order-fills",
                subject,
                f"filled {row.filled_lots} + left {row.remaining_lots} > {row.quantity_lots}",
            )
            if row.status == FILLED:
                findings.checked(
                    row.filled_lots == row.quantity_lots and row.remaining_lots == 0,
                    "order-status",
                    subject,
                    f"FILLED with {row.filled_lots} of {row.quantity_lots}",
                )
        findings.checked(row.status in KNOWN_STATUSES, "order-status", subject, str(row.status))
        if flat:
            findings.checked(
                row.status not in LIVE_STATUSES, "order-final", subject, f"status {row.status}"
            )

    def acknowledged_orders(
        self,
        acknowledged: Sequence[AcknowledgedOrder],
        stored: Mapping[str, tuple[int, str]],  # order id -> (user, client order id)
    ) -> None:
        for order in acknowledged:
            found = stored.get(order.order_id)
            self.findings.checked(
                found == (order.user_id, order.client_order_id),
                "acknowledged-order",
                order.order_id,
                f"acknowledged for user {order.user_id} as {order.client_order_id!r},"
                f" stored {found}",
            )
        self.figures["acknowledged_orders"] = len(acknowledged)

    # --- the totals ---------------------------------------------------------------------

    def finish(self) -> None:
        """Close the last posting and trade, recompute every balance, compare the ledger."""
        if self._posting:
            self._close_posting()
        if self._trade:
            self._close_trade()
        findings = self.findings
        for key, (asset, amount) in sorted(self._acknowledged_transfers.items()):
            seen = self._transfers_seen.get(key, [])
            findings.checked(
                seen == [(asset, amount)],
                "transfer-acknowledged",
                f"user {key[0]} transfer {key[1]!r}",
                f"acknowledged {amount} {asset}, the ledger holds {seen}",
            )
        users = sorted(set(self.transferred) | set(self.traded) | set(self.ledger_users))
        for user_id in users:
            expected: dict[str, int] = dict(self.transferred.get(user_id, {}))
            for asset, amount in self.traded.get(user_id, {}).items():
                expected[asset] = expected.get(asset, 0) + amount
            self.expected[user_id] = expected
            booked: Mapping[str, int] = self.ledger_users.get(user_id, {})
            for asset in sorted(set(expected) | set(booked)):
                want, have = expected.get(asset, 0), booked.get(asset, 0)
                findings.checked(
                    want == have,
                    "ledger-user",
                    f"user {user_id} {asset}",
                    f"transfers and fills make {want}, the ledger sums to {have}",
                )
                findings.checked(
                    want >= 0, "balance-negative", f"user {user_id} {asset}", str(want)
                )
        fees: Mapping[str, int] = self.accounts.get(FEES, {})
        for asset in sorted(set(fees) | set(self.fees_of_fills)):
            findings.checked(
                fees.get(asset, 0) == self.fees_of_fills.get(asset, 0),
                "fees-account",
                asset,
                f"fee account {fees.get(asset, 0)}, fills' fees {self.fees_of_fills.get(asset, 0)}",
            )
        if not self._unpaired:
            for asset, amount in sorted(self.accounts.get(CLEARING, {}).items()):
                findings.checked(amount == 0, "clearing-account", asset, f"holds {amount}")
        self.figures["users"] = len(users)

    def balance_of(self, user_id: int) -> dict[str, int]:
        return {a: v for a, v in self.expected.get(user_id, {}).items() if v}

    def compare_stored(self, stored: Mapping[int, Mapping[str, int]]) -> None:
        """PostgreSQL's `balances` of users that are not resident (flushed, so final)."""
        for user_id, balances in sorted(stored.items()):
            held = {asset: amount for asset, amount in balances.items() if amount}
            want = self.balance_of(user_id)
            self.findings.checked(
                held == want,
                "stored-balance",
                f"user {user_id}",
                f"stored {held}, recomputed {want}",
            )
        self.figures["stored_users_compared"] = len(stored)

    def compare_answers(self, answers: Sequence[UserAnswer], *, flat: bool) -> None:
        """The admin API's balances of every user, and with `flat` nothing reserved or open."""
        for answer in answers:
            held = {asset: total for asset, (total, _) in answer.balances.items() if total}
            want = self.balance_of(answer.user_id)
            where = "resident" if answer.resident else "stored"
            self.findings.checked(
                held == want,
                "answered-balance",
                f"user {answer.user_id}",
                f"answered ({where}) {held}, recomputed {want}",
            )
            if flat:
                reserved = {a: r for a, (_, r) in answer.balances.items() if r}
                self.findings.checked(
                    not reserved and not answer.open_orders,
                    "answered-flat",
                    f"user {answer.user_id}",
                    f"reserved {reserved}, open orders {answer.open_orders}",
                )
        self.figures["answered_users_compared"] = len(answers)

    def report(self) -> AuditReport:
        figures = dict(self.figures)
        figures["unpaired_trades"] = self._unpaired
        return AuditReport(
            figures,
            dict(self.findings.counts),
            tuple(self.findings.examples),
            self.findings.evaluated,
        )
