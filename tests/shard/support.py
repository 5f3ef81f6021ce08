"""A driver for the shard machine in tests: builds commands, applies them, checks invariants.

Every `run`/`tick` checks every invariant afterwards (`check_invariants`), so a
test that forgets to check still fails on the first broken step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from services.runtime.core.state_machine import ApplyContext
from services.shard.core.codec import encode_command_batch
from services.shard.core.commands import (
    CancelOrder,
    Command,
    DedupAnswer,
    Deposit,
    FlushComplete,
    FlushRefused,
    HydrateUser,
    MarkPrices,
    MatcherEvent,
    MatcherEvents,
    PlaceOrder,
    Reconcile,
    ReconciledOrder,
    SetRiskLimits,
    Withdraw,
)
from services.shard.core.egress import (
    BeginDehydrate,
    Egress,
    HydrateRequest,
    LedgerPosting,
    OrderUpdate,
    ShardResult,
)
from services.shard.core.risk import RiskLimits
from services.shard.core.settings import ShardSettings, SymbolSettings
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.user_state import RecentResult, UserState
from services.shard.core.vocabulary import BUY, LIMIT, MARKET, PPM, EventKind

SHARD = "s1"
BTC = SymbolSettings(
    symbol="BTC-USDT",
    base_asset="BTC",
    quote_asset="USDT",
    lot_size=1_000,
    tick_size=10,
    maker_fee_ppm=1_000,
    taker_fee_ppm=2_000,
    matcher_group="g1",
)
ETH = SymbolSettings(
    symbol="ETH-USDT",
    base_asset="ETH",
    quote_asset="USDT",
    lot_size=100,
    tick_size=1,
    maker_fee_ppm=0,
    taker_fee_ppm=500,
    matcher_group="g2",
)
START_MS = 10_000_000
TTL_MS = 60_000
HORIZON_MS = 120_000


def settings(**overrides: Any) -> ShardSettings:
    base: dict[str, Any] = {
        "shard_id": SHARD,
        "symbols": (BTC, ETH),
        "idle_ttl_ms": TTL_MS,
        "dedup_horizon_ms": HORIZON_MS,
        "dedup_session_ms": HORIZON_MS // 2,
        "dedup_filters": 3,
        "dedup_filter_bits": 1 << 14,
        "conservation_check_interval": 1,
    }
    base.update(overrides)
    return ShardSettings(**base)


T = TypeVar("T", bound=Egress)


def of_type(egress: Iterable[Egress], kind: type[T]) -> list[T]:
    return [item for item in egress if type(item) is kind]


def only(egress: Iterable[Egress], kind: type[T]) -> T:
    found = of_type(egress, kind)
    assert len(found) == 1, f"expected one {kind.__name__}, got {found}"
    return found[0]


def results(egress: Iterable[Egress]) -> list[ShardResult]:
    return of_type(egress, ShardResult)


def unbalanced_postings(egress: Iterable[Egress]) -> list[LedgerPosting]:
    """Ledger postings whose rows do not sum to zero per asset (double entry broken)."""
    broken = []
    for posting in of_type(egress, LedgerPosting):
        sums: dict[str, int] = {}
        for _, _, asset, amount in posting.rows:
            sums[asset] = sums.get(asset, 0) + amount
        if any(sums.values()):
            broken.append(posting)
    return broken


class ShardDriver:
    def __init__(self, shard_settings: ShardSettings | None = None, start_ms: int = START_MS):
        self.settings = shard_settings or settings()
        self.machine = ShardMachine(self.settings)
        self.now = start_ms
        self.position = 0
        self.correlation = 0
        self.sequences: dict[str, int] = {}
        self.trade_id = 0
        self.history: list[Egress] = []
        self.run()  # the first entry sets the consensus clock (and rotates the Bloom filters)

    # --- applying ---------------------------------------------------------------

    def run(self, *commands: Command, advance_ms: int = 0) -> list[Egress]:
        self.now += advance_ms
        self.position += 1
        out = self.machine.apply_commands(list(commands), self.now)
        self.machine.check_invariants()
        self.history.extend(out)
        return out

    def run_bytes(self, commands: Sequence[Command], advance_ms: int = 0) -> list[Egress]:
        return self.run_raw(encode_command_batch(commands), advance_ms)

    def run_raw(self, data: bytes, advance_ms: int = 0) -> list[Egress]:
        self.now += advance_ms
        self.position += 1
        out = self.machine.apply(data, ApplyContext(self.position, self.now))
        self.machine.check_invariants()
        self.history.extend(out)
        return list(out)

    def tick(self, advance_ms: int = 0) -> list[Egress]:
        self.now += advance_ms
        self.position += 1
        out = self.machine.on_timer(ApplyContext(self.position, self.now))
        self.machine.check_invariants()
        self.history.extend(out)
        return list(out)

    # --- commands ---------------------------------------------------------------

    def next_correlation(self) -> int:
        self.correlation += 1
        return self.correlation

    def place(
        self,
        user_id: int,
        client_order_id: str,
        *,
        symbol: str = "BTC-USDT",
        side: int = BUY,
        order_type: int = LIMIT,
        price_ticks: int = 100,
        quantity_lots: int = 1,
        quote_amount: int = 0,
        time_in_force: int = 0,
        expire_at_ms: int = 0,
    ) -> PlaceOrder:
        if order_type == MARKET:
            price_ticks = 0
        return PlaceOrder(
            self.next_correlation(),
            user_id,
            client_order_id,
            symbol,
            side,
            order_type,
            time_in_force,
            price_ticks,
            quantity_lots,
            quote_amount,
            expire_at_ms,
            0,
            0,
        )

    def cancel(self, user_id: int, order_id: str = "", client_order_id: str = "") -> CancelOrder:
        return CancelOrder(self.next_correlation(), user_id, order_id, client_order_id, 0)

    def deposit(self, user_id: int, asset: str, amount: int, transfer_id: str = "") -> Deposit:
        correlation = self.next_correlation()
        return Deposit(correlation, user_id, asset, amount, transfer_id or f"d{correlation}")

    def withdraw(self, user_id: int, asset: str, amount: int, transfer_id: str = "") -> Withdraw:
        correlation = self.next_correlation()
        return Withdraw(correlation, user_id, asset, amount, transfer_id or f"w{correlation}")

    def hydrate(
        self,
        user_id: int,
        *,
        balances: dict[str, int] | None = None,
        known: bool = True,
        epoch: int = 0,
        **state: Any,
    ) -> HydrateUser:
        user_state = (
            UserState(user_id, balances=tuple((balances or {}).items()), **state) if known else None
        )
        return HydrateUser(self.next_correlation(), user_id, epoch, known, user_state)

    def flush_complete(self, user_id: int, epoch: int, db_version: int = 1) -> FlushComplete:
        return FlushComplete(self.next_correlation(), user_id, epoch, db_version)

    def flush_refused(self, user_id: int, epoch: int) -> FlushRefused:
        return FlushRefused(self.next_correlation(), user_id, epoch, "version conflict")

    def marks(self, **prices: int) -> MarkPrices:
        return MarkPrices(
            self.next_correlation(),
            tuple((symbol.replace("_", "-"), price) for symbol, price in prices.items()),
        )

    def limits(self, user_id: int, limits: RiskLimits, clear: bool = False) -> SetRiskLimits:
        return SetRiskLimits(self.next_correlation(), user_id, limits, clear)

    def dedup_answer(
        self, user_id: int, client_order_id: str, original: RecentResult | None
    ) -> DedupAnswer:
        return DedupAnswer(
            self.next_correlation(), user_id, client_order_id, original is not None, original
        )

    def reconcile(
        self, user_id: int, group: str, as_of: int, orders: Sequence[ReconciledOrder]
    ) -> Reconcile:
        return Reconcile(self.next_correlation(), user_id, group, as_of, tuple(orders))

    # --- matcher events -----------------------------------------------------------

    def event(
        self, group: str, kind: EventKind, order_id: str, user_id: int, **fields: Any
    ) -> MatcherEvent:
        sequence = self.sequences.get(group, 0) + 1
        self.sequences[group] = sequence
        return MatcherEvent(sequence, SHARD, order_id, user_id, int(kind), **fields)

    def fill(
        self,
        order_id: str,
        user_id: int,
        *,
        price_ticks: int,
        quantity_lots: int,
        side: int = BUY,
        maker: bool = False,
        done: bool = False,
        remaining_lots: int = 0,
        symbol: SymbolSettings = BTC,
    ) -> MatcherEvent:
        self.trade_id += 1
        notional = price_ticks * quantity_lots * symbol.tick_size
        rate = symbol.maker_fee_ppm if maker else symbol.taker_fee_ppm
        return self.event(
            symbol.matcher_group,
            EventKind.FILL,
            order_id,
            user_id,
            trade_id=self.trade_id,
            symbol=symbol.symbol,
            side=side,
            price_ticks=price_ticks,
            quantity_lots=quantity_lots,
            notional=notional,
            fee=notional * rate // PPM,
            maker=maker,
            remaining_lots=remaining_lots,
            order_done=done,
        )

    def events(self, group: str, *events: MatcherEvent) -> MatcherEvents:
        return MatcherEvents(self.next_correlation(), group, tuple(events))

    # --- shortcuts ---------------------------------------------------------------

    def resident(self, user_id: int, **balances: int) -> None:
        """Hydrate-ahead a user with balances (asset names as keywords)."""
        out = self.run(self.hydrate(user_id, balances=balances))
        assert self.machine.actor(user_id) is not None, out

    def accepted_order(self, user_id: int, client_order_id: str, **place: Any) -> str:
        """Place an order and have the matcher accept it; return its order id."""
        out = self.run(self.place(user_id, client_order_id, **place))
        result = only(out, ShardResult)
        assert result.accepted, result
        symbol = BTC if place.get("symbol", "BTC-USDT") == "BTC-USDT" else ETH
        group = symbol.matcher_group
        self.run(
            self.events(group, self.event(group, EventKind.ACCEPTED, result.order_id, user_id))
        )
        return result.order_id

    def evict(self, user_id: int, advance_ms: int = TTL_MS) -> list[Egress]:
        """Let a flat user go cold, sweep, and complete the flush."""
        out = self.tick(advance_ms)
        begin = [b for b in of_type(out, BeginDehydrate) if b.user_id == user_id]
        assert begin, f"user {user_id} was not swept: {out}"
        return self.run(self.flush_complete(user_id, begin[0].epoch, begin[0].state.db_version + 1))

    def balance(self, user_id: int, asset: str) -> tuple[int, int]:
        actor = self.machine.actor(user_id)
        assert actor is not None
        return actor.balances.get(asset, 0), actor.reserved.get(asset, 0)

    def replica(self) -> ShardMachine:
        twin = ShardMachine(self.settings)
        twin.restore(self.machine.snapshot())
        return twin


def updates(egress: Iterable[Egress]) -> list[OrderUpdate]:
    return of_type(egress, OrderUpdate)


def hydrate_requests(egress: Iterable[Egress]) -> list[HydrateRequest]:
    return of_type(egress, HydrateRequest)


def replace(state: UserState, **changes: Any) -> UserState:
    return dataclasses.replace(state, **changes)
