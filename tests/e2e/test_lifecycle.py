"""One order's whole life through the public API, with every balance and position computed by hand.

The catalog (services/markets/default_markets.toml), BTC-USDT:
  lot = 10,000 sats (BTC minor units), tick = 1 micro-USDT per lot, so a trade's
  notional = price_ticks * lots micro-USDT; maker fee 1,000 ppm, taker fee 2,000 ppm of
  notional, rounded down, charged in USDT; a limit buy reserves notional plus the fee at
  the higher (taker) rate, a sell reserves its lots of BTC (DESIGN.md rule 4, section 6a).
A trade happens at the resting (maker) order's price.

Every number asserted below is written out by hand from those rules, with its
arithmetic in a comment: the test does not recompute what the shard does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from gateway.client import AdminClient, OmsClient, OrderUpdateStream
from protos.oms.v1 import common_pb2, gateway_pb2, matcher_pb2, shard_pb2
from tests.e2e.invariants import check_full_mesh
from tests.full_mesh import FullMesh
from tests.gateway.accounts import BTC, eventually, open_account

S = common_pb2
BUY, SELL = S.SIDE_BUY, S.SIDE_SELL
USDT_DEPOSIT = 100_000_000_000  # 100,000 USDT
BTC_DEPOSIT = 1_000_000  # 0.01 BTC = 100 lots
GTD_AHEAD_MS = 2_000  # consensus time follows the wall clock to within milliseconds


@dataclass
class Trader:
    user_id: int
    client: OmsClient
    updates: OrderUpdateStream
    seen: list[shard_pb2.OrderUpdate]

    async def place(self, client_order_id: str, side: int, **fields: int) -> gateway_pb2.OrderAck:
        ack = await self.client.place(client_order_id, BTC, side, **fields)
        assert ack.accepted and ack.status == S.ORDER_STATUS_PENDING, ack
        return ack

    async def until(self, order_id: str, status: int) -> shard_pb2.OrderUpdate:
        """Read this trader's updates until `order_id` reaches `status`."""
        for update in self.seen:
            if update.order_id == order_id and update.status == status:
                return update
        while True:
            update = await self.updates.next()
            self.seen.append(update)
            if update.order_id == order_id and update.status == status:
                return update

    def statuses(self, order_id: str) -> list[int]:
        return [u.status for u in self.seen if u.order_id == order_id]

    async def balances(self) -> dict[str, tuple[int, int]]:
        """(total, reserved) per asset."""
        return {a: (b.total, b.reserved) for a, b in (await self.client.balances()).items()}

    async def position(self) -> tuple[int, int, int]:
        """BTC-USDT (quantity lots, cost basis, realized P&L)."""
        (view,) = [p for p in (await self.client.positions()).positions if p.symbol == BTC]
        return (view.quantity_lots, view.cost_basis, view.realized_pnl)


@asynccontextmanager
async def trader(
    mesh: FullMesh, admin: AdminClient, deposits: dict[str, int]
) -> AsyncIterator[Trader]:
    account = await open_account(admin, deposits)
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(account.client(mesh.gateway.address))
        updates = await stack.enter_async_context(client.order_updates())
        yield Trader(account.user_id, client, updates, [])


