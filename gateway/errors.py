"""The gateway's error model: a gRPC status code plus a machine-readable reason.

Handlers and checks raise `GatewayError`; the one interceptor turns it into a
status with the reason's name in the trailing metadata `x-oms-reason`
(gateway.proto). Each reason has exactly one status code, so a reason can never
leave with a code the contract does not give it.
"""

from __future__ import annotations

import grpc

from protos.oms.v1 import gateway_pb2

Reason = gateway_pb2.GatewayErrorReason

CODE_OF_REASON: dict[int, grpc.StatusCode] = {
    gateway_pb2.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS: grpc.StatusCode.UNAUTHENTICATED,
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_KEY: grpc.StatusCode.UNAUTHENTICATED,
    gateway_pb2.GATEWAY_ERROR_REASON_BAD_SIGNATURE: grpc.StatusCode.UNAUTHENTICATED,
    gateway_pb2.GATEWAY_ERROR_REASON_STALE_TIMESTAMP: grpc.StatusCode.UNAUTHENTICATED,
    gateway_pb2.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT: grpc.StatusCode.PERMISSION_DENIED,
    gateway_pb2.GATEWAY_ERROR_REASON_ADMIN_REQUIRED: grpc.StatusCode.PERMISSION_DENIED,
    gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD: grpc.StatusCode.INVALID_ARGUMENT,
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL: grpc.StatusCode.INVALID_ARGUMENT,
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_ASSET: grpc.StatusCode.INVALID_ARGUMENT,
    gateway_pb2.GATEWAY_ERROR_REASON_OUT_OF_RANGE: grpc.StatusCode.INVALID_ARGUMENT,
    gateway_pb2.GATEWAY_ERROR_REASON_ORDER_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    gateway_pb2.GATEWAY_ERROR_REASON_USER_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_USER: grpc.StatusCode.NOT_FOUND,
    gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    gateway_pb2.GATEWAY_ERROR_REASON_BATCH_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    gateway_pb2.GATEWAY_ERROR_REASON_KEY_EXPIRED: grpc.StatusCode.UNAUTHENTICATED,
    gateway_pb2.GATEWAY_ERROR_REASON_SCOPE_REQUIRED: grpc.StatusCode.PERMISSION_DENIED,
    gateway_pb2.GATEWAY_ERROR_REASON_KEY_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    gateway_pb2.GATEWAY_ERROR_REASON_KEY_REVOKED: grpc.StatusCode.FAILED_PRECONDITION,
}


class GatewayError(Exception):
    """A refusal with its contract reason; `detail` names the field or the cause."""

    def __init__(self, reason: int, detail: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self._code = code

    @property
    def code(self) -> grpc.StatusCode:
        if self._code is not None:
            return self._code
        return CODE_OF_REASON[self.reason]

    @property
    def reason_name(self) -> str:
        return gateway_pb2.GatewayErrorReason.Name(self.reason)  # type: ignore[arg-type]


def invalid_field(field: str, why: str) -> GatewayError:
    return GatewayError(gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD, f"{field}: {why}")


def out_of_range(field: str, why: str) -> GatewayError:
    return GatewayError(gateway_pb2.GATEWAY_ERROR_REASON_OUT_OF_RANGE, f"{field}: {why}")


def unavailable(detail: str) -> GatewayError:
    return GatewayError(gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE, detail)


def timed_out(detail: str) -> GatewayError:
    return GatewayError(gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT, detail)


def deadline_passed(deadline_s: float) -> GatewayError:
    return timed_out(f"no answer within the request deadline of {deadline_s:g} s")


def slow_consumer(detail: str) -> GatewayError:
    return GatewayError(
        gateway_pb2.GATEWAY_ERROR_REASON_SLOW_CONSUMER,
        detail,
        code=grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
