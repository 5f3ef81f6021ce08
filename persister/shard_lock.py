"""One persister per shard: a PostgreSQL session advisory lock on the shard id.

Two persisters following one shard (a rolling deploy, a copy-paste mistake)
would both answer flushes and race on the cursor. The second one waits here
until the first lets go, and a persister whose lock connection breaks stops
(crash-only): once the lock is gone another one may already be writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator

import structlog

from persister.errors import StoreError
from persister.store import Session, Store

log = structlog.get_logger(__name__)
RETRY_S = 1.0
CHECK_S = 1.0


class StopRequestedError(Exception):
    """The process was asked to stop while it waited for the lock."""


class ShardLockLostError(RuntimeError):
    """The connection holding the shard's lock broke: another persister may take over."""


def lock_key(shard_id: str) -> int:
    digest = hashlib.blake2b(f"oms-persister:{shard_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextlib.asynccontextmanager
async def shard_lock(
    store: Store, shard_id: str, stopping: asyncio.Event
) -> AsyncIterator[ShardLock]:
    """Hold the shard's lock for the block; waits while another persister holds it
    (a standby), unless `stopping` is set first (StopRequestedError)."""
    async with store.session() as session:
        key = lock_key(shard_id)
        while not await session.fetchval("SELECT pg_try_advisory_lock($1)", key):
            log.warning("persister.shard_lock_busy", shard_id=shard_id, retry_in_s=RETRY_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RETRY_S):
                    await stopping.wait()
            if stopping.is_set():
                raise StopRequestedError(f"stopped while waiting for the lock of {shard_id}")
        log.info("persister.shard_lock_held", shard_id=shard_id)
        try:
            yield ShardLock(session, shard_id)
        finally:
            with contextlib.suppress(StoreError):
                await session.execute("SELECT pg_advisory_unlock($1)", key)


class ShardLock:
    def __init__(self, session: Session, shard_id: str) -> None:
        self.session = session
        self.shard_id = shard_id

    async def watch(self) -> None:
        """Runs as a service loop: stops the service when the lock's connection breaks."""
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self.session.fetchval("SELECT 1")
            except StoreError as error:
                log.critical("persister.shard_lock_lost", shard_id=self.shard_id, error=str(error))
                raise ShardLockLostError(f"lock of shard {self.shard_id} lost: {error}") from error
