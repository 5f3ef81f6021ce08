"""Start-up and shutdown of one persister: database, schema, the mesh's identity, lease,
lock, fence, cursor, then serve.

Once the schema is current, the database is claimed for the mesh (`OMS_MESH_ID`)
and, when the mesh's logs are in etcd, bound to the mesh's etcd namespace
(`persister/mesh_identity.py`): another mesh's database or etcd stops it before it
writes any of the mesh's data.

With `OMS_PERSISTER_LEADER_LEASE` the persister first takes its shard's etcd lease
(`/oms/v1/<mesh>/persister/<shard>/leader`; a second instance waits there as a standby)
and its term becomes the fencing token; otherwise the token is a counter the
database hands out under the shard's advisory lock. Either way the token is
claimed in PostgreSQL (`writer_fence`), which then refuses every write
transaction of an older one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import structlog

from persister.api_keys import (
    UnknownMasterKeyError,
    reseal_retired_secrets,
    seal_plaintext_secrets,
)
from persister.cursor import read_cursor
from persister.mesh_identity import MeshIdentity, bind_etcd, claim_database
from persister.migrations import apply_migrations
from persister.secret_seal import MasterKey
from persister.service import PersisterService
from persister.settings import PersisterSettings
from persister.shard_answers import ShardAnswers
from persister.shard_lock import StopRequestedError, shard_lock
from persister.store import Store
from persister.writer_fence import claim
from services.coordination.addresses import FROM_ETCD, address_source
from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import GroupKeys
from services.coordination.leadership import Leadership
from services.serving.leader_only import LeadingReplica
from services.serving.service_host import BackgroundLoop, ServiceHost
from services.serving.stop_signals import on_stop_signal
from services.settings import SettingsError

log = structlog.get_logger(__name__)
LEASE_TTL_S = 2
ETCD_RETRY_S = 0.5


def master_key(settings: PersisterSettings) -> MasterKey:
    """The key sealing HMAC secrets: required, since every user's first key is one."""
    try:
        retired = [key for key in settings.retired_master_keys.split(",") if key.strip()]
        if settings.retired_master_keys_file is not None:
            lines = settings.retired_master_keys_file.read_text().splitlines()
            retired += [line for line in lines if line.strip()]
        if settings.master_key_file is not None:
            return MasterKey.from_file(settings.master_key_file, retired)
        if settings.master_key:
            return MasterKey.from_text(settings.master_key, retired)
    except (OSError, ValueError) as error:
        raise SettingsError(f"the persister's master key: {error}") from error
    raise SettingsError(
        "OMS_PERSISTER_MASTER_KEY (32 bytes, base64) or OMS_PERSISTER_MASTER_KEY_FILE is not"
        " set: it seals the API keys' secrets in the database"
    )


