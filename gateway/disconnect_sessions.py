"""A Trade stream's cancel-on-disconnect session, kept alive in the user's shard.

The decision is the shard's, on its consensus time (`KeepSession`, `EndSession`,
services/shard/core/saga.py): the gateway opens the session when the stream asks for
it, keeps it alive every third of its timeout while the stream lives, and ends it when
the stream ends, cleanly (its orders rest on) or not (the shard cancels them at once).
If the gateway dies, nothing keeps the session alive, and the shard cancels the orders
placed on it once the timeout has passed. Orders placed on the stream carry the
session's id (`OrderService.place`), decided in the same log entry as the order.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import structlog

from gateway.core.refusals import GatewayError, invalid_field
from gateway.routing import ShardRouter
from protos.oms.v1 import shard_pb2

log = structlog.get_logger(__name__)
KEEP_FRACTION = 3  # kept alive this many times per timeout
END_ATTEMPTS_PAUSE_S = 0.2
# Ending sessions: held so the loop does not drop them while they retry.
_ending: set[asyncio.Task[None]] = set()


class DisconnectSession:
    def __init__(self, router: ShardRouter, user_id: int, timeout_ms: int) -> None:
        self.router = router
        self.user_id = user_id
        self.timeout_ms = timeout_ms
        # Unique among the user's sessions with overwhelming odds; never 0 (no session).
        self.session_id = secrets.randbits(63) | 1
        self._keeper: asyncio.Task[None] | None = None
        self._ended = False

    async def open(self) -> None:
        """Open it in the shard (before any order is placed on it), then keep it alive.
        Raises the GatewayError the stream ends with when the shard refuses it."""
        result = await self._keep()
        if not result.accepted:
            reason = shard_pb2.ShardRejectReason.Name(result.reject_reason)
            raise invalid_field("cancel_on_disconnect_ms", f"the session was refused: {reason}")
        self._keeper = asyncio.create_task(self._keep_alive())

    def end(self, *, clean: bool) -> None:
        """Stop keeping it alive and end it in the shard, in the background: cleanly, or
        cancelling its orders. Retried until its timeout has passed, when the shard has
        ended it anyway (cancelling: a clean end that never arrives is not clean). Once:
        the stream's end is seen by its handler and by the call's done-callback."""
        if self._ended:
            return
        self._ended = True
        log.info("gateway.session_ending", user_id=self.user_id, clean=clean)
        if self._keeper is not None:
            self._keeper.cancel()
        task = asyncio.create_task(self._end(clean))
        _ending.add(task)
        task.add_done_callback(_ending.discard)

    async def _keep(self) -> shard_pb2.ShardResult:
        command = shard_pb2.ShardCommand()
        keep = command.keep_session
        keep.user_id = self.user_id
        keep.session_id = self.session_id
        keep.timeout_ms = self.timeout_ms
        return await self.router.execute(self.user_id, command)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.timeout_ms / 1000 / KEEP_FRACTION)
            try:
                result = await self._keep()
            except GatewayError as error:  # the shard away for now: the next one may pass
                log.info("gateway.session_not_kept", user_id=self.user_id, error=error.detail)
                continue
            if not result.accepted:
                log.warning(
                    "gateway.session_refused",
                    user_id=self.user_id,
                    reason=shard_pb2.ShardRejectReason.Name(result.reject_reason),
                )

    async def _end(self, clean: bool) -> None:
        command = shard_pb2.ShardCommand()
        end = command.end_session
        end.user_id = self.user_id
        end.session_id = self.session_id
        end.cancel_orders = not clean
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.timeout_ms / 1000
        while loop.time() < give_up:
            with contextlib.suppress(GatewayError):
                result = await self.router.execute(self.user_id, command)
                log.info(
                    "gateway.session_ended",
                    user_id=self.user_id,
                    clean=clean,
                    accepted=result.accepted,
                    cancelled=len(result.cancelled_order_ids),
                )
                return
            await asyncio.sleep(END_ATTEMPTS_PAUSE_S)
        log.warning("gateway.session_not_ended", user_id=self.user_id, clean=clean)
