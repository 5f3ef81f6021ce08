"""`oms demo`: the mesh at work in one minute, through the public and admin APIs.

Two users are created and funded; Bob offers 0.5 BTC at 65,000 USDT, Alice buys
0.3 BTC at that price (a partial fill of Bob's order: Alice is the taker, Bob the
maker), then Bob cancels the rest. Every acknowledgement, order update, balance
and position is printed as the mesh reports it, with the human value next to the
integer the system keeps. Finds the gateway and the admin key in the state
folder `oms up` wrote (or `--gateway` and OMS_ADMIN_API_KEY/OMS_ADMIN_API_SECRET).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from gateway.client import AdminClient, GatewayCallError, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from services.infra.settings import DEFAULT_STATE_DIR
from services.markets.asset_decimals import ASSET_DECIMALS
from services.mesh.mesh_record import MeshRecord, read_mesh_record
from services.mesh.readiness import NotServingError, wait_until_serving
from services.mesh.status_targets import targets_of_record
from services.transport.development import adopt_mesh_transports

SYMBOL = "BTC-USDT"
PRICE_TICKS = 6_500_000  # 65,000.00 USDT per BTC (a tick is 0.01 USDT per BTC)
LOT_BTC = "0.0001"
UPDATE_TIMEOUT_S = 15.0
# A mesh `oms up` has just started may take this long to serve (a shard replaying its
# log, followers catching up on a loaded machine): the demo waits rather than fail.
SERVING_WAIT_S = 60.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="create two users, trade between them, show fills, balances, positions"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="where `oms up` runs")
    parser.add_argument("--gateway", default=None, help="host:port (default: from the state)")
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    state_dir = arguments.state_dir or Path(os.environ.get("OMS_STATE_DIR", DEFAULT_STATE_DIR))
    record = read_mesh_record(state_dir)
    gateway = arguments.gateway or (record.gateway if record else "")
    admin_key = os.environ.get("OMS_ADMIN_API_KEY") or (record.admin_api_key if record else "")
    admin_secret = os.environ.get("OMS_ADMIN_API_SECRET") or (
        record.admin_api_secret if record else ""
    )
    if not gateway or not admin_key:
        print(
            f"oms demo: no mesh found under {state_dir}; start one with `make run`", file=sys.stderr
        )
        return 2
    if record is not None:
        adopt_mesh_transports(state_dir, tls=record.tls)
    try:
        asyncio.run(_serving_then_demo(record, gateway, admin_key, admin_secret))
    except NotServingError as error:
        print(
            f"oms demo: the mesh under {state_dir} is {error}; "
            f"`oms status --state-dir {state_dir}` shows each process",
            file=sys.stderr,
        )
        return 1
    except GatewayCallError as error:
        print(f"oms demo: the gateway refused: {error}", file=sys.stderr)
        return 1
    return 0


async def _serving_then_demo(
    record: MeshRecord | None, gateway: str, admin_key: str, admin_secret: str
) -> None:
    """With the local mesh's record: first wait until each of its services serves (the
    gateway, and in every shard cluster and matcher group a shard, matcher, persister,
    bridge and reconciler: a shard still replaying its log refuses orders)."""
    if record is not None:
        groups: dict[str, list[str]] = {}
        for target in targets_of_record(record):
            name = f"{target.service} {target.group}".strip()
            groups.setdefault(name, []).append(target.address)
        await wait_until_serving(groups, SERVING_WAIT_S)
    await _demo(gateway, admin_key, admin_secret)


def amount(asset: str, minor_units: int) -> str:
    decimals = ASSET_DECIMALS.get(asset, 0)
    sign = "-" if minor_units < 0 else ""
    whole, fraction = divmod(abs(minor_units), 10**decimals)
    text = f"{sign}{whole:,}"
    if decimals:
        text += "." + f"{fraction:0{decimals}d}".rstrip("0").ljust(2, "0")
    return f"{text} {asset}"


async def _demo(gateway: str, admin_key: str, admin_secret: str) -> None:
    run_id = secrets.token_hex(3)
    async with AdminClient(gateway, api_key=admin_key, api_secret=admin_secret) as admin:
        alice_key = await admin.create_user()
        bob_key = await admin.create_user()
        print(f"created alice (user {alice_key.user_id}) and bob (user {bob_key.user_id})")
        await _deposit(admin, alice_key.user_id, "USDT", 100_000 * 10**6, f"demo-{run_id}-a")
        await _deposit(admin, bob_key.user_id, "BTC", 1 * 10**8, f"demo-{run_id}-b")
    alice = OmsClient(
        gateway,
        user_id=alice_key.user_id,
        api_key=alice_key.api_key,
        api_secret=alice_key.api_secret,
    )
    bob = OmsClient(
        gateway, user_id=bob_key.user_id, api_key=bob_key.api_key, api_secret=bob_key.api_secret
    )
    async with (
        alice,
        bob,
        alice.order_updates() as alice_updates,
        bob.order_updates() as bob_updates,
    ):
        print(f"\nbob offers 0.5 BTC ({5_000} lots of {LOT_BTC} BTC) at 65,000 USDT")
        offer = await bob.place(
            f"offer-{run_id}",
            SYMBOL,
            common_pb2.SIDE_SELL,
            price_ticks=PRICE_TICKS,
            quantity_lots=5_000,
        )
        _show_ack("bob", offer)
        await _wait_status(bob_updates, "bob", offer.order_id, common_pb2.ORDER_STATUS_OPEN)

        print("\nalice buys 0.3 BTC (3,000 lots) at 65,000 USDT: crosses bob's offer")
        bid = await alice.place(
            f"bid-{run_id}",
            SYMBOL,
            common_pb2.SIDE_BUY,
            price_ticks=PRICE_TICKS,
            quantity_lots=3_000,
        )
        _show_ack("alice", bid)
        await _wait_status(alice_updates, "alice", bid.order_id, common_pb2.ORDER_STATUS_FILLED)
        await _wait_status(
            bob_updates, "bob", offer.order_id, common_pb2.ORDER_STATUS_PARTIALLY_FILLED
        )
        await _show_accounts("alice", alice)
        await _show_accounts("bob", bob)

        print("\nbob cancels the rest of his offer")
        cancelled = await bob.cancel(order_id=offer.order_id)
        print(f"  bob     cancel accepted={cancelled.accepted} order {cancelled.order_id}")
        await _wait_status(bob_updates, "bob", offer.order_id, common_pb2.ORDER_STATUS_CANCELLED)
        await _show_accounts("bob", bob)
    print(
        "\nexpected: alice paid 19,500 USDT + 39 USDT taker fee (0.2%) for 0.3 BTC;"
        " bob received 19,500 USDT - 19.5 USDT maker fee (0.1%); nothing stays reserved."
    )


async def _deposit(admin: AdminClient, user_id: int, asset: str, minor: int, transfer: str) -> None:
    ack = await admin.deposit(user_id, asset, minor, transfer)
    print(f"  deposit {amount(asset, minor):>22} to user {user_id}: accepted={ack.accepted}")


def _show_ack(who: str, ack: gateway_pb2.OrderAck) -> None:
    status = common_pb2.OrderStatus.Name(ack.status)
    if ack.accepted:
        print(f"  {who:<7} ack {status} order {ack.order_id} (log position {ack.stamp.position})")
    else:
        reason = shard_pb2.ShardRejectReason.Name(ack.reject_reason)
        print(f"  {who:<7} REJECTED {reason}")


async def _wait_status(updates: Any, who: str, order_id: str, wanted: int) -> None:
    while True:
        update: shard_pb2.OrderUpdate = await updates.next(UPDATE_TIMEOUT_S)
        if update.order_id != order_id:
            continue
        status = common_pb2.OrderStatus.Name(update.status)
        fill = ""
        if update.last_fill_lots:
            fill = f" fill {update.last_fill_lots:,} lots at {update.last_fill_price_ticks:,} ticks"
        print(
            f"  {who:<7} update {status}{fill}; filled {update.filled_lots:,},"
            f" remaining {update.remaining_lots:,} lots"
        )
        if update.status == wanted:
            return


async def _show_accounts(who: str, client: OmsClient) -> None:
    balances = await client.balances()
    positions = await client.positions()
    print(f"  {who} balances:")
    for asset, balance in sorted(balances.items()):
        print(
            f"    {asset:<5} total {amount(asset, balance.total):>24}"
            f"   reserved {amount(asset, balance.reserved):>20}"
        )
    for position in positions.positions:
        print(
            f"  {who} position {position.symbol}: {position.quantity_lots:,} lots,"
            f" cost {amount('USDT', position.cost_basis)}, realized"
            f" {amount('USDT', position.realized_pnl)}, unrealized"
            f" {amount('USDT', position.unrealized_pnl)}"
        )
