"""The gateway's error model: a machine-readable reason plus the gRPC status it leaves with.

Handlers and checks raise `GatewayError`; the one interceptor turns it into a
status with the reason's name in the trailing metadata `x-oms-reason`
(gateway.proto). Each reason has exactly one status (named here, so the checks stay
free of gRPC; `gateway/interceptor.py` turns the name into grpc's code), so a reason
can never leave with a code the contract does not give it.
"""

from __future__ import annotations

from protos.oms.v1 import gateway_pb2

Reason = gateway_pb2.GatewayErrorReason

STATUS_OF_REASON: dict[int, str] = {
    gateway_pb2.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS: "UNAUTHENTICATED",
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_KEY: "UNAUTHENTICATED",
    gateway_pb2.GATEWAY_ERROR_REASON_BAD_SIGNATURE: "UNAUTHENTICATED",
    gateway_pb2.GATEWAY_ERROR_REASON_STALE_TIMESTAMP: "UNAUTHENTICATED",
    gateway_pb2.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT: "PERMISSION_DENIED",
    gateway_pb2.GATEWAY_ERROR_REASON_ADMIN_REQUIRED: "PERMISSION_DENIED",
    gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD: "INVALID_ARGUMENT",
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL: "INVALID_ARGUMENT",
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_ASSET: "INVALID_ARGUMENT",
    gateway_pb2.GATEWAY_ERROR_REASON_OUT_OF_RANGE: "INVALID_ARGUMENT",
    gateway_pb2.GATEWAY_ERROR_REASON_ORDER_NOT_FOUND: "NOT_FOUND",
    gateway_pb2.GATEWAY_ERROR_REASON_USER_EXISTS: "ALREADY_EXISTS",
    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_USER: "NOT_FOUND",
    gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE: "UNAVAILABLE",
    gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT: "DEADLINE_EXCEEDED",
    gateway_pb2.GATEWAY_ERROR_REASON_BATCH_TOO_LARGE: "INVALID_ARGUMENT",
    gateway_pb2.GATEWAY_ERROR_REASON_KEY_EXPIRED: "UNAUTHENTICATED",
    gateway_pb2.GATEWAY_ERROR_REASON_SCOPE_REQUIRED: "PERMISSION_DENIED",
    gateway_pb2.GATEWAY_ERROR_REASON_KEY_NOT_FOUND: "NOT_FOUND",
    gateway_pb2.GATEWAY_ERROR_REASON_KEY_REVOKED: "FAILED_PRECONDITION",
}


class GatewayError(Exception):
    """A refusal with its contract reason; `detail` names the field or the cause."""

    def __init__(self, reason: int, detail: str, *, status: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self._status = status

    @property
    def status(self) -> str:
        """The name of the gRPC status it leaves with (`grpc.StatusCode[status]`)."""
        if self._status is not None:
            return self._status
        return STATUS_OF_REASON[self.reason]

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
        status="RESOURCE_EXHAUSTED",
    )
