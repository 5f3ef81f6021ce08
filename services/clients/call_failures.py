"""A failed gRPC call in an operator's words, for the command-line tools' messages.

The tools (`oms status`, `oms upgrade`, `omsctl`, `oms client`) say what went wrong
without gRPC's status names: "not reachable (connection refused)", "no answer within
5.0 s", "does not serve this call (a build without it)". The server's own words (the
details it sent) follow when it sent any; gRPC's own connection noise does not.
"""

from __future__ import annotations

from typing import Protocol

import grpc


class FailedCall(Protocol):
    """A failed call's error (`grpc.aio.AioRpcError`, a blocking call's `grpc.RpcError`)."""

    def code(self) -> grpc.StatusCode: ...

    def details(self) -> str | None: ...


WORDS = {
    grpc.StatusCode.UNAVAILABLE: "not reachable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "no answer in time",
    grpc.StatusCode.UNIMPLEMENTED: "does not serve this call (a build without it)",
    grpc.StatusCode.UNAUTHENTICATED: "did not accept our credentials",
    grpc.StatusCode.PERMISSION_DENIED: "refused: not permitted",
    grpc.StatusCode.FAILED_PRECONDITION: "refused",
    grpc.StatusCode.NOT_FOUND: "not found",
    grpc.StatusCode.INVALID_ARGUMENT: "refused the request",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "overloaded",
    grpc.StatusCode.CANCELLED: "the call was cancelled",
    grpc.StatusCode.INTERNAL: "failed inside",
    grpc.StatusCode.UNKNOWN: "failed",
}
# What the gRPC library itself says about a connection (not the server's words).
_TRANSPORT_NOISE = ("failed to connect", "Socket closed", "connections to all backends failing")


def failure_words(
    code: grpc.StatusCode | None, details: str | None, timeout_s: float | None = None
) -> str:
    """What a call that ended with `code` and `details` means, in plain words."""
    details = (details or "").strip()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and timeout_s is not None:
        return f"no answer within {timeout_s:.1f} s"
    words = WORDS.get(code, "failed") if code is not None else "failed"
    if code == grpc.StatusCode.UNAVAILABLE and (
        not details or any(noise in details for noise in _TRANSPORT_NOISE)
    ):
        if "refused" in details.lower():
            return f"{words} (connection refused)"
        if "handshake" in details.lower() or "ssl" in details.lower():
            return f"{words} (the TLS handshake failed)"
        return words
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and details.startswith("Deadline Exceeded"):
        return words
    if code == grpc.StatusCode.UNIMPLEMENTED and details in ("", "Method not found!"):
        return words
    return f"{words}: {details}" if details else words


def call_failure(error: FailedCall, timeout_s: float | None = None) -> str:
    """`failure_words` of a failed call's error."""
    return failure_words(error.code(), error.details(), timeout_s)
