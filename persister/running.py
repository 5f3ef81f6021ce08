"""Start-up and shutdown of one persister: database, schema, lock, cursor, then serve."""

from __future__ import annotations

import asyncio
import signal

import structlog

from persister.cursor import read_cursor
from persister.migrations import apply_migrations
from persister.service import PersisterService
from persister.settings import PersisterSettings
from persister.shard_answers import ShardAnswers
from persister.shard_lock import StopRequestedError, shard_lock
from persister.store import Store
from services.coordination.addresses import address_source
from services.serving.service_host import ServiceHost

log = structlog.get_logger(__name__)


async def serve(settings: PersisterSettings) -> None:
    host = ServiceHost(settings.listen)
    stopping = asyncio.Event()

    def stop() -> None:
        stopping.set()  # a standby waiting for the shard's lock gives up
        host.stop()  # a running service stops gracefully (also if asked before it ran)

    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop)
    store = await Store.open_when_ready(
        settings.database_url,
        pool_size=settings.pool_size,
        timeout_s=settings.startup_timeout_ms / 1000,
    )
    shard = address_source(
        settings.shard_address,
        kind="shard",
        name=settings.shard_id,
        etcd_endpoints=settings.etcd_endpoints,
    )
    link = ShardAnswers(shard)
    try:
        applied = await apply_migrations(store)
        log.info("persister.schema_ready", applied_now=applied)
        async with shard_lock(store, settings.shard_id, stopping) as lock:
            async with store.session() as session:
                cursor = await read_cursor(session, settings.shard_id)
            log.info("persister.starting", shard_id=settings.shard_id, cursor=cursor)
            service = PersisterService(settings, store, link, lock, start_position=cursor)
            await host.run(service.plan())
    except StopRequestedError:
        log.info("persister.stopped_before_serving", shard_id=settings.shard_id)
    finally:
        await link.close()
        await shard.close()
        await store.close()
