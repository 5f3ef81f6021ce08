"""`oms shard --colocate`: a shard cluster in one process.

The shard replica, its persister, its bridge and its reconciler run on one event
loop, as Aeron's ClusteredMediaDriver runs a node's parts together and Orleans and
Akka call co-located actors directly. Each role is the same service code as in its
own process, configured by its own settings (`OMS_PERSISTER_*`, `OMS_BRIDGE_*`,
`OMS_RECONCILER_*`, listening on its own port for health, status and, for the
persister, the gateway's reads), and each keeps its own lease and fencing token
where leases are on. What changes is the road to the shard: the shard serves its
services in-process at its own addresses (`services/clients/in_process.py`), so a
role's stub or `ShardLink` aimed at the shard runs the shard's handlers on this
loop, with no gRPC, no socket and no other process to wake. A role whose shard
address names another replica (a follower's roles, when etcd names the leader) still
reaches it over gRPC: leadership and fencing keep their meaning.

The roles start once the shard serves (in-process too), so their first connections
are in-process. One SIGTERM stops all four (`stop_signals`); if one of them fails,
the others are cancelled and the process exits for its supervisor to restart, as
any of the four alone would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from bridge.command import serve as serve_bridge
from bridge.settings import BridgeSettings
from persister.running import serve as serve_persister
from persister.settings import PersisterSettings
from services.observability.tracing import tracing_enabled
from services.reconciler.command import serve as serve_reconciler
from services.reconciler.settings import ReconcilerSettings
from services.runtime.hosting import RuntimeHost
from services.settings import load_settings
from services.shard.command import build_host
from services.shard.command import serve as serve_shard
from services.shard.settings import ShardServiceSettings

log = structlog.get_logger(__name__)


async def serve_colocated(settings: ShardServiceSettings) -> None:
    host: RuntimeHost[Any] = build_host(settings)
    host.in_process_addresses = tuple(
        dict.fromkeys(address for address in (settings.listen, settings.advertise) if address)
    )
    persister = load_settings(PersisterSettings, overrides={"shard_id": settings.shard_id})
    bridge = load_settings(BridgeSettings, overrides={"shard_id": settings.shard_id})
    reconciler = load_settings(ReconcilerSettings, overrides={"shard_id": settings.shard_id})
    log.info(
        "shard.colocated",
        shard=settings.listen,
        in_process=host.in_process_addresses,
        persister=persister.listen,
        bridge=bridge.listen,
        reconciler=reconciler.listen,
    )
    async with asyncio.TaskGroup() as roles:
        shard = roles.create_task(serve_shard(settings, host))
        ready = roles.create_task(host.ready.wait())
        await asyncio.wait((shard, ready), return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            return  # the shard ended before it served (the error, if any, is raised)
        # With leases (a replicated cluster), each role campaigns once this replica leads.
        roles.create_task(serve_persister(persister, beside=host))
        roles.create_task(serve_bridge(bridge, traced=tracing_enabled(), beside=host))
        roles.create_task(serve_reconciler(reconciler, beside=host))
