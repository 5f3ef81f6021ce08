"""A small asyncio client of the gateway: signs every call, speaks both APIs.

    async with OmsClient(address, user_id=7, api_key=key, api_secret=secret) as oms:
    # an Ed25519 key: OmsClient(address, user_id=7, api_key=key, private_key=private_key)
        ack = await oms.place("c-1", "BTC-USDT", SIDE_BUY, price_ticks=6_500_000, quantity_lots=3)
        async with oms.order_updates() as updates:     # live once entered
            update = await updates.next()
        async with oms.trade() as stream:              # the batched Trade stream
            answers = await stream.submit([place_request, cancel_request, ...])

A refusal by the gateway raises `GatewayCallError` carrying the status code and
the contract's reason name (`x-oms-reason`); a refusal by the shard is an ack
with `accepted = false`, as the contract says. `AdminClient` does the same for
the admin API with the admin key, and `MarketDataClient` (`market_data_client.py`)
for the market-data service: instruments, books (`follow_book` keeps a `LocalBook`
from the stream), trades, tickers and candles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.client_streams import OrderUpdateStream, TradeStream
from gateway.market_data_client import BookOutOfSyncError, LocalBook, MarketDataClient
from gateway.signed_channel import (
    DEFAULT_TIMEOUT_S,
    GatewayCallError,
    SignedChannel,
    wall_clock_ms,
)
from gateway.signing import Ed25519Signer
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2

__all__ = [
    "AdminClient",
    "BookOutOfSyncError",
    "GatewayCallError",
    "LocalBook",
    "MarketDataClient",
    "OmsClient",
    "OrderUpdateStream",
    "TradeStream",
]

ORDER_SERVICE = "/oms.v1.OrderGateway/"
ADMIN_SERVICE = "/oms.v1.AdminGateway/"


class _SignedClient:
    """One signed channel, closed when the client is."""

    _signed: SignedChannel

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._signed.close()


class OmsClient(_SignedClient):
    """The public API, for one user's key."""

    def __init__(
        self,
        address: str,
        *,
        user_id: int,
        api_key: str,
        api_secret: str = "",
        private_key: Ed25519PrivateKey | None = None,
        channel: grpc.aio.Channel | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """`api_secret` for an HMAC key, `private_key` for an Ed25519 one."""
        if (private_key is None) == (not api_secret):
            raise ValueError("give an HMAC key's api_secret or an Ed25519 key's private_key")
        self.user_id = user_id
        signer = Ed25519Signer(private_key) if private_key is not None else api_secret
        self._signed = SignedChannel(
            address, api_key, signer, channel=channel, clock_ms=clock_ms, timeout_s=timeout_s
        )

    # --- orders ---------------------------------------------------------------------------

    def place_request(
        self,
        client_order_id: str,
        symbol: str,
        side: int,
        *,
        order_type: int = common_pb2.ORDER_TYPE_LIMIT,
        time_in_force: int = common_pb2.TIME_IN_FORCE_GTC,
        price_ticks: int = 0,
        quantity_lots: int = 0,
        quote_amount: int = 0,
        expire_at_ms: int = 0,
        self_trade_prevention: int = 0,
    ) -> gateway_pb2.PlaceOrderRequest:
        return gateway_pb2.PlaceOrderRequest(
            user_id=self.user_id,
            client_order_id=client_order_id,
            symbol=symbol,
            side=side,  # type: ignore[arg-type]
            order_type=order_type,  # type: ignore[arg-type]
            time_in_force=time_in_force,  # type: ignore[arg-type]
            price_ticks=price_ticks,
            quantity_lots=quantity_lots,
            quote_amount=quote_amount,
            expire_at_ms=expire_at_ms,
            self_trade_prevention=self_trade_prevention,  # type: ignore[arg-type]
        )

    async def place(
        self, client_order_id: str, symbol: str, side: int, **fields: Any
    ) -> gateway_pb2.OrderAck:
        return await self.place_order(self.place_request(client_order_id, symbol, side, **fields))

    async def place_order(self, request: gateway_pb2.PlaceOrderRequest) -> gateway_pb2.OrderAck:
        ack: gateway_pb2.OrderAck = await self._signed.unary(
            ORDER_SERVICE + "PlaceOrder", request, gateway_pb2.OrderAck
        )
        return ack

    async def cancel(
        self, *, order_id: str = "", client_order_id: str = ""
    ) -> gateway_pb2.CancelAck:
        request = gateway_pb2.CancelOrderRequest(
            user_id=self.user_id, order_id=order_id, client_order_id=client_order_id
        )
        ack: gateway_pb2.CancelAck = await self._signed.unary(
            ORDER_SERVICE + "CancelOrder", request, gateway_pb2.CancelAck
        )
        return ack

    async def cancel_all(self, *, symbol: str = "") -> gateway_pb2.CancelAllAck:
        """Cancel every live order of this user, or of `symbol`: the ack lists the orders
        whose cancels were sent; each one's end comes as an order update."""
        request = gateway_pb2.CancelAllOrdersRequest(user_id=self.user_id, symbol=symbol)
        ack: gateway_pb2.CancelAllAck = await self._signed.unary(
            ORDER_SERVICE + "CancelAllOrders", request, gateway_pb2.CancelAllAck
        )
        return ack

    async def cancel_all_after(self, timeout_ms: int) -> gateway_pb2.CancelAllAfterAck:
        """Arm (or re-arm) this user's dead man's switch: every live order is cancelled
        `timeout_ms` after the shard logs this, unless called again first; 0 disarms."""
        request = gateway_pb2.CancelAllAfterRequest(user_id=self.user_id, timeout_ms=timeout_ms)
        ack: gateway_pb2.CancelAllAfterAck = await self._signed.unary(
            ORDER_SERVICE + "CancelAllAfter", request, gateway_pb2.CancelAllAfterAck
        )
        return ack

    # --- queries --------------------------------------------------------------------------

    async def get_order(
        self, *, order_id: str = "", client_order_id: str = ""
    ) -> gateway_pb2.OrderView:
        request = gateway_pb2.GetOrderRequest(
            user_id=self.user_id, order_id=order_id, client_order_id=client_order_id
        )
        view: gateway_pb2.OrderView = await self._signed.unary(
            ORDER_SERVICE + "GetOrder", request, gateway_pb2.OrderView
        )
        return view

    async def list_orders(
        self,
        *,
        symbol: str = "",
        statuses: Sequence[int] = (),
        from_ms: int = 0,
        to_ms: int = 0,
        limit: int = 0,
        cursor: str = "",
    ) -> gateway_pb2.OrderHistory:
        """One page of the user's orders, oldest first (`next_cursor` "" on the last)."""
        request = gateway_pb2.ListOrdersRequest(
            user_id=self.user_id,
            symbol=symbol,
            statuses=statuses,  # type: ignore[arg-type]
            from_ms=from_ms,
            to_ms=to_ms,
            limit=limit,
            cursor=cursor,
        )
        page: gateway_pb2.OrderHistory = await self._signed.unary(
            ORDER_SERVICE + "ListOrders", request, gateway_pb2.OrderHistory
        )
        return page

    async def order_history(self, **filters: Any) -> list[gateway_pb2.OrderView]:
        """Every page of `list_orders` with these filters."""
        orders: list[gateway_pb2.OrderView] = []
        cursor = ""
        while True:
            page = await self.list_orders(cursor=cursor, **filters)
            orders.extend(page.orders)
            if not page.next_cursor:
                return orders
            cursor = page.next_cursor

    async def list_fills(
        self,
        *,
        symbol: str = "",
        from_ms: int = 0,
        to_ms: int = 0,
        limit: int = 0,
        cursor: str = "",
    ) -> gateway_pb2.FillHistory:
        """One page of the user's fills, oldest first (`next_cursor` "" on the last)."""
        request = gateway_pb2.ListFillsRequest(
            user_id=self.user_id,
            symbol=symbol,
            from_ms=from_ms,
            to_ms=to_ms,
            limit=limit,
            cursor=cursor,
        )
        page: gateway_pb2.FillHistory = await self._signed.unary(
            ORDER_SERVICE + "ListFills", request, gateway_pb2.FillHistory
        )
        return page

    async def fill_history(self, **filters: Any) -> list[gateway_pb2.FillView]:
        """Every page of `list_fills` with these filters."""
        fills: list[gateway_pb2.FillView] = []
        cursor = ""
        while True:
            page = await self.list_fills(cursor=cursor, **filters)
            fills.extend(page.fills)
            if not page.next_cursor:
                return fills
            cursor = page.next_cursor

    async def open_orders(self, symbol: str = "") -> list[gateway_pb2.OrderView]:
        request = gateway_pb2.GetOpenOrdersRequest(user_id=self.user_id, symbol=symbol)
        answer: gateway_pb2.OpenOrders = await self._signed.unary(
            ORDER_SERVICE + "GetOpenOrders", request, gateway_pb2.OpenOrders
        )
        return list(answer.orders)

    async def balances(self) -> dict[str, shard_pb2.AssetBalance]:
        request = gateway_pb2.GetBalancesRequest(user_id=self.user_id)
        answer: gateway_pb2.Balances = await self._signed.unary(
            ORDER_SERVICE + "GetBalances", request, gateway_pb2.Balances
        )
        return {balance.asset: balance for balance in answer.balances}

    async def positions(self) -> gateway_pb2.Positions:
        request = gateway_pb2.GetPositionsRequest(user_id=self.user_id)
        answer: gateway_pb2.Positions = await self._signed.unary(
            ORDER_SERVICE + "GetPositions", request, gateway_pb2.Positions
        )
        return answer

    # --- streams --------------------------------------------------------------------------

    def order_updates(self) -> OrderUpdateStream:
        return OrderUpdateStream(self._signed, self.user_id)

    def trade(self, *, cancel_on_disconnect_ms: int = 0) -> TradeStream:
        """A Trade stream; with `cancel_on_disconnect_ms`, the orders placed on it are
        cancelled by the user's shard if it ends without a clean close."""
        return TradeStream(self._signed, cancel_on_disconnect_ms)


class AdminClient(_SignedClient):
    """The admin API, with the admin key."""

    def __init__(
        self,
        address: str,
        *,
        api_key: str,
        api_secret: str,
        channel: grpc.aio.Channel | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._signed = SignedChannel(
            address, api_key, api_secret, channel=channel, clock_ms=clock_ms, timeout_s=timeout_s
        )

    async def create_user(
        self,
        user_id: int = 0,
        *,
        tier: int = shard_pb2.USER_TIER_NORMAL,
        risk_limits: shard_pb2.RiskLimits | None = None,
    ) -> gateway_pb2.CreateUserResponse:
        request = gateway_pb2.CreateUserRequest(user_id=user_id, tier=tier)  # type: ignore[arg-type]
        if risk_limits is not None:
            request.risk_limits.CopyFrom(risk_limits)
        created: gateway_pb2.CreateUserResponse = await self._signed.unary(
            ADMIN_SERVICE + "CreateUser", request, gateway_pb2.CreateUserResponse
        )
        return created

    async def deposit(
        self, user_id: int, asset: str, amount: int, transfer_id: str
    ) -> gateway_pb2.TransferAck:
        return await self._transfer("Deposit", user_id, asset, amount, transfer_id)

    async def withdraw(
        self, user_id: int, asset: str, amount: int, transfer_id: str
    ) -> gateway_pb2.TransferAck:
        return await self._transfer("Withdraw", user_id, asset, amount, transfer_id)

    async def halt_symbol(
        self, symbol: str, *, cancel_resting: bool = False
    ) -> gateway_pb2.AdminAck:
        request = gateway_pb2.HaltSymbolRequest(symbol=symbol, cancel_resting=cancel_resting)
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + "HaltSymbol", request, gateway_pb2.AdminAck
        )
        return ack

    async def resume_symbol(self, symbol: str) -> gateway_pb2.AdminAck:
        request = gateway_pb2.ResumeSymbolRequest(symbol=symbol)
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + "ResumeSymbol", request, gateway_pb2.AdminAck
        )
        return ack

    async def kill_switch(self, user_id: int, *, enable: bool) -> gateway_pb2.AdminAck:
        request = gateway_pb2.KillSwitchRequest(user_id=user_id, enable=enable)
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + "KillSwitch", request, gateway_pb2.AdminAck
        )
        return ack

    # --- one user's controls (logged and audited) -----------------------------------------

    async def set_risk_limits(
        self,
        user_id: int,
        limits: shard_pb2.RiskLimits,
        *,
        clear_reduce_only: bool = False,
        note: str = "",
        request_id: str = "",
        if_control_version: int | None = None,
    ) -> gateway_pb2.AdminAck:
        """`request_id`: the same on every retry of one request (empty: the gateway makes
        one per call); `if_control_version`: decide it only at that control version (None:
        at the one the gateway reads first). See UserControlRequest in gateway.proto."""
        request = gateway_pb2.SetRiskLimitsRequest(
            user_id=user_id,
            risk_limits=limits,
            clear_reduce_only=clear_reduce_only,
            note=note,
            request_id=request_id,
            if_control_version=if_control_version,
        )
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + "SetRiskLimits", request, gateway_pb2.AdminAck
        )
        return ack

    async def halt_user(
        self,
        user_id: int,
        *,
        note: str = "",
        request_id: str = "",
        if_control_version: int | None = None,
    ) -> gateway_pb2.AdminAck:
        return await self._user_control("HaltUser", user_id, note, request_id, if_control_version)

    async def resume_user(
        self,
        user_id: int,
        *,
        note: str = "",
        request_id: str = "",
        if_control_version: int | None = None,
    ) -> gateway_pb2.AdminAck:
        return await self._user_control("ResumeUser", user_id, note, request_id, if_control_version)

    async def restart_user(
        self,
        user_id: int,
        *,
        note: str = "",
        request_id: str = "",
        if_control_version: int | None = None,
    ) -> gateway_pb2.AdminAck:
        return await self._user_control(
            "RestartUser", user_id, note, request_id, if_control_version
        )

    async def _user_control(
        self, method: str, user_id: int, note: str, request_id: str, version: int | None
    ) -> gateway_pb2.AdminAck:
        request = gateway_pb2.UserControlRequest(
            user_id=user_id, note=note, request_id=request_id, if_control_version=version
        )
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + method, request, gateway_pb2.AdminAck
        )
        return ack

    async def list_users(
        self, *, after_user_id: int = 0, limit: int = 0
    ) -> gateway_pb2.UserSummaries:
        page: gateway_pb2.UserSummaries = await self._signed.unary(
            ADMIN_SERVICE + "ListUsers",
            gateway_pb2.ListUsersRequest(after_user_id=after_user_id, limit=limit),
            gateway_pb2.UserSummaries,
        )
        return page

    async def list_admin_audit(
        self, *, user_id: int = 0, before_audit_id: int = 0, limit: int = 0
    ) -> gateway_pb2.AdminAuditEntries:
        page: gateway_pb2.AdminAuditEntries = await self._signed.unary(
            ADMIN_SERVICE + "ListAdminAudit",
            gateway_pb2.ListAdminAuditRequest(
                user_id=user_id, before_audit_id=before_audit_id, limit=limit
            ),
            gateway_pb2.AdminAuditEntries,
        )
        return page

    # --- API keys -------------------------------------------------------------------------

    async def create_api_key(
        self,
        user_id: int,
        *,
        kind: int = common_pb2.API_KEY_KIND_HMAC,
        public_key: bytes = b"",
        scopes: Sequence[int] = (),
        expires_at_ms: int = 0,
        label: str = "",
    ) -> gateway_pb2.ApiKeyCreated:
        request = gateway_pb2.CreateApiKeyRequest(
            user_id=user_id,
            kind=kind,  # type: ignore[arg-type]
            public_key=public_key,
            scopes=scopes,  # type: ignore[arg-type]
            expires_at_ms=expires_at_ms,
            label=label,
        )
        created: gateway_pb2.ApiKeyCreated = await self._signed.unary(
            ADMIN_SERVICE + "CreateApiKey", request, gateway_pb2.ApiKeyCreated
        )
        return created

    async def list_api_keys(self, user_id: int) -> list[gateway_pb2.ApiKey]:
        listed: gateway_pb2.ApiKeys = await self._signed.unary(
            ADMIN_SERVICE + "ListApiKeys",
            gateway_pb2.ListApiKeysRequest(user_id=user_id),
            gateway_pb2.ApiKeys,
        )
        return list(listed.keys)

    async def revoke_api_key(self, api_key: str) -> gateway_pb2.ApiKey:
        revoked: gateway_pb2.ApiKey = await self._signed.unary(
            ADMIN_SERVICE + "RevokeApiKey",
            gateway_pb2.RevokeApiKeyRequest(api_key=api_key),
            gateway_pb2.ApiKey,
        )
        return revoked

    async def rotate_api_key(
        self, api_key: str, *, public_key: bytes = b""
    ) -> gateway_pb2.ApiKeyCreated:
        rotated: gateway_pb2.ApiKeyCreated = await self._signed.unary(
            ADMIN_SERVICE + "RotateApiKey",
            gateway_pb2.RotateApiKeyRequest(api_key=api_key, public_key=public_key),
            gateway_pb2.ApiKeyCreated,
        )
        return rotated

    async def _transfer(
        self, call: str, user_id: int, asset: str, amount: int, transfer_id: str
    ) -> gateway_pb2.TransferAck:
        request = gateway_pb2.TransferRequest(
            user_id=user_id, asset=asset, amount=amount, transfer_id=transfer_id
        )
        ack: gateway_pb2.TransferAck = await self._signed.unary(
            ADMIN_SERVICE + call, request, gateway_pb2.TransferAck
        )
        return ack
