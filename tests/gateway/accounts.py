"""Accounts for gateway tests: created and funded through the admin API, as operators do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from gateway.client import AdminClient, GatewayCallError, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2

T = TypeVar("T")
WAIT_S = 15.0
POLL_S = 0.02
BTC = "BTC-USDT"
SOL = "SOL-USDT"
# BTC-USDT: tick 1 quote minor unit per lot per tick; highest fee 2_000 ppm (reserved on buys).
PRICE = 6_500_000
MAX_FEE_PPM = 2_000


def limit_buy_reservation(price_ticks: int, quantity_lots: int) -> int:
    notional = price_ticks * quantity_lots
    return notional + notional * MAX_FEE_PPM // 1_000_000


@dataclass(frozen=True)
class Account:
    user_id: int
    api_key: str
    api_secret: str

    def client(self, address: str, **options: Any) -> OmsClient:
        return OmsClient(
            address,
            user_id=self.user_id,
            api_key=self.api_key,
            api_secret=self.api_secret,
            **options,
        )


async def open_account(
    admin: AdminClient, deposits: Mapping[str, int], *, tier: int = 0
) -> Account:
    created = await admin.create_user(tier=tier)
    for asset, amount in deposits.items():
        ack = await admin.deposit(created.user_id, asset, amount, f"fund-{created.user_id}-{asset}")
        assert ack.accepted, ack
    return Account(created.user_id, created.api_key, created.api_secret)


def buy(client: OmsClient, client_order_id: str, quantity_lots: int = 3, **fields: Any) -> Any:
    return client.place_request(
        client_order_id,
        BTC,
        common_pb2.SIDE_BUY,
        price_ticks=fields.pop("price_ticks", PRICE),
        quantity_lots=quantity_lots,
        **fields,
    )


async def refusal(call: Awaitable[Any]) -> GatewayCallError:
    """The GatewayCallError `call` raises (fails if it succeeds)."""
    try:
        answer = await call
    except GatewayCallError as error:
        return error
    raise AssertionError(f"expected a refusal, got {answer!r}")


def assert_refused(error: GatewayCallError, code: grpc.StatusCode, reason: str) -> None:
    assert (error.code, error.reason) == (code, f"GATEWAY_ERROR_REASON_{reason}"), error


@dataclass(frozen=True)
class AccountState:
    balances: dict[str, tuple[int, int]]
    open_orders: list[tuple[str, str, int]]


async def account_state(client: OmsClient) -> AccountState:
    balances = await client.balances()
    orders = await client.open_orders()
    return AccountState(
        {asset: (b.total, b.reserved) for asset, b in balances.items()},
        sorted((o.order_id, o.client_order_id, o.remaining_lots) for o in orders),
    )


async def eventually(
    probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], *, timeout_s: float = WAIT_S
) -> T:
    """Await `probe()` until `check` holds of its value; fail with the last value seen.
    A probe answered UNAVAILABLE is asked again, as the client contract says a client
    does (a read that waits for a persister behind a busy machine's load, say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = await probe()
        except GatewayCallError as error:
            if error.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                raise
            await asyncio.sleep(POLL_S)
            continue
        if check(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s:g} s; last: {value!r}")
        await asyncio.sleep(POLL_S)


def order_ack_summary(ack: gateway_pb2.OrderAck) -> tuple[bool, str, int, bool]:
    return (ack.accepted, ack.order_id, ack.status, ack.duplicate)
