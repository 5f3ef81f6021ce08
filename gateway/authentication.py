"""Authentication and authorization: who signed a call, and what that key may touch.

A call carries its key id, timestamp and signature in metadata (gateway.proto
header; the scheme itself is in `gateway.signing`, shared with the clients).
Order of checks: credentials present, timestamp inside the window (before any
lookup, so replayed junk costs no persister call), key known, signature valid
(constant-time). Then the account: a user key acts only on its own user id, and
the admin key on no account at all. `gateway.interceptor` applies all of it to
every call; the Trade stream applies `authorize_account` to each request.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from gateway.credentials import CredentialDirectory, KeyHolder
from gateway.errors import GatewayError
from gateway.signing import (
    API_KEY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature,
    signature_matches,
    signed_body,
)
from gateway.statistics import GatewayCounters
from protos.oms.v1 import gateway_pb2

ORDER_SERVICE_PREFIX = "/oms.v1.OrderGateway/"
ADMIN_SERVICE_PREFIX = "/oms.v1.AdminGateway/"
G = gateway_pb2

AUTH_REASONS = frozenset(
    {
        G.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS,
        G.GATEWAY_ERROR_REASON_UNKNOWN_KEY,
        G.GATEWAY_ERROR_REASON_BAD_SIGNATURE,
        G.GATEWAY_ERROR_REASON_STALE_TIMESTAMP,
        G.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT,
        G.GATEWAY_ERROR_REASON_ADMIN_REQUIRED,
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
        expected = signature(holder.secret, timestamp_ms, method, signed_body(method, request))
        if not signature_matches(expected, offered):
            raise GatewayError(G.GATEWAY_ERROR_REASON_BAD_SIGNATURE, "signature does not match")
        return holder


def _headers(metadata: Sequence[tuple[str, Any]]) -> dict[str, str]:
    """The first value of each of our headers (text only; binary values are ignored)."""
    found: dict[str, str] = {}
    for key, value in metadata or ():
        wanted = key in (API_KEY_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
        if wanted and key not in found and isinstance(value, str):
            found[key] = value
    return found
