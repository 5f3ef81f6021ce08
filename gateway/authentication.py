"""Authentication and authorization: who signed a call, and what that key may touch.

A call carries its key id, timestamp and signature in metadata (gateway.proto
header; the scheme itself is in `gateway.signing`, shared with the clients).
Order of checks: credentials present, timestamp inside the window (before any
lookup, so replayed junk costs no persister call), key known, signature valid
(HMAC compared in constant time, or Ed25519 verified against the user's public
key), key not expired (KEY_EXPIRED), key holding the method's scope (trading
methods need TRADE, the others READ: SCOPE_REQUIRED). Then the account: a user
key acts only on its own user id, and the admin key on no account at all.
`gateway.interceptor` applies all of it to every call; the Trade stream applies
`authorize_account` to each request.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from gateway.core.refusals import GatewayError
from gateway.credentials import READ, TRADE, CredentialDirectory, KeyHolder
from gateway.signing import (
    API_KEY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    ed25519_matches,
    signature,
    signature_matches,
    signed_body,
    signed_text,
)
from gateway.statistics import GatewayCounters
from protos.oms.v1 import common_pb2, gateway_pb2

ORDER_SERVICE_PREFIX = "/oms.v1.OrderGateway/"
ADMIN_SERVICE_PREFIX = "/oms.v1.AdminGateway/"
G = gateway_pb2
ED25519 = common_pb2.API_KEY_KIND_ED25519
# What a key needs the TRADE scope for; every other call of the order service, READ.
TRADING_METHODS = frozenset(
    {
        f"{ORDER_SERVICE_PREFIX}PlaceOrder",
        f"{ORDER_SERVICE_PREFIX}CancelOrder",
        f"{ORDER_SERVICE_PREFIX}CancelAllOrders",
        f"{ORDER_SERVICE_PREFIX}CancelAllAfter",
        f"{ORDER_SERVICE_PREFIX}Trade",
    }
)

AUTH_REASONS = frozenset(
    {
        G.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS,
        G.GATEWAY_ERROR_REASON_UNKNOWN_KEY,
        G.GATEWAY_ERROR_REASON_BAD_SIGNATURE,
        G.GATEWAY_ERROR_REASON_STALE_TIMESTAMP,
        G.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT,
        G.GATEWAY_ERROR_REASON_ADMIN_REQUIRED,
        G.GATEWAY_ERROR_REASON_KEY_EXPIRED,
        G.GATEWAY_ERROR_REASON_SCOPE_REQUIRED,
    }
)
VALIDATION_REASONS = frozenset(
    {
        G.GATEWAY_ERROR_REASON_INVALID_FIELD,
        G.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL,
        G.GATEWAY_ERROR_REASON_UNKNOWN_ASSET,
        G.GATEWAY_ERROR_REASON_OUT_OF_RANGE,
        G.GATEWAY_ERROR_REASON_BATCH_TOO_LARGE,
    }
)

# The authenticated key of the call being served (set by the interceptor).
caller: contextvars.ContextVar[KeyHolder] = contextvars.ContextVar("caller")


def count_error(counters: GatewayCounters, error: GatewayError) -> None:
    counters.add(f"errors.{error.reason_name.removeprefix('GATEWAY_ERROR_REASON_')}")
    if error.reason in AUTH_REASONS:
        counters.add("auth_failures")
    elif error.reason in VALIDATION_REASONS:
        counters.add("validation_failures")


def authorize_account(holder: KeyHolder, user_id: int) -> None:
    """A user key acts only on its own account; the admin key has no account."""
    if holder.admin or user_id != holder.user_id:
        raise GatewayError(
            G.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT,
            f"user_id {user_id} is not the account of key {holder.api_key}",
        )


class Authenticator:
    def __init__(
        self,
        credentials: CredentialDirectory,
        *,
        timestamp_window_ms: int,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.credentials = credentials
        self.timestamp_window_ms = timestamp_window_ms
        self.wall_clock_ms = wall_clock_ms

    async def authenticate(
        self, method: str, metadata: Sequence[tuple[str, Any]], request: Message | None
    ) -> KeyHolder:
        headers = _headers(metadata)
        api_key = headers.get(API_KEY_HEADER, "")
        timestamp_text = headers.get(TIMESTAMP_HEADER, "")
        offered = headers.get(SIGNATURE_HEADER, "")
        if not api_key or not timestamp_text or not offered:
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS,
                f"every call needs {API_KEY_HEADER}, {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}",
            )
        if not (timestamp_text.isascii() and timestamp_text.isdigit() and len(timestamp_text) < 19):
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS,
                f"{TIMESTAMP_HEADER} must be the client's wall time in ms",
            )
        timestamp_ms = int(timestamp_text)
        skew_ms = timestamp_ms - self.wall_clock_ms()
        if abs(skew_ms) > self.timestamp_window_ms:
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_STALE_TIMESTAMP,
                f"timestamp is {skew_ms} ms from the gateway's clock "
                f"(window {self.timestamp_window_ms} ms)",
            )
        holder = await self.credentials.holder(api_key)
        if holder is None:
            raise GatewayError(G.GATEWAY_ERROR_REASON_UNKNOWN_KEY, "unknown or disabled api key")
        body = signed_body(method, request)
        if holder.kind == ED25519:
            matches = ed25519_matches(
                holder.public_key, signed_text(timestamp_ms, method, body), offered
            )
        else:
            # An empty secret would let anyone sign: such a holder matches nothing.
            expected = signature(holder.secret, timestamp_ms, method, body)
            matches = bool(holder.secret) and signature_matches(expected, offered)
        if not matches:
            raise GatewayError(G.GATEWAY_ERROR_REASON_BAD_SIGNATURE, "signature does not match")
        if holder.expires_at_ms and self.wall_clock_ms() >= holder.expires_at_ms:
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_KEY_EXPIRED,
                f"api key {holder.api_key} expired at {holder.expires_at_ms} ms",
            )
        if not holder.admin and method.startswith(ORDER_SERVICE_PREFIX):
            needed = TRADE if method in TRADING_METHODS else READ
            if needed not in holder.scopes:
                name = "TRADE" if needed == TRADE else "READ"
                raise GatewayError(
                    G.GATEWAY_ERROR_REASON_SCOPE_REQUIRED,
                    f"api key {holder.api_key} lacks the {name} scope this call needs",
                )
        return holder


def _headers(metadata: Sequence[tuple[str, Any]]) -> dict[str, str]:
    """The first value of each of our headers (text only; binary values are ignored)."""
    found: dict[str, str] = {}
    for key, value in metadata or ():
        wanted = key in (API_KEY_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
        if wanted and key not in found and isinstance(value, str):
            found[key] = value
    return found
