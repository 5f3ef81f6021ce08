"""Where a user-shard cluster's processes come from, before a wave may route users to it.

`ensure(cluster)` returns once the cluster's shard answers (its leader, found in etcd
or at a given address); `remove(cluster)` once its objects are gone, after the scale-in
moved everyone off it. Two ways:

- `KubernetesWorkloads` (`OMS_OPERATOR_WORKLOADS=kubernetes`, the default in the
  manifests): the operator creates a new cluster's StatefulSet, Service, budget and
  ConfigMap, cloned from s1's (`cluster_objects.py`), and deletes a removed one's
  (its volumes are kept: PersistentVolumeClaims outlive their StatefulSet);
- `ExternalWorkloads` (`external`): the clusters are deployed by someone else (a
  GitOps tool, `oms up`, a test), and the operator only waits for the shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from k8s.operator.cluster_objects import CLUSTER_LABEL, cloned_cluster_objects
from k8s.operator.kube_config import load_kubernetes_config
from services.routing.shard_probe import ShardProbe, ShardUnreachableError

log = structlog.get_logger(__name__)
TEMPLATE_CLUSTER = "s1"
POLL_S = 0.5


class WorkloadsNotReadyError(RuntimeError):
    """A cluster's shard did not answer in time (the operator tries again later)."""


class ClusterWorkloads(Protocol):
    async def ensure(self, cluster_id: str) -> None: ...

    async def remove(self, cluster_id: str) -> None: ...


async def wait_shard_answers(probe: ShardProbe, cluster_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await probe.routing_state(cluster_id)
            return
        except ShardUnreachableError as error:
            if time.monotonic() >= deadline:
                raise WorkloadsNotReadyError(
                    f"cluster {cluster_id}'s shard did not answer within {timeout_s:g} s: {error}"
                ) from error
        await asyncio.sleep(POLL_S)


class ExternalWorkloads:
    def __init__(self, probe: ShardProbe, *, ready_timeout_s: float = 60.0) -> None:
        self.probe = probe
        self.ready_timeout_s = ready_timeout_s

    async def ensure(self, cluster_id: str) -> None:
        await wait_shard_answers(self.probe, cluster_id, self.ready_timeout_s)

    async def remove(self, cluster_id: str) -> None:
        """Its deployer removes it."""


class KubernetesWorkloads:
    """Clones s1's objects for a new cluster through the Kubernetes API, in-cluster."""

    def __init__(
        self, probe: ShardProbe, namespace: str, *, ready_timeout_s: float = 600.0
    ) -> None:
        self.probe = probe
        self.namespace = namespace
        self.ready_timeout_s = ready_timeout_s

    async def ensure(self, cluster_id: str) -> None:
        if cluster_id != TEMPLATE_CLUSTER:
            async with _kubernetes() as api:
                template = await api.cluster_objects(self.namespace, TEMPLATE_CLUSTER)
                # A kind the cluster has already (the base's s2, a previous run's clone)
                # is left as it is: a clone's name may differ from the deployed one's
                # (kustomize suffixes a ConfigMap's name with its hash), and a second
                # ConfigMap would be litter nobody references.
                present = {
                    item["kind"] for item in await api.cluster_objects(self.namespace, cluster_id)
                }
                for item in cloned_cluster_objects(template, TEMPLATE_CLUSTER, cluster_id):
                    if item["kind"] in present:
                        continue
                    created = await api.create_if_absent(self.namespace, item)
                    if created:
                        log.info(
                            "operator.created", kind=item["kind"], name=item["metadata"]["name"]
                        )
        await wait_shard_answers(self.probe, cluster_id, self.ready_timeout_s)

    async def remove(self, cluster_id: str) -> None:
        if cluster_id == TEMPLATE_CLUSTER:
            return  # the base's own cluster, and every clone's template: never deleted
        async with _kubernetes() as api:
            for item in await api.cluster_objects(self.namespace, cluster_id):
                await api.delete(self.namespace, item)
                log.info("operator.deleted", kind=item["kind"], name=item["metadata"]["name"])


class _KubernetesApi:
    """The few calls the operator makes, over kubernetes_asyncio."""

    def __init__(self, api_client: Any) -> None:
        self.client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)

    async def cluster_objects(self, namespace: str, cluster_id: str) -> list[dict[str, Any]]:
        selector = f"{CLUSTER_LABEL}={cluster_id}"
        found: list[dict[str, Any]] = []
        for kind, lister in (
            ("ConfigMap", self.core.list_namespaced_config_map),
            ("Service", self.core.list_namespaced_service),
            ("PodDisruptionBudget", self.policy.list_namespaced_pod_disruption_budget),
            ("StatefulSet", self.apps.list_namespaced_stateful_set),
        ):
            listed = await lister(namespace, label_selector=selector)
            for item in listed.items:
                plain = self.client.sanitize_for_serialization(item)
                plain["kind"] = kind
                # The selector is the server's filter; checked again here, since what
                # is listed may be deleted: a server or proxy that ignored it (an API
                # mock does) must not make the operator delete another cluster.
                labels = plain.get("metadata", {}).get("labels") or {}
                if labels.get(CLUSTER_LABEL) == cluster_id:
                    found.append(plain)
        return found

    async def create_if_absent(self, namespace: str, item: Mapping[str, Any]) -> bool:
        creators: dict[str, Callable[..., Awaitable[Any]]] = {
            "ConfigMap": self.core.create_namespaced_config_map,
            "Service": self.core.create_namespaced_service,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
            "StatefulSet": self.apps.create_namespaced_stateful_set,
        }
        try:
            await creators[item["kind"]](namespace, dict(item))
        except ApiException as error:
            if error.status == 409:  # already there: a previous run made it
                return False
            raise
        return True

    async def delete(self, namespace: str, item: Mapping[str, Any]) -> None:
        deleters: dict[str, Callable[..., Awaitable[Any]]] = {
            "ConfigMap": self.core.delete_namespaced_config_map,
            "Service": self.core.delete_namespaced_service,
            "PodDisruptionBudget": self.policy.delete_namespaced_pod_disruption_budget,
            "StatefulSet": self.apps.delete_namespaced_stateful_set,
        }
        try:
            await deleters[item["kind"]](item["metadata"]["name"], namespace)
        except ApiException as error:
            if error.status != 404:
                raise


@contextlib.asynccontextmanager
async def _kubernetes() -> AsyncIterator[_KubernetesApi]:
    """The API of the cluster the operator runs in (`kube_config.py`)."""
    await load_kubernetes_config()
    api_client = client.ApiClient()
    try:
        yield _KubernetesApi(api_client)
    finally:
        await api_client.close()