async def test_place_partial_fill_fill_cancel_expire_and_post_only_reject(
    either_mesh: FullMesh,
) -> None:
    """In both forms of the mesh: a process per service, and a co-located shard cluster."""
    e2e_mesh = either_mesh
    acknowledged: list[str] = []
    async with (
        e2e_mesh.admin() as admin,
        trader(e2e_mesh, admin, {"USDT": USDT_DEPOSIT}) as a,
        trader(e2e_mesh, admin, {"USDT": USDT_DEPOSIT, "BTC": BTC_DEPOSIT}) as b,
    ):
        # --- place: A bids 10 lots at 6,500,000 -------------------------------------------
        bid = await a.place("bid", BUY, price_ticks=6_500_000, quantity_lots=10)
        acknowledged.append(bid.order_id)
        await a.until(bid.order_id, S.ORDER_STATUS_OPEN)
        # reserve 6,500,000 * 10 = 65,000,000 + 2,000 ppm of it = 130,000
        assert await a.balances() == {"USDT": (100_000_000_000, 65_130_000)}

        # --- partial fill: B sells 4 lots into the bid -----------------------------------
        ask = await b.place("ask-4", SELL, price_ticks=6_500_000, quantity_lots=4)
        acknowledged.append(ask.order_id)
        partial = await a.until(bid.order_id, S.ORDER_STATUS_PARTIALLY_FILLED)
        assert (partial.filled_lots, partial.remaining_lots) == (4, 6)
        assert (partial.last_fill_price_ticks, partial.last_fill_lots) == (6_500_000, 4)
        await b.until(ask.order_id, S.ORDER_STATUS_FILLED)
        # notional 6,500,000 * 4 = 26,000,000; A (maker) pays 26,000, B (taker) 52,000.
        assert await a.balances() == {
            # 100,000,000,000 - 26,000,000 - 26,000
            # reserved 65,130,000 - 26,026,000: the rest stays with the 6 lots left
            "USDT": (99_973_974_000, 39_104_000),
            "BTC": (40_000, 0),  # 4 lots * 10,000 sats
        }
        assert await a.position() == (4, 26_000_000, -26_000)  # the fee is a realized cost
        assert await b.balances() == {
            "USDT": (100_025_948_000, 0),  # + 26,000,000 - 52,000
            "BTC": (960_000, 0),  # 1,000,000 - 40,000
        }
        assert await b.position() == (-4, -26_000_000, -52_000)

        # --- fill: B sells 6 more below the bid; they trade at the bid's price ------------
        rest = await b.place("ask-6", SELL, price_ticks=6_490_000, quantity_lots=6)
        acknowledged.append(rest.order_id)
        filled = await a.until(bid.order_id, S.ORDER_STATUS_FILLED)
        assert (filled.filled_lots, filled.remaining_lots) == (10, 0)
        assert (filled.last_fill_price_ticks, filled.last_fill_lots) == (6_500_000, 6)
        await b.until(rest.order_id, S.ORDER_STATUS_FILLED)
        # notional 6,500,000 * 6 = 39,000,000; A pays 39,000, B 78,000.
        assert await a.balances() == {
            # 99,973,974,000 - 39,039,000; the 65,000 of unused taker-rate fee is released
            "USDT": (99_934_935_000, 0),
            "BTC": (100_000, 0),
        }
        assert await a.position() == (10, 65_000_000, -65_000)
        assert await b.balances() == {
            "USDT": (100_064_870_000, 0),  # 100,025,948,000 + 39,000,000 - 78,000
            "BTC": (900_000, 0),
        }
        assert await b.position() == (-10, -65_000_000, -130_000)
        assert a.statuses(bid.order_id) == [
            S.ORDER_STATUS_PENDING,
            S.ORDER_STATUS_OPEN,
            S.ORDER_STATUS_PARTIALLY_FILLED,
            S.ORDER_STATUS_FILLED,
        ]

        # --- realized P&L: A sells 4 of its 10 lots at 6,600,000 (maker), B buys them -----
        offer = await a.place("offer-4", SELL, price_ticks=6_600_000, quantity_lots=4)
        acknowledged.append(offer.order_id)
        await a.until(offer.order_id, S.ORDER_STATUS_OPEN)
        assert await a.balances() == {"USDT": (99_934_935_000, 0), "BTC": (100_000, 40_000)}
        lift = await b.place("lift-4", BUY, price_ticks=6_600_000, quantity_lots=4)
        acknowledged.append(lift.order_id)
        await a.until(offer.order_id, S.ORDER_STATUS_FILLED)
        await b.until(lift.order_id, S.ORDER_STATUS_FILLED)
        # notional 6,600,000 * 4 = 26,400,000; A (maker) pays 26,400, B (taker) 52,800.
        assert await a.balances() == {
            "USDT": (99_961_308_600, 0),  # 99,934,935,000 + 26,400,000 - 26,400
            "BTC": (60_000, 0),
        }
        # closes 4 of 10 lots bought for 65,000,000: basis 26,000,000 of it, sold for
        # 26,400,000: +400,000; realized -65,000 + 400,000 - 26,400; basis left 39,000,000
        assert await a.position() == (6, 39_000_000, 308_600)
        assert await b.balances() == {
            # reserved 26,400,000 + 52,800 and spent exactly that
            "USDT": (100_038_417_200, 0),  # 100,064,870,000 - 26,452,800
            "BTC": (940_000, 0),
        }
        # B's short of 10 (-65,000,000) buys back 4 at 26,400,000 against a basis of
        # 26,000,000: -400,000; realized -130,000 - 400,000 - 52,800
        assert await b.position() == (-6, -39_000_000, -582_800)

        # --- cancel: A bids 5 lots at 6,000,000 (rests), then cancels -----------------------
        low_bid = await a.place("low-bid", BUY, price_ticks=6_000_000, quantity_lots=5)
        acknowledged.append(low_bid.order_id)
        await a.until(low_bid.order_id, S.ORDER_STATUS_OPEN)
        # 6,000,000 * 5 = 30,000,000 + 60,000
        assert (await a.balances())["USDT"] == (99_961_308_600, 30_060_000)
        cancel = await a.client.cancel(client_order_id="low-bid")
        assert cancel.accepted and cancel.order_id == low_bid.order_id, cancel
        await a.until(low_bid.order_id, S.ORDER_STATUS_CANCELLED)
        assert await a.balances() == {"USDT": (99_961_308_600, 0), "BTC": (60_000, 0)}

        # --- GTD expiry: 1 lot at 6,000,000 good for two seconds of consensus time ---------
        gtd = await a.place(
            "gtd",
            BUY,
            price_ticks=6_000_000,
            quantity_lots=1,
            time_in_force=S.TIME_IN_FORCE_GTD,
            expire_at_ms=time.time_ns() // 1_000_000 + GTD_AHEAD_MS,
        )
        acknowledged.append(gtd.order_id)
        # reserved from admission until the matcher expires it: 6,000,000 + 12,000
        assert (await a.balances())["USDT"] == (99_961_308_600, 6_012_000)
        expired = await a.until(gtd.order_id, S.ORDER_STATUS_EXPIRED)
        assert (expired.filled_lots, expired.remaining_lots) == (0, 1)
        assert a.statuses(gtd.order_id) == [
            S.ORDER_STATUS_PENDING,
            S.ORDER_STATUS_OPEN,
            S.ORDER_STATUS_EXPIRED,
        ]
        assert await a.balances() == {"USDT": (99_961_308_600, 0), "BTC": (60_000, 0)}

        # --- post-only reject: B offers 2 lots at 6,550,000; A's post-only bid would cross --
        offer_2 = await b.place("offer-2", SELL, price_ticks=6_550_000, quantity_lots=2)
        acknowledged.append(offer_2.order_id)
        await b.until(offer_2.order_id, S.ORDER_STATUS_OPEN)
        assert (await b.balances())["BTC"] == (940_000, 20_000)
        maker_only = await a.place(
            "post-only",
            BUY,
            price_ticks=6_550_000,
            quantity_lots=2,
            time_in_force=S.TIME_IN_FORCE_POST_ONLY,
        )
        acknowledged.append(maker_only.order_id)
        rejected = await a.until(maker_only.order_id, S.ORDER_STATUS_REJECTED)
        assert rejected.matcher_reason == matcher_pb2.MATCHER_REJECT_REASON_POST_ONLY_WOULD_CROSS
        assert (rejected.filled_lots, rejected.remaining_lots) == (0, 2)
        # the 13,126,200 reserved at admission (13,100,000 + 26,200) is back; nothing traded
        assert await a.balances() == {"USDT": (99_961_308_600, 0), "BTC": (60_000, 0)}
        assert await a.position() == (6, 39_000_000, 308_600)
        assert (await b.client.cancel(order_id=offer_2.order_id)).accepted
        await b.until(offer_2.order_id, S.ORDER_STATUS_CANCELLED)
        assert await b.balances() == {"USDT": (100_038_417_200, 0), "BTC": (940_000, 0)}
        assert await b.position() == (-6, -39_000_000, -582_800)

        # Finished orders are read back from PostgreSQL once they leave the shard's index.
        view = await eventually(
            lambda: a.client.get_order(order_id=bid.order_id),
            lambda v: v.status == S.ORDER_STATUS_FILLED,
        )
        assert (view.filled_lots, view.remaining_lots) == (10, 0)
        assert await a.client.open_orders() == []
    await check_full_mesh(e2e_mesh, acknowledged)