async def serve(settings: PersisterSettings, *, beside: LeadingReplica | None = None) -> None:
    """`beside`: the shard replica this persister shares a process with; with a lease it
    campaigns only once that replica leads (a follower's persister stays standby)."""
    master = master_key(settings)  # before anything starts: a missing key stops the start
    host = ServiceHost(settings.listen)
    stopping = asyncio.Event()

    def stop() -> None:
        stopping.set()  # a standby waiting for the shard's lock gives up
        host.stop()  # a running service stops gracefully (also if asked before it ran)

    on_stop_signal(stop)
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
        mesh_id=settings.mesh_id,
    )
    link = ShardAnswers(shard)
    try:
        applied = await apply_migrations(store)
        log.info("persister.schema_ready", applied_now=applied)
        sealed = await seal_plaintext_secrets(store, master)
        if sealed:
            log.info("persister.secrets_sealed", rows=sealed)
        try:
            reseal = await reseal_retired_secrets(store, master)
        except UnknownMasterKeyError as error:
            raise SettingsError(str(error)) from error
        if reseal.resealed:
            log.info("persister.secrets_resealed", rows=reseal.resealed, key_id=master.key_id.hex())
        for api_key in reseal.damaged:
            log.error("persister.sealed_secret_damaged", api_key=api_key)
        if reseal.left or master.retired_key_ids:
            # A retired key may leave the configuration once this says 0 on every start.
            log.info("persister.secrets_under_retired_keys", rows=reseal.left)
        identity = await claim_database(store, settings.mesh_id)
        if settings.leader_lease or settings.shard_address == FROM_ETCD:
            await _bind_etcd(settings, store, identity)
        log.info("persister.mesh", mesh_id=identity.mesh_id, database_uid=identity.database_uid)
        async with contextlib.AsyncExitStack() as stack:
            token: int | None = None
            loops: list[BackgroundLoop] = []
            if settings.leader_lease:
                leadership = await stack.enter_async_context(_leased(settings))
                token = await _campaign(leadership, stopping, beside)
                loops.append(leadership.hold)  # LeaseLost stops the service
            lock = await stack.enter_async_context(shard_lock(store, settings.shard_id, stopping))
            store.fence = await claim(store, settings.shard_id, token)
            async with store.session() as session:
                cursor = await read_cursor(session, settings.shard_id)
            log.info(
                "persister.starting",
                shard_id=settings.shard_id,
                cursor=cursor,
                writer_token=store.fence.token,
            )
            service = PersisterService(
                settings, store, link, lock, master=master, start_position=cursor
            )
            plan = service.plan()
            plan.loops = [*plan.loops, *loops]
            await host.run(plan)
    except StopRequestedError:
        log.info("persister.stopped_before_serving", shard_id=settings.shard_id)
    finally:
        await link.close()
        await shard.close()
        await store.close()


async def _bind_etcd(settings: PersisterSettings, store: Store, identity: MeshIdentity) -> None:
    """`bind_etcd`, retried while etcd cannot be reached, for the start-up timeout."""
    if not settings.etcd_endpoints:
        raise SettingsError("the shard's address says etcd: set OMS_ETCD_ENDPOINTS")
    deadline = time.monotonic() + settings.startup_timeout_ms / 1000
    while True:
        try:
            async with EtcdSession(settings.etcd_endpoints) as etcd:
                await bind_etcd(etcd, store, identity)
            return
        except CoordinationUnavailable as error:
            if time.monotonic() >= deadline:
                raise
            log.info("persister.etcd_unreachable", error=str(error))
            await asyncio.sleep(ETCD_RETRY_S)


@contextlib.asynccontextmanager
async def _leased(settings: PersisterSettings) -> AsyncIterator[Leadership]:
    if not settings.etcd_endpoints:
        raise SettingsError("OMS_PERSISTER_LEADER_LEASE needs OMS_ETCD_ENDPOINTS")
    async with EtcdSession(settings.etcd_endpoints) as session:
        keys = GroupKeys.of(settings.mesh_id, "persister", settings.shard_id)
        holder = settings.advertise or settings.listen
        leadership = Leadership(session, keys.leader, holder, ttl_s=LEASE_TTL_S)
        try:
            yield leadership
        finally:
            await leadership.resign()


async def _campaign(
    leadership: Leadership, stopping: asyncio.Event, beside: LeadingReplica | None
) -> int:
    """The term once this persister holds the lease (campaigning once `beside` leads);
    StopRequestedError if asked to stop first."""
    log.info("persister.standby", key=leadership.key.decode())
    campaign = asyncio.create_task(_campaign_beside(leadership, beside))
    stop = asyncio.create_task(stopping.wait())
    await asyncio.wait({campaign, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if not campaign.done():
        campaign.cancel()
        raise StopRequestedError("stopped while waiting for the persister's lease")
    return campaign.result()


async def _campaign_beside(leadership: Leadership, beside: LeadingReplica | None) -> int:
    if beside is not None:
        await beside.wait_leading()
    return await leadership.campaign()
