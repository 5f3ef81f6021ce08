"""A command-line call sent again while the mesh cannot answer it now.

UNAVAILABLE and TIMEOUT (a shard electing its leader, a gateway restarting) say:
send the same request again (gateway.proto's retry rules). `oms client` does so for
at most `WAIT_S`, a pause between tries, and says once on stderr that it waits,
rather than failing in the middle of an election. Only calls that are safe to repeat
come here: the public API (the same ids), reads, and the admin controls that set a
state (a halt, limits); never a key's creation, which would make two.

`refusal` is the line a call that failed in the end prints: the gateway's reason and
detail (gateway.proto), or, for a gateway that could not be reached, which address was
tried and what to run, in plain words (`services/clients/call_failures.py`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from gateway.signed_channel import GatewayCallError
from services.clients.call_failures import failure_words

T = TypeVar("T")
WAIT_S = 20.0  # an election: a 2 s lease, the campaign, a loaded machine
RETRY_PAUSE_S = 0.25
RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
RETRY_REASONS = frozenset({"GATEWAY_ERROR_REASON_UNAVAILABLE", "GATEWAY_ERROR_REASON_TIMEOUT"})


async def through_elections(call: Callable[[], Awaitable[T]], command: str) -> T:
    """`call()`'s answer, asking again while it is refused as retryable, within `WAIT_S`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    said = False
    while True:
        try:
            return await call()
        except GatewayCallError as error:
            if not retryable(error) or loop.time() >= deadline:
                raise
            if not said:
                print(f"{command}: waiting ({_why(error)})", file=sys.stderr)
                said = True
        await asyncio.sleep(RETRY_PAUSE_S)


def retryable(error: GatewayCallError) -> bool:
    return error.code in RETRY_CODES or error.reason in RETRY_REASONS


def _why(error: GatewayCallError) -> str:
    """The gateway's reason and detail; a failure without a reason, in words."""
    if error.reason:
        return f"{error.reason.removeprefix('GATEWAY_ERROR_REASON_')}: {error.detail}"
    if error.code in RETRY_CODES:
        return f"no answer from the gateway: {failure_words(error.code, error.detail)}"
    return failure_words(error.code, error.detail)


def refusal(error: GatewayCallError, command: str, gateway: str, hint: str = "") -> str:
    """What a call that failed in the end prints. `hint`: what to run when the gateway
    could not be reached (no mesh found, say)."""
    if error.reason or error.code not in RETRY_CODES:
        return f"refused: {_why(error)}"
    words = failure_words(error.code, error.detail)
    line = f"{command}: no answer from the gateway at {gateway} within {WAIT_S:.0f} s ({words})"
    return f"{line}; {hint}" if hint else line
