"""Differential tests: the matcher core against the independent reference matcher.

Random streams of every order type (limit GTC/IOC/FOK/post-only/GTD, market buy by
quote, market sell), cancels, duplicates, malformed orders, halts, kill switches and
timer ticks, for several users on two OMS shards and two symbols, with prices near the
reference. Both sides must produce the same results and events (fills with price,
quantity, fee, maker flag and trade order; rejections with reasons; cancels; expiries),
and end with the same books (levels, FIFO order, remaining quantities), open orders,
order states and last prices.

Hypothesis drives short streams it can shrink; seeded long streams reach deep books,
small sweep budgets and many horizons.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protos.oms.v1 import matcher_pb2
from tests.matcher import support
from tests.matcher.reference_matcher import ReferenceMatcher
from tests.matcher.support import BUY, FOK, GTC, GTD, IOC, MARKET, POST_ONLY, SELL

SHARDS = ("s1", "s2")
USERS = (1, 2, 3, 4)
SYMBOLS = ("AAA-USD", "BBB-USD")
REFERENCE = {"AAA-USD": 100, "BBB-USD": 50}


class Chooser(Protocol):
    def integer(self, low: int, high: int) -> int: ...


@dataclass
class RandomChooser:
    rng: random.Random

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)


@dataclass
class DataChooser:
    data: st.DataObject

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))


@dataclass
class StreamBuilder:
    """Turns random choices into commands, keeping per (shard, user) sequence numbers."""

    choose: Chooser
    mid_of: Callable[[str], int]
    next_seq: dict[tuple[str, int], int] = field(default_factory=dict)
    issued: list[tuple[str, int]] = field(default_factory=list)

    def pick(self, options: Sequence[str]) -> str:
        return options[self.choose.integer(0, len(options) - 1)]

    def new_id(self, user: int) -> str:
        shard = self.pick(SHARDS)
        sequence = self.next_seq.get((shard, user), 0) + 1
        self.next_seq[(shard, user)] = sequence
        order_id = f"{shard}:{user}:{sequence}"
        self.issued.append((order_id, user))
        return order_id

    def order_id(self, user: int) -> tuple[str, int]:
        mode = self.choose.integer(0, 39)
        if mode == 0 and self.issued:  # re-submit a known id (maybe with other fields)
            return self.issued[self.choose.integer(0, len(self.issued) - 1)]
        if mode == 1:  # malformed: wrong user, leading zero, bad shape
            bad = (f"s1:{user + 1}:5", f"s1:{user}:05", f"s1:{user}", f":{user}:1", f"s1:{user}:0")
            return self.pick(bad), user
        return self.new_id(user), user

    def submit(self, now: int) -> matcher_pb2.MatcherCommand:
        choose = self.choose
        order_id, user = self.order_id(USERS[choose.integer(0, len(USERS) - 1)])
        symbol = SYMBOLS[choose.integer(0, 1)] if choose.integer(0, 60) else "ZZZ-USD"
        side = BUY if choose.integer(0, 1) else SELL
        stp = choose.integer(0, 3)
        kind = choose.integer(0, 19)
        price = self.mid_of(symbol) + choose.integer(-5, 5)
        if choose.integer(0, 9) == 0:  # now and then beyond the price band
            price += choose.integer(-3, 3)
        quantity = choose.integer(1, 12)

        def make(**fields: Any) -> matcher_pb2.Order:
            fields.setdefault("side", side)
            fields.setdefault("symbol", symbol)
            fields.setdefault("stp", stp)
            return support.order(order_id, user, fields.pop("side"), **fields)

        if kind <= 7:
            order = make(price=price, quantity=quantity, tif=GTC)
        elif kind <= 12:
            tif = (IOC, FOK, POST_ONLY, IOC, FOK)[kind - 8]
            order = make(price=price, quantity=quantity, tif=tif)
        elif kind <= 14:
            expire = now + choose.integer(-3, 80)
            order = make(price=price, quantity=quantity, tif=GTD, expire_at_ms=expire)
        elif kind == 15:
            order = make(side=BUY, quote=choose.integer(1, 2_500), order_type=MARKET, tif=0)
        elif kind == 16:
            order = make(side=SELL, quantity=quantity, order_type=MARKET, tif=0)
        elif kind == 17:  # small limits: some fall below the minimum notional
            order = make(price=price, quantity=1, tif=GTC)
        else:  # inconsistent or off-grid fields
            order = self.malformed(make, price, quantity, now)
        return support.submit(order, correlation_id=choose.integer(0, 1_000))

    def malformed(
        self, make: Callable[..., matcher_pb2.Order], price: int, quantity: int, now: int
    ) -> matcher_pb2.Order:
        variants: list[dict[str, Any]] = [
            {"side": 0, "price": price, "quantity": quantity},
            {"price": -price, "quantity": quantity},
            {"price": price, "quantity": -quantity},
            {"price": 0, "quantity": quantity},
            {"price": price, "quantity": quantity, "order_type": MARKET, "tif": 0},
            {"side": BUY, "quantity": quantity, "order_type": MARKET, "tif": 0},
            {"price": price, "quantity": quantity, "tif": 0},
            {"price": price, "quantity": quantity, "tif": GTD},
            {"price": price, "quantity": quantity, "expire_at_ms": now + 5},
            {"price": price, "quantity": quantity, "order_type": 0},
            {"side": SELL, "quantity": 0, "order_type": MARKET, "tif": 0},
            {"price": price, "quantity": quantity, "tif": IOC, "stp": 9},
        ]
        return make(**variants[self.choose.integer(0, len(variants) - 1)])

    def command(self, now: int) -> matcher_pb2.MatcherCommand:
        draw = self.choose.integer(0, 99)
        if draw < 70 or not self.issued:
            return self.submit(now)
        if draw < 92:
            recent = min(len(self.issued), 12 if self.choose.integer(0, 3) else 1_000)
            order_id, user = self.issued[-self.choose.integer(1, recent)]
            if self.choose.integer(0, 9) == 0:
                user += 1  # somebody else's order: not found
            return support.cancel(order_id, user, correlation_id=self.choose.integer(0, 1_000))
        if draw < 95:
            enable = self.choose.integer(0, 7) == 0  # mostly lifting it again
            return support.kill_switch(USERS[self.choose.integer(0, len(USERS) - 1)], enable)
        if draw < 98:
            symbol = (*SYMBOLS, "ZZZ-USD")[self.choose.integer(0, 2)]
            if self.choose.integer(0, 7) == 0:
                return support.halt(symbol, cancel_resting=bool(self.choose.integer(0, 1)))
            return support.resume(symbol)
        return matcher_pb2.MatcherCommand(correlation_id=7)  # no command set


def run_stream(
    choose: Chooser, steps: int, horizon_ms: int, expiries: int, sweeps: int, *, book_every: int = 1
) -> None:
    driver = support.Driver.create(
        dedup_horizon_ms=horizon_ms,
        max_expiries_per_timer=expiries,
        max_dedup_sweeps_per_timer=sweeps,
    )
    reference = ReferenceMatcher(
        {symbol.symbol: symbol for symbol in support.SYMBOLS}, horizon_ms, expiries, sweeps
    )
    builder = StreamBuilder(
        choose, lambda symbol: reference.reference(symbol) if symbol in REFERENCE else 100
    )
    now = 1_000
    for step in range(steps):
        now += choose.integer(0, 3) * choose.integer(0, 12)
        if choose.integer(0, 5) == 0:
            assert driver.timer(now) == reference.timer(now), f"timer at step {step}"
            continue
        commands = [builder.command(now) for _ in range(choose.integer(1, 4))]
        expected = reference.execute(commands, now)
        assert driver.apply(commands, now) == expected, f"step {step}: {commands}"
        if step % book_every == 0:
            for symbol in SYMBOLS:
                assert driver.book(symbol) == reference.book(symbol), f"book after step {step}"
    engine = driver.machine.engine
    for symbol in SYMBOLS:
        assert driver.book(symbol) == reference.book(symbol)
    for shard in SHARDS:
        for user in USERS:
            snapshot = driver.machine.open_orders(shard, user)
            as_of, states = reference.open_orders(shard, user)
            assert snapshot.as_of_sequence == as_of
            assert [support.state_tuple(state) for state in snapshot.orders] == states
    for order_id, _ in builder.issued:
        state = driver.machine.order_state(order_id)
        expected_order = reference.orders.get(order_id)
        if expected_order is None:
            assert state is None
        else:
            assert state is not None
            assert support.state_tuple(state) == expected_order.state()
    assert {price.symbol: price.price_ticks for price in driver.machine.last_prices()} == (
        reference.last_price
    )
    assert engine.last_trade_id == reference.trade_id


@given(
    data=st.data(),
    horizon_ms=st.sampled_from((0, 40, 300)),
    expiries=st.sampled_from((1, 2, 1_000)),
    sweeps=st.sampled_from((1, 3, 1_000)),
)
def test_matches_reference_on_random_streams(
    data: st.DataObject, horizon_ms: int, expiries: int, sweeps: int
) -> None:
    steps = data.draw(st.integers(1, 60))
    run_stream(DataChooser(data), steps, horizon_ms, expiries, sweeps)


@pytest.mark.parametrize("seed", range(6))
def test_matches_reference_on_long_seeded_streams(seed: int) -> None:
    rng = random.Random(seed)
    horizon_ms = (0, 50, 400, 5_000)[seed % 4]
    run_stream(RandomChooser(rng), 1_500, horizon_ms, 1 + seed % 3, 2 + seed % 4, book_every=25)
