"""A command-line call sent again while the mesh cannot answer it now.

UNAVAILABLE and TIMEOUT (a shard electing its leader, a gateway restarting) say:
send the same request again (gateway.proto's retry rules). `oms client` does so for
at most `WAIT_S`, a pause between tries, and says once on stderr that it waits,
rather than failing in the middle of an election. Only calls that are safe to repeat
come here: the public API (the same ids), reads, and the admin controls that set a
state (a halt, limits); never a key's creation, which would make two.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from gateway.signed_channel import GatewayCallError

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
                reason = error.reason.removeprefix("GATEWAY_ERROR_REASON_") or error.code.name
                print(f"{command}: waiting ({reason}: {error.detail})", file=sys.stderr)
                said = True
        await asyncio.sleep(RETRY_PAUSE_S)


def retryable(error: GatewayCallError) -> bool:
    return error.code in RETRY_CODES or error.reason in RETRY_REASONS
