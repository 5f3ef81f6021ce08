"""A role only one instance may play at a time (a shard's bridge, its reconciler).

Several instances run; each serves health and status, and campaigns for the role's
key in etcd (`/oms/v1/<mesh>/<role>/<shard>/leader`, under a lease). Only the holder runs
the service's loops: the others wait as hot standbys, already started and
connected to etcd, and the first to see the key vacant takes over. The term (the
key's create revision) is the holder's fencing token: while it holds the role, its
`WriterCredential` carries it, and the service sends it with every call that
writes, which the shard and the matcher check (`coordination/writer_tokens.py`).
A holder that cannot renew its lease within the TTL stops with `LeaseLost`
(crash-only: its supervisor starts it again, as a standby); one stopped gracefully
resigns, so a standby takes over at once instead of after the TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

import structlog

from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import GroupKeys
from services.coordination.leadership import Leadership
from services.coordination.writer_tokens import WriterCredential, WriterToken
from services.serving.service_host import BackgroundLoop, ServicePlan

log = structlog.get_logger(__name__)


class LeadingReplica(Protocol):
    """The shard replica a role runs beside, in one process."""

    async def wait_leading(self) -> None: ...


class LeaderOnly:
    def __init__(
        self,
        etcd_endpoints: Sequence[str],
        *,
        mesh_id: str,
        role: str,
        shard_id: str,
        holder: str,
        credential: WriterCredential,
        ttl_s: int = 2,
        beside: LeadingReplica | None = None,
    ) -> None:
        if not etcd_endpoints:
            raise ValueError(f"the {role} of {shard_id} is leader-only: set OMS_ETCD_ENDPOINTS")
        self.etcd_endpoints = tuple(etcd_endpoints)
        self.keys = GroupKeys.of(mesh_id, role, shard_id)
        self.holder = holder
        self.credential = credential
        self.shard_id = shard_id
        self.ttl_s = ttl_s
        self.role = role
        self.leading = False
        self.term = 0
        self.terms_won = 0
        # Co-located with a shard replica: campaign only once it leads (a follower's
        # roles stay standby; services/shard/colocated.py).
        self.beside = beside

    def wrap(self, plan: ServicePlan) -> ServicePlan:
        """The same service, whose loops run only while this instance holds the role."""
        loops = list(plan.loops)

        async def lead() -> None:
            await self._lead(loops)

        def status() -> tuple[Mapping[str, int], Mapping[str, str]]:
            counters, info = plan.status()
            return (
                {**counters, "leading": int(self.leading), "term": self.term},
                {**info, "role": "active" if self.leading else "standby"},
            )

        return ServicePlan(
            name=plan.name,
            service_names=plan.service_names,
            register=plan.register,
            status=status,
            loops=[lead],
            interceptors=plan.interceptors,
        )

    async def _lead(self, loops: Sequence[BackgroundLoop]) -> None:
        async with EtcdSession(self.etcd_endpoints) as session:
            leadership = Leadership(session, self.keys.leader, self.holder, ttl_s=self.ttl_s)
            try:
                log.info("leader_only.standby", key=self.keys.leader.decode())
                if self.beside is not None:
                    await self.beside.wait_leading()
                self.term = await leadership.campaign()
                self.terms_won += 1
                self.credential.token = WriterToken(self.role, self.shard_id, self.term)
                self.leading = True
                log.info("leader_only.active", key=self.keys.leader.decode(), term=self.term)
                async with asyncio.TaskGroup() as group:
                    group.create_task(leadership.hold())  # raises LeaseLost: the group ends
                    for loop in loops:
                        group.create_task(loop())
            finally:
                self.leading = False
                self.credential.token = None
                await leadership.resign()
