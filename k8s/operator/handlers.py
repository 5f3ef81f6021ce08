"""The kopf handlers of OmsCluster resources (group oms.mesh.io, v1alpha1).

A resource created, its spec changed (`kubectl apply`, `kubectl scale`, `kubectl
patch`) or found again when the operator restarts is reconciled
(`mesh_reconciler.py`): its status says the routing epoch, the phase (Ready, Scaling,
Blocked, Upgrading, Failed), each cluster's state, the pins, the last wave's
progress (patched while a wave runs) and, when the spec names a state-machine
version, each replicated group's. What can wait is retried by kopf (a shard not answering yet,
etcd unreachable, users that would not go flat: TemporaryError); a spec that cannot
be done fails the handler (PermanentError) until the spec changes.

The handlers find what they use in kopf's `memo` (`OperatorContext`), made at start-up
from the environment (`OperatorSettings`); tests build one over a real etcd and real
shards and call the handlers with resource bodies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes_asyncio import client

from k8s.operator.kube_config import load_kubernetes_config
from k8s.operator.mesh_reconciler import MeshReconciler, Publish, Status
from k8s.operator.mesh_spec import MeshSpec, OmsClusterSpecError
from k8s.operator.version_rollout import VersionNotReadyError, VersionRollout
from k8s.operator.workloads import (
    ClusterWorkloads,
    ExternalWorkloads,
    KubernetesWorkloads,
    WorkloadsNotReadyError,
)
from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import DEFAULT_MESH_ID
from services.mesh.version_switch import NoLeaderError, SwitchRefusedError
from services.routing.core.routing_document import RoutingDocumentError
from services.routing.routing_store import RoutingConflictError, RoutingStore
from services.routing.shard_probe import ShardProbe, ShardUnreachableError
from services.routing.wave_controller import WaveBlockedError, WaveStalledError
from services.settings import load_settings, setting

GROUP, VERSION, PLURAL = "oms.mesh.io", "v1alpha1", "omsclusters"
RETRY_DELAY_S = 10.0
BLOCKED_DELAY_S = 30.0
FAILED, BLOCKED, SCALING, UPGRADING = "Failed", "Blocked", "Scaling", "Upgrading"
RETRIED = (
    WaveStalledError,
    ShardUnreachableError,
    WorkloadsNotReadyError,
    CoordinationUnavailable,
    RoutingConflictError,
)

registry = kopf.OperatorRegistry()


@dataclass(frozen=True)
class OperatorSettings:
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,... (required): the routing document and leader keys",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    workloads: str = setting(
        env="OMS_OPERATOR_WORKLOADS",
        default="kubernetes",
        help="kubernetes: the operator creates a new cluster's objects (cloned from s1's) "
        "and deletes a removed one's; external: someone else deploys them",
    )
    namespace: str = setting(
        env="POD_NAMESPACE",
        default="oms",
        help="the namespace watched when no --namespace is given, and where new clusters'"
        " objects are made",
    )


@dataclass
class OperatorContext:
    reconciler: MeshReconciler
    publisher: Callable[[str, str], Publish]  # (namespace, name) -> status publisher
    session: EtcdSession | None = None

    async def close(self) -> None:
        await self.reconciler.probe.close()
        if self.session is not None:
            await self.session.close()


async def connect(settings: OperatorSettings) -> OperatorContext:
    if not settings.etcd_endpoints:
        raise kopf.PermanentError("the operator needs OMS_ETCD_ENDPOINTS")
    await load_kubernetes_config()
    session = EtcdSession(settings.etcd_endpoints)
    probe = ShardProbe({}, etcd_endpoints=settings.etcd_endpoints, mesh_id=settings.mesh_id)
    workloads: ClusterWorkloads
    if settings.workloads == "external":
        workloads = ExternalWorkloads(probe)
    elif settings.workloads == "kubernetes":
        workloads = KubernetesWorkloads(probe, settings.namespace)
    else:
        raise kopf.PermanentError(
            f"OMS_OPERATOR_WORKLOADS is kubernetes or external, not {settings.workloads!r}"
        )
    reconciler = MeshReconciler(
        RoutingStore(session, settings.mesh_id),
        probe,
        workloads,
        VersionRollout(session, settings.mesh_id),
    )
    return OperatorContext(reconciler, status_publisher, session)


def status_publisher(namespace: str, name: str) -> Publish:
    """Patches the resource's status subresource (progress while a wave runs)."""

    async def publish(status: Status) -> None:
        async with client.ApiClient() as api_client:
            await client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status}
            )

    return publish


