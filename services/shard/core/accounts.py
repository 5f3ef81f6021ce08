"""The shard's own accounts and the conservation law they prove.

Double entry: every fill leg moves value between a user and the shard's
clearing account, every fee from a user into the fee account; deposits and
withdrawals move value across the shard's boundary, and so do hydrations
(value arrives with the user's state) and completed flushes (value leaves
with it). Per asset, at every log position:

    sum(resident users' totals) + clearing + fees
        = deposits - withdrawals + hydrated_in - dehydrated_out

`resident` is kept incrementally (every change of a user's total updates it),
so the law is checkable in O(assets); `check_resident_totals` proves the
incremental sum against the actors themselves (O(users), for tests and restore).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.shard.core.errors import ConservationError

FIELDS = ("clearing", "fees", "deposits", "withdrawals", "hydrated_in", "dehydrated_out")


class ShardAccounts:
    __slots__ = (
        "clearing",
        "dehydrated_out",
        "deposits",
        "fees",
        "hydrated_in",
        "resident",
        "withdrawals",
    )

    def __init__(self, assets: Iterable[str]) -> None:
        names = tuple(assets)
        self.clearing = dict.fromkeys(names, 0)
        self.fees = dict.fromkeys(names, 0)
        self.deposits = dict.fromkeys(names, 0)
        self.withdrawals = dict.fromkeys(names, 0)
        self.hydrated_in = dict.fromkeys(names, 0)
        self.dehydrated_out = dict.fromkeys(names, 0)
        self.resident = dict.fromkeys(names, 0)  # sum of resident users' totals

    def add_asset(self, asset: str) -> None:
        """A hydrated state may hold an asset the settings no longer list: track it too."""
        for book in self._books():
            book.setdefault(asset, 0)

    def check_conservation(self) -> None:
        for asset, resident in self.resident.items():
            inside = resident + self.clearing[asset] + self.fees[asset]
            outside = (
                self.deposits[asset]
                - self.withdrawals[asset]
                + self.hydrated_in[asset]
                - self.dehydrated_out[asset]
            )
            if inside != outside:
                raise ConservationError(
                    f"{asset}: users {resident} + clearing {self.clearing[asset]} + fees "
                    f"{self.fees[asset]} = {inside}, but deposits - withdrawals + hydrated in "
                    f"- out = {outside}"
                )

    def check_resident_totals(self, balances: Iterable[dict[str, int]]) -> None:
        sums = dict.fromkeys(self.resident, 0)
        for totals in balances:
            for asset, total in totals.items():
                if asset not in sums:
                    raise ConservationError(f"a user holds {asset}, which no account tracks")
                sums[asset] += total
        if sums != self.resident:
            raise ConservationError(f"resident totals {self.resident} but users sum to {sums}")

    def plain(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        books = self._books()
        return tuple((asset, tuple(book[asset] for book in books)) for asset in self.resident)

    def restore_plain(self, data: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
        for asset, values in data:
            self.add_asset(asset)
            for book, value in zip(self._books(), values, strict=True):
                book[asset] = value

    def _books(self) -> tuple[dict[str, int], ...]:
        return (
            self.clearing,
            self.fees,
            self.deposits,
            self.withdrawals,
            self.hydrated_in,
            self.dehydrated_out,
            self.resident,
        )
