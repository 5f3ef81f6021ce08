"""What an audit found: violations by check, each with a few examples, and its figures."""

from __future__ import annotations

from dataclasses import dataclass, field

# Every check the auditor makes, and what its violation means. Names are stable: tests
# and `oms audit --json` readers key on them.
CHECKS: dict[str, str] = {
    "posting-balanced": "a ledger posting (one reference at one log position) does not sum"
    " to zero in some asset",
    "posting-shape": "a ledger posting is neither a transfer (one user row and the external"
    " account) nor a fill (user, clearing and fee rows)",
    "transfer-acknowledged": "an acknowledged deposit or withdrawal is missing from the ledger,"
    " is there twice, or with another asset or amount",
    "fill-market": "a fill of a symbol the market catalog does not have",
    "fill-fee": "a fill's fee is not its notional times the maker's or taker's rate (floor)",
    "fill-order": "a fill's order is missing, or names another user, symbol or side",
    "fill-price": "a fill is outside its limit order's price",
    "trade-pair": "a trade is not exactly one maker and one taker fill of one price and"
    " quantity, opposite sides, two users",
    "order-fills": "an order's filled quantity is not the sum of its fills, or more than it"
    " asked for",
    "order-status": "an order's status does not match its quantities, or is unknown",
    "order-final": "an order is still live where the mesh was said to be flat",
    "ledger-user": "a user's ledger sum is not what its transfers and fills add up to",
    "balance-negative": "a user's recomputed balance is negative",
    "fees-account": "the fee account is not the sum of the fills' fees",
    "clearing-account": "the clearing account is not zero with every trade's two sides in",
    "stored-balance": "a user's balance stored in PostgreSQL (not resident) differs from the"
    " recomputation",
    "answered-balance": "a user's balance as the admin API answers differs from the recomputation",
    "answered-flat": "a user holds reservations or open orders where the mesh was said to be flat",
    "written-past-cursor": "a row stamped with a log position past its shard's persister"
    " cursor (a batch's rows and its cursor are committed together)",
    "acknowledged-order": "an acknowledged order is missing from PostgreSQL, or is there under"
    " another user or client order id",
}
EXAMPLES_PER_CHECK = 5


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    subject: str  # what it is about: "user 7 USDT", "trade BTC-USDT#12", an order id
    detail: str


@dataclass
class Findings:
    """Violations counted by check, the first few of each kept as examples (bounded)."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: list[Finding] = field(default_factory=list)
    evaluated: int = 0  # comparisons made, violated or not

    def checked(self, holds: bool, check: str, subject: str, detail: str = "") -> bool:
        self.evaluated += 1
        if not holds:
            self.add(Finding(check, subject, detail))
        return holds

    def add(self, finding: Finding) -> None:
        if finding.check not in CHECKS:
            raise ValueError(f"unknown audit check {finding.check!r}")
        count = self.counts.get(finding.check, 0)
        self.counts[finding.check] = count + 1
        if count < EXAMPLES_PER_CHECK:
            self.examples.append(finding)

    @property
    def violations(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class AuditReport:
    figures: dict[str, int]  # what was read and recomputed: users, orders, fills, ...
    counts: dict[str, int]  # violations by check
    examples: tuple[Finding, ...]
    evaluated: int

    @property
    def violations(self) -> int:
        return sum(self.counts.values())

    @property
    def clean(self) -> bool:
        return not self.counts

    def signature(self) -> tuple[tuple[str, int], ...]:
        """What a repeated audit compares to tell a settled answer from a moving one."""
        return tuple(sorted(self.counts.items()))
