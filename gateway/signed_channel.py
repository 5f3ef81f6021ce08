"""The client side of the gateway's signing: one channel, one key, fresh metadata per call.

Shared by `OmsClient`, `AdminClient` and their streams. A refusal by the gateway
becomes `GatewayCallError` with the status code and the contract's reason name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from gateway.signing import REASON_TRAILER, HmacSigner, Signer, signed_metadata
from services.clients.channels import gateway_channel

DEFAULT_TIMEOUT_S = 15.0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class GatewayCallError(Exception):
    """The gateway refused a call: status code, reason name (gateway.proto) and detail."""

    def __init__(self, code: grpc.StatusCode, reason: str, detail: str) -> None:
        super().__init__(f"{code.name} {reason or '-'}: {detail}")
        self.code = code
        self.reason = reason
        self.detail = detail

    @classmethod
    def of(cls, error: grpc.aio.AioRpcError) -> GatewayCallError:
        reason = ""
        for key, value in error.trailing_metadata() or ():
            if key == REASON_TRAILER:
                reason = str(value)
        return cls(error.code(), reason, error.details() or "")


class SignedChannel:
    """One channel and one key (HMAC or Ed25519): every call carries fresh signed
    metadata."""

    def __init__(
        self,
        address: str,
        api_key: str,
        signer: Signer | str,
        *,
        channel: grpc.aio.Channel | None,
        clock_ms: Callable[[], int],
        timeout_s: float,
    ) -> None:
        self.address = address
        self.api_key = api_key
        # An HMAC secret (str), or a `Signer` (an Ed25519 private key's).
        self.signer: Signer = HmacSigner(signer) if isinstance(signer, str) else signer
        self.clock_ms = clock_ms
        self.timeout_s = timeout_s
        self._own_channel = channel is None
        self.channel = channel if channel is not None else gateway_channel(address)

    def metadata(self, method: str, request: Message | None) -> tuple[tuple[str, str], ...]:
        return signed_metadata(self.api_key, self.signer, method, request, self.clock_ms())

    async def unary(self, method: str, request: Message, response_type: type[Any]) -> Any:
        call = self.channel.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        try:
            return await call(
                request, metadata=self.metadata(method, request), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise GatewayCallError.of(error) from error

    async def close(self) -> None:
        if self._own_channel:
            await self.channel.close()