@kopf.on.login(registry=registry)
async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own watches and patches log in as kubernetes_asyncio does (`kube_config.py`):
    the pod's service account, else the kubeconfig. An operator's own registry has no
    login handler of kopf's (only its default registry does): without this one, kopf
    stops at start with "Ran out of valid credentials"."""
    return await kopf.login_via_async_client(**kwargs)


@kopf.on.startup(registry=registry)
async def started(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> None:
    # It watches named namespaces and one CRD: no scanning of the cluster's namespaces
    # and CRDs, which its Role (base/operator/rbac.yaml, namespaced) may not list.
    settings.scanning.disabled = True
    if "context" not in memo:  # a test may have put its own there
        memo["context"] = await connect(load_settings(OperatorSettings))


@kopf.on.cleanup(registry=registry)
async def stopped(memo: kopf.Memo, **_: Any) -> None:
    context: OperatorContext | None = memo.get("context")
    if context is not None:
        await context.close()


async def reconcile(
    *,
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    status: Mapping[str, Any] | None = None,
    **_: Any,
) -> None:
    context: OperatorContext = memo["context"]
    before = dict(status or {})
    patch.status["observedGeneration"] = meta.get("generation", 0)
    try:
        wanted = MeshSpec.of(spec)
    except OmsClusterSpecError as error:
        patch.status.update(phase=FAILED, message=str(error))
        raise kopf.PermanentError(str(error)) from error
    try:
        publish = _unpinning(context.publisher(namespace or "", name), before)
        done = await context.reconciler.reconcile(wanted, publish)
    except WaveBlockedError as error:
        patch.status.update(phase=BLOCKED, message=str(error))
        raise kopf.TemporaryError(str(error), delay=BLOCKED_DELAY_S) from error
    except (VersionNotReadyError, SwitchRefusedError, NoLeaderError) as error:
        # Pods still rolling to a build with the version, or a group electing: wait.
        patch.status.update(phase=UPGRADING, message=str(error))
        raise kopf.TemporaryError(str(error), delay=RETRY_DELAY_S) from error
    except RETRIED as error:
        patch.status.update(phase=SCALING, message=str(error))
        raise kopf.TemporaryError(str(error), delay=RETRY_DELAY_S) from error
    except RoutingDocumentError as error:
        patch.status.update(phase=FAILED, message=str(error))
        raise kopf.PermanentError(str(error)) from error
    patch.status.update(with_unpinned(before, {**done, "message": ""}))
    logger.info(f"routing epoch {done['epoch']}: {done['shards']} active cluster(s)")


def with_unpinned(before: Mapping[str, Any], status: Status) -> Status:
    """`status` as a merge patch: kopf's and the publisher's patches merge objects key by
    key (RFC 7386), so a pin gone from `status["pins"]` is sent as null, or it would
    stay in the resource's status after the whale was unpinned."""
    if "pins" not in status:
        return status
    gone = {user: None for user in before.get("pins") or {} if user not in status["pins"]}
    return {**status, "pins": {**gone, **status["pins"]}}


def _unpinning(publish: Publish, before: Mapping[str, Any]) -> Publish:
    async def published(status: Status) -> None:
        await publish(with_unpinned(before, status))

    return published


# Registered without decorators so `reconcile` keeps its own signature for its callers.
kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)(reconcile)
kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)(reconcile)
kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)(reconcile)


def run(namespaces: Sequence[str], liveness: str | None) -> None:
    """The operator in the foreground (standalone: one instance, the Deployment's)."""
    kopf.configure(verbose=False)
    kopf.run(
        registry=registry,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        standalone=True,
    )
