"""`oms client place|cancel|orders|order|history|fills|balances|positions`: the public API;
`oms client keys ...`, a user's API keys through the admin API (`gateway/key_command.py`);
`oms client admin ...`, an operator's controls of one user (`gateway/admin_command.py`);
`oms client instruments|book|trades|ticker|candles`, market data from the market-data
service (`--market-data` or OMS_MARKETDATA_ADDRESS, else the local mesh's; a key only
where market data is not public: `gateway/market_data_command.py`).

The key signs every call: `--api-key/--api-secret/--user-id` or OMS_API_KEY,
OMS_API_SECRET, OMS_USER_ID; the gateway is `--gateway` or OMS_GATEWAY_ADDRESS.
Its certificate is checked by OMS_CLIENT_TLS_CA (`oms up` prints the line to export)
or the system's roots, and the host name dialled; OMS_TLS=off for a plaintext one.
With neither, a local mesh's state folder (`--state-dir`, OMS_STATE_DIR, `state/`)
gives the gateway, its authority and, for `admin` and `keys`, the admin key
(`gateway/local_mesh_client.py`).
Amounts are shown as the integers the system keeps (prices in ticks, quantities
in lots, balances in the asset's minor units). A call the mesh cannot answer now
(UNAVAILABLE, TIMEOUT: a shard's election) is sent again, the same request, for at
most 20 s, with one line on stderr saying it waits (`gateway/client_waits.py`); a
gateway that never answers is named, with what to run (no mesh in the state folder:
`make run`, or `--gateway`).
Exit status: 0 done, 1 refused (by the gateway, or an order/cancel the shard did not
accept) or no answer, 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from gateway.admin_command import register_admin
from gateway.client import GatewayCallError, OmsClient
from gateway.client_waits import refusal, through_elections
from gateway.key_command import read_private_key, register_keys
from gateway.local_mesh_client import adopt_local_mesh, gateway_named
from gateway.market_data_command import ADDRESS_ENV, register_market_data
from gateway.market_data_display import format_table
from gateway.settings import ClientSettings
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from services.manual.settings_help import TRANSPORT, list_settings
from services.settings import SettingsError, load_settings

SIDES = {"buy": common_pb2.SIDE_BUY, "sell": common_pb2.SIDE_SELL}
ORDER_TYPES = {"limit": common_pb2.ORDER_TYPE_LIMIT, "market": common_pb2.ORDER_TYPE_MARKET}
STATUSES = {
    _status.removeprefix("ORDER_STATUS_").lower(): _number
    for _status, _number in common_pb2.OrderStatus.items()
    if _number
}
TIME_IN_FORCE = {
    "gtc": common_pb2.TIME_IN_FORCE_GTC,
    "ioc": common_pb2.TIME_IN_FORCE_IOC,
    "fok": common_pb2.TIME_IN_FORCE_FOK,
    "post_only": common_pb2.TIME_IN_FORCE_POST_ONLY,
    "gtd": common_pb2.TIME_IN_FORCE_GTD,
}


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "client", help="place, cancel and list orders through the gateway"
    )
    parser.add_argument(
        "--gateway",
        default=None,
        help="host:port (env OMS_GATEWAY_ADDRESS; else the local mesh's, from --state-dir)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="a local mesh's folder (default: OMS_STATE_DIR, else state/)",
    )
    parser.add_argument("--user-id", type=int, default=None, dest="user_id", help="env OMS_USER_ID")
    parser.add_argument("--api-key", default=None, dest="api_key", help="env OMS_API_KEY")
    parser.add_argument("--api-secret", default=None, dest="api_secret", help="env OMS_API_SECRET")
    parser.add_argument(
        "--private-key-file",
        type=Path,
        default=None,
        dest="private_key_file",
        help="an Ed25519 key's private key (PEM), instead of --api-secret",
    )
    parser.add_argument(
        "--market-data",
        default=None,
        dest="market_data",
        help=f"host:port of the market-data service (env {ADDRESS_ENV}; else the local"
        " mesh's, from --state-dir)",
    )
    list_settings(parser, ClientSettings, shared=(TRANSPORT,))
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    register_keys(actions)
    register_admin(actions)
    register_market_data(actions)

    place = actions.add_parser("place", help="place one order")
    place.add_argument("symbol", help="e.g. BTC-USDT")
    place.add_argument("side", choices=sorted(SIDES))
    place.add_argument(
        "quantity_lots", type=int, nargs="?", default=0, help="lots (not for market buys)"
    )
    place.add_argument(
        "--price", type=int, default=0, dest="price_ticks", help="limit price in ticks"
    )
    place.add_argument("--type", choices=sorted(ORDER_TYPES), default="limit", dest="order_type")
    place.add_argument("--tif", choices=sorted(TIME_IN_FORCE), default=None, dest="time_in_force")
    place.add_argument(
        "--quote-amount", type=int, default=0, dest="quote_amount", help="market buy spend"
    )
    place.add_argument(
        "--expire-at-ms", type=int, default=0, dest="expire_at_ms", help="for --tif gtd"
    )
    place.add_argument("--client-order-id", default=None, dest="client_order_id")
    place.set_defaults(handler=run_place)

    cancel = actions.add_parser("cancel", help="cancel one order")
    which = cancel.add_mutually_exclusive_group(required=True)
    which.add_argument("--order-id", default="", dest="order_id")
    which.add_argument("--client-order-id", default="", dest="client_order_id")
    cancel.set_defaults(handler=run_cancel)

    cancel_all = actions.add_parser(
        "cancel-all", help="cancel every open order, or one symbol's, in one request"
    )
    cancel_all.add_argument("--symbol", default="", help="only this symbol's orders")
    cancel_all.set_defaults(handler=run_cancel_all)

    switch = actions.add_parser(
        "cancel-all-after",
        help="arm a dead man's switch: every open order cancelled after TIMEOUT_MS unless"
        " called again; 0 disarms",
    )
    switch.add_argument("timeout_ms", type=int, help="0, or 1000 to 86400000")
    switch.set_defaults(handler=run_cancel_all_after)

    orders = actions.add_parser("orders", help="list open orders")
    orders.add_argument("--symbol", default="")
    orders.set_defaults(handler=run_orders)

    order = actions.add_parser("order", help="one order, open or finished")
    which = order.add_mutually_exclusive_group(required=True)
    which.add_argument("--order-id", default="", dest="order_id")
    which.add_argument("--client-order-id", default="", dest="client_order_id")
    order.set_defaults(handler=run_order)

    history = actions.add_parser("history", help="order history, oldest first, one page")
    _history_arguments(history)
    history.add_argument(
        "--status",
        action="append",
        default=[],
        choices=sorted(STATUSES),
        dest="statuses",
        help="repeatable; default: every status",
    )
    history.set_defaults(handler=run_history)

    fills = actions.add_parser("fills", help="fill history, oldest first, one page")
    _history_arguments(fills)
    fills.set_defaults(handler=run_fills)

    actions.add_parser("balances", help="list balances").set_defaults(handler=run_balances)
    actions.add_parser("positions", help="list positions").set_defaults(handler=run_positions)


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--symbol", default="")
    parser.add_argument("--from-ms", type=int, default=0, dest="from_ms", help="at or after")
    parser.add_argument("--to-ms", type=int, default=0, dest="to_ms", help="before")
    parser.add_argument("--limit", type=int, default=0, help="1..1000 (default 100)")
    parser.add_argument("--cursor", default="", help="the next_cursor a previous page printed")


def _client(arguments: argparse.Namespace) -> OmsClient:
    local = adopt_local_mesh(arguments)  # no gateway named: the local mesh's, if there is one
    settings = load_settings(
        ClientSettings,
        overrides={
            "gateway_address": arguments.gateway,
            "user_id": arguments.user_id,
            "api_key": arguments.api_key,
            "api_secret": arguments.api_secret,
        },
    )
    private_key = (
        read_private_key(arguments.private_key_file) if arguments.private_key_file else None
    )
    if not (settings.user_id and settings.api_key and (settings.api_secret or private_key)):
        made_by = (
            f"; on the local mesh under {local.state_dir}, `oms client --user-id N keys create`"
            " makes a user's key (with the folder's admin key)"
            if local is not None
            else ""
        )
        raise SettingsError(
            "a user id, API key and secret are needed: --user-id/--api-key/--api-secret "
            "or OMS_USER_ID/OMS_API_KEY/OMS_API_SECRET (an Ed25519 key: --private-key-file)"
            + made_by
        )
    return OmsClient(
        settings.gateway_address,
        user_id=settings.user_id,
        api_key=settings.api_key,
        api_secret="" if private_key is not None else settings.api_secret,
        private_key=private_key,
    )


def _run(arguments: argparse.Namespace, action: Any) -> int:
    async def call() -> int:
        async with _client(arguments) as client:
            result: int = await through_elections(lambda: action(client), "oms client")
            return result

    try:
        return asyncio.run(call())
    except SettingsError as error:
        print(f"oms client: {error}", file=sys.stderr)
        return 2
    except GatewayCallError as error:
        print(refusal(error, "oms client", *gateway_named(arguments)), file=sys.stderr)
        return 1


def _name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def describe_ack(ack: gateway_pb2.OrderAck) -> str:
    status = _name(common_pb2.OrderStatus, ack.status, "ORDER_STATUS_")
    again = " (the original answer to an earlier request)" if ack.duplicate else ""
    if ack.accepted:
        return (
            f"accepted {ack.order_id} (client id {ack.client_order_id}) {status}"
            f" at log position {ack.stamp.position}{again}"
        )
    reason = _name(shard_pb2.ShardRejectReason, ack.reject_reason, "SHARD_REJECT_REASON_")
    retry = "; retry later with the same client order id" if ack.retryable else ""
    return f"rejected {ack.client_order_id}: {reason}{retry}{again}"


def run_place(arguments: argparse.Namespace) -> int:
    order_type = ORDER_TYPES[arguments.order_type]
    if arguments.time_in_force is not None:
        time_in_force = TIME_IN_FORCE[arguments.time_in_force]
    elif order_type == common_pb2.ORDER_TYPE_MARKET:
        time_in_force = common_pb2.TIME_IN_FORCE_IOC
    else:
        time_in_force = common_pb2.TIME_IN_FORCE_GTC
    client_order_id = arguments.client_order_id or (
        f"cli-{time.time_ns() // 1_000_000}-{secrets.token_hex(3)}"
    )

    async def action(client: OmsClient) -> int:
        ack = await client.place(
            client_order_id,
            arguments.symbol,
            SIDES[arguments.side],
            order_type=order_type,
            time_in_force=time_in_force,
            price_ticks=arguments.price_ticks,
            quantity_lots=arguments.quantity_lots,
            quote_amount=arguments.quote_amount,
            expire_at_ms=arguments.expire_at_ms,
        )
        print(describe_ack(ack))
        return 0 if ack.accepted else 1

    return _run(arguments, action)


def run_cancel(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        ack = await client.cancel(
            order_id=arguments.order_id, client_order_id=arguments.client_order_id
        )
        if ack.accepted:
            print(f"cancel of {ack.order_id} is on its way to the matcher")
            return 0
        reason = _name(shard_pb2.ShardRejectReason, ack.reject_reason, "SHARD_REJECT_REASON_")
        print(f"cancel refused: {reason}")
        return 1

    return _run(arguments, action)


def run_cancel_all(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        ack = await client.cancel_all(symbol=arguments.symbol)
        if not ack.accepted:
            reason = _name(shard_pb2.ShardRejectReason, ack.reject_reason, "SHARD_REJECT_REASON_")
            print(f"cancel-all refused: {reason}")
            return 1
        for order_id in ack.cancelled_order_ids:
            print(f"cancel of {order_id} is on its way to the matcher")
        print(
            f"{len(ack.cancelled_order_ids)} cancels sent,"
            f" {ack.already_cancelling} already on their way"
        )
        return 0

    return _run(arguments, action)


def run_cancel_all_after(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        ack = await client.cancel_all_after(arguments.timeout_ms)
        if not ack.accepted:
            reason = _name(shard_pb2.ShardRejectReason, ack.reject_reason, "SHARD_REJECT_REASON_")
            print(f"cancel-all-after refused: {reason}")
            return 1
        if ack.cancel_all_at_ms:
            print(
                f"armed: every open order is cancelled at {ack.cancel_all_at_ms} ms"
                " (the shard's consensus time) unless armed again before"
            )
        else:
            print("disarmed")
        return 0

    return _run(arguments, action)


ORDER_HEADER = (
    "order",
    "client id",
    "symbol",
    "side",
    "type",
    "price",
    "qty",
    "filled",
    "left",
    "status",
)
# Orders read from PostgreSQL (one order, the history) also say when they were accepted.
TIMED_ORDER_HEADER = (*ORDER_HEADER, "accepted ms", "updated ms")


def _timed_order_row(order: gateway_pb2.OrderView) -> tuple[object, ...]:
    return (*_order_row(order), order.accepted_at_ms or "-", order.updated_at_ms or "-")


def _order_row(order: gateway_pb2.OrderView) -> tuple[object, ...]:
    return (
        order.order_id,
        order.client_order_id,
        order.symbol,
        _name(common_pb2.Side, order.side, "SIDE_"),
        _name(common_pb2.OrderType, order.order_type, "ORDER_TYPE_"),
        order.price_ticks,
        order.quantity_lots,
        order.filled_lots,
        order.remaining_lots,
        _name(common_pb2.OrderStatus, order.status, "ORDER_STATUS_"),
    )


def run_orders(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        orders = await client.open_orders(arguments.symbol)
        if not orders:
            print("no open orders")
            return 0
        print(format_table(ORDER_HEADER, [_order_row(order) for order in orders]))
        return 0

    return _run(arguments, action)


def run_order(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        order = await client.get_order(
            order_id=arguments.order_id, client_order_id=arguments.client_order_id
        )
        print(format_table(TIMED_ORDER_HEADER, [_timed_order_row(order)]))
        return 0

    return _run(arguments, action)


def _print_next(cursor: str) -> None:
    if cursor:
        print(f"more: --cursor {cursor}")


def run_history(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        page = await client.list_orders(
            symbol=arguments.symbol,
            statuses=[STATUSES[name] for name in arguments.statuses],
            from_ms=arguments.from_ms,
            to_ms=arguments.to_ms,
            limit=arguments.limit,
            cursor=arguments.cursor,
        )
        if not page.orders:
            print("no orders")
        else:
            rows = [_timed_order_row(order) for order in page.orders]
            print(format_table(TIMED_ORDER_HEADER, rows))
        _print_next(page.next_cursor)
        return 0

    return _run(arguments, action)


def run_fills(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        page = await client.list_fills(
            symbol=arguments.symbol,
            from_ms=arguments.from_ms,
            to_ms=arguments.to_ms,
            limit=arguments.limit,
            cursor=arguments.cursor,
        )
        if not page.fills:
            print("no fills")
        else:
            rows = [
                (
                    fill.time_ms,
                    fill.order_id,
                    fill.client_order_id,
                    fill.trade_id,
                    fill.symbol,
                    _name(common_pb2.Side, fill.side, "SIDE_"),
                    fill.price_ticks,
                    fill.quantity_lots,
                    f"{fill.base_amount} {fill.base_asset}",
                    f"{fill.quote_amount} {fill.quote_asset}",
                    f"{fill.fee} {fill.quote_asset}",
                    "maker" if fill.maker else "taker",
                )
                for fill in page.fills
            ]
            header = (
                "time ms",
                "order",
                "client id",
                "trade",
                "symbol",
                "side",
                "price",
                "qty",
                "base",
                "quote",
                "fee",
                "role",
            )
            print(format_table(header, rows))
        _print_next(page.next_cursor)
        return 0

    return _run(arguments, action)


def run_balances(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        balances = await client.balances()
        if not balances:
            print("no balances")
            return 0
        rows = [
            (asset, balance.total, balance.reserved, balance.total - balance.reserved)
            for asset, balance in sorted(balances.items())
        ]
        print(format_table(("asset", "total", "reserved", "available"), rows))
        print("(amounts in each asset's minor units)")
        return 0

    return _run(arguments, action)


def run_positions(arguments: argparse.Namespace) -> int:
    async def action(client: OmsClient) -> int:
        answer = await client.positions()
        if not answer.positions:
            print("no positions")
        else:
            rows = [
                (
                    position.symbol,
                    position.quantity_lots,
                    position.cost_basis,
                    position.realized_pnl,
                    position.mark_price_ticks or "-",
                    position.unrealized_pnl,
                )
                for position in answer.positions
            ]
            header = ("symbol", "lots", "cost", "realized", "mark", "unrealized")
            print(format_table(header, rows))
        if answer.reduce_only:
            print("account is reduce-only")
        return 0

    return _run(arguments, action)
