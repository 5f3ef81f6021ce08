"""Positions per symbol from fills, at average cost, in exact integers.

A position is a signed quantity of lots (long > 0) with the quote amount paid
for it (`cost_basis`, negative for a short: what selling it received). Closing
part of a position realizes P&L against the proportional share of the cost
basis, rounded toward zero; the rounding stays in the basis, so closing the
whole position realizes it exactly. Fees are realized as a cost on every fill.
"""

from __future__ import annotations


class Position:
    __slots__ = ("cost_basis", "quantity_lots", "realized_pnl")

    def __init__(self, quantity_lots: int = 0, cost_basis: int = 0, realized_pnl: int = 0) -> None:
        self.quantity_lots = quantity_lots
        self.cost_basis = cost_basis
        self.realized_pnl = realized_pnl

    def plain(self) -> tuple[int, int, int]:
        return (self.quantity_lots, self.cost_basis, self.realized_pnl)

    def apply_fill(self, is_buy: bool, quantity_lots: int, notional: int, fee: int) -> None:
        held = self.quantity_lots
        if held == 0 or (held > 0) == is_buy:
            self.quantity_lots = held + quantity_lots if is_buy else held - quantity_lots
            self.cost_basis += notional if is_buy else -notional
        else:
            whole = held if held > 0 else -held
            closing = quantity_lots if quantity_lots < whole else whole
            basis_part = _share(self.cost_basis, closing, whole)
            # notional = price * quantity * tick_size, so this division is exact.
            closing_notional = notional * closing // quantity_lots
            if held > 0:
                self.realized_pnl += closing_notional - basis_part
            else:
                self.realized_pnl += -closing_notional - basis_part
            self.cost_basis -= basis_part
            held = held + closing if is_buy else held - closing
            opening = quantity_lots - closing
            if opening:
                opening_notional = notional - closing_notional
                held = held + opening if is_buy else held - opening
                self.cost_basis += opening_notional if is_buy else -opening_notional
            self.quantity_lots = held
        self.realized_pnl -= fee

    def unrealized_pnl(self, mark_price_ticks: int, tick_size: int) -> int:
        """Value at the mark minus the cost basis (0 without a mark)."""
        if mark_price_ticks <= 0 or not self.quantity_lots:
            return 0
        return self.quantity_lots * mark_price_ticks * tick_size - self.cost_basis


def _share(amount: int, part: int, whole: int) -> int:
    """amount * part / whole, rounded toward zero."""
    if amount >= 0:
        return amount * part // whole
    return -((-amount) * part // whole)
