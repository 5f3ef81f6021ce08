"""`oms operator` for real against an API over HTTP: kmock, an in-memory mock of the
Kubernetes API by kopf's author, NOT Kubernetes (no scheduler, kubelet, admission,
validation by schema, RBAC, resource versions or label selectors on its side).

The mock holds the CRD's resource and the base's objects for clusters s1 and s2 (as
`kubectl kustomize k8s/base` renders them); the operator runs as its Deployment runs
it, a subprocess of `oms operator`, finding the mock by a kubeconfig as kubectl would,
and etcd and the shards for real: one shard per cluster, each a replica leading its
own etcd log (so the operator finds it as in Kubernetes, by its leader key), s3's
started already as the StatefulSet the operator creates would start it. Through the
API the test creates an OmsCluster, scales it 2 -> 3 -> 2, pins a whale and unpins
it, and submits a spec the operator refuses; it checks the objects the operator
cloned and deleted, the status it patched, and the routing document in etcd.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest

from k8s.operator.cluster_objects import CLUSTER_LABEL, KINDS
from services.coordination.etcd_session import EtcdSession
from services.matcher.core import versions as matcher_versions
from services.routing.core.routing_document import RoutingDocument
from services.routing.routing_store import RoutingStore
from services.shard.core import versions as shard_versions
from tests.k8s.test_manifests import rendered
from tests.service_process import ROOT
from tests.sharded_mesh import ShardedMesh

NAMESPACE = "oms"
OMSCLUSTERS = "oms.mesh.io/v1alpha1/omsclusters"
NAMESPACES = "v1/namespaces"
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
RESOURCES = {
    "ConfigMap": "v1/configmaps",
    "Service": "v1/services",
    "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "StatefulSet": "apps/v1/statefulsets",
}
PATHS = {
    "ConfigMap": f"/api/v1/namespaces/{NAMESPACE}/configmaps",
    "Service": f"/api/v1/namespaces/{NAMESPACE}/services",
    "PodDisruptionBudget": f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets",
    "StatefulSet": f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets",
}
CLUSTER_PATH = f"/apis/oms.mesh.io/v1alpha1/namespaces/{NAMESPACE}/omsclusters"
WHALE = 4242
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
WAIT_S = 90.0


_WRITES = itertools.count(1)


class VersionedEmulator(kmock.KubernetesEmulator):
    """kmock's emulator, giving each write a new `metadata.resourceVersion` as an API
    server does (kmock keeps none): kopf tells the echo of its own patch from a newer
    change by it, and without it handles the same change again and again."""

    async def _handle(self, request: kmock.Request) -> Any:
        written = request.action in (kmock.action.CREATE, kmock.action.UPDATE)
        if request.resource is not None and written and isinstance(request.data, dict):
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(_WRITES))
        return await super()._handle(request)


@pytest.fixture
async def api() -> AsyncIterator[tuple[kmock.KubernetesEmulator, str]]:
    """The mock API on a free loopback port, holding the base's cluster objects."""
    async with VersionedEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources[OMSCLUSTERS] = kmock.ResourceInfo(
            kind="OmsCluster",
            namespaced=True,
            subresources={"status"},
            verbs=VERBS,
        )
        for kind, resource in RESOURCES.items():
            emulator.resources[resource] = kmock.ResourceInfo(
                kind=kind, namespaced=True, verbs=VERBS
            )
        emulator.resources["v1/events"] = kmock.ResourceInfo(
            kind="Event", namespaced=True, verbs=VERBS
        )
        # kopf waits until namespaces and CRDs are discoverable, though its scanning is
        # off (handlers.started); kmock cannot list namespaces (/api/v1/namespaces).
        emulator.resources[NAMESPACES] = kmock.ResourceInfo(
            kind="Namespace", namespaced=False, verbs=VERBS
        )
        emulator.resources[CRDS] = kmock.ResourceInfo(
            kind="CustomResourceDefinition", namespaced=False, verbs=VERBS
        )
        for item in rendered("base"):
            metadata = item["metadata"]
            if item["kind"] in RESOURCES:
                key = (RESOURCES[item["kind"]], metadata.get("namespace", NAMESPACE))
                emulator.objects[(*key, metadata["name"])] = item
            elif item["kind"] in ("Namespace", "CustomResourceDefinition"):
                cluster_wide = NAMESPACES if item["kind"] == "Namespace" else CRDS
                emulator.objects[cluster_wide, None, metadata["name"]] = item
        yield emulator, str(server.url).rstrip("/")


@pytest.fixture
async def shards(
    tmp_path: Path, database_url: str, etcd_endpoints: tuple[str, ...]
) -> AsyncIterator[ShardedMesh]:
    """Shards of s1, s2 and s3 alone, each leading its own etcd log; no routing yet."""
    mesh = ShardedMesh.create(
        tmp_path / "mesh",
        database_url,
        etcd_endpoints,
        ("s1", "s2", "s3"),
        shard_environment={"OMS_SHARD_LOG": "etcd"},
    )
    try:
        await asyncio.to_thread(mesh.start, *(c.shard for c in mesh.clusters.values()))
        yield mesh
    finally:
        await asyncio.to_thread(mesh.stop)


@pytest.fixture
async def operator(
    tmp_path: Path, api: tuple[kmock.KubernetesEmulator, str], shards: ShardedMesh
) -> AsyncIterator[Path]:
    """`oms operator --namespace oms`, reaching the mock by a kubeconfig; its log."""
    _, url = api
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                "users": [{"name": "test", "user": {"token": "kmock-accepts-anything"}}],
                "contexts": [
                    {
                        "name": "kmock",
                        "context": {"cluster": "kmock", "user": "test", "namespace": NAMESPACE},
                    }
                ],
                "current-context": "kmock",
            }
        )
    )
    environment = {
        key: value for key, value in os.environ.items() if key != "KUBERNETES_SERVICE_HOST"
    }
    environment |= {
        "KUBECONFIG": str(kubeconfig),
        "OMS_ETCD_ENDPOINTS": ",".join(shards.etcd_endpoints),
        "OMS_MESH_ID": shards.mesh_id,
        "POD_NAMESPACE": NAMESPACE,
        "PYTHONPATH": str(ROOT),
    }
    log_path = tmp_path / "operator.log"
    log = log_path.open("w")  # a local file, opened once
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.command_line",
        "operator",
        "--namespace",
        NAMESPACE,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
        cwd=ROOT,
    )
    try:
        yield log_path
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


def _objects_of(emulator: kmock.KubernetesEmulator, cluster_id: str) -> dict[str, dict[str, Any]]:
    """The live objects labelled as `cluster_id`'s, by kind."""
    found: dict[str, dict[str, Any]] = {}
    kinds = {kmock.resource(resource): kind for kind, resource in RESOURCES.items()}
    for (resource, _, _), item in emulator.objects.items():
        kind = kinds.get(resource)
        if kind is None or item.deleted:
            continue
        raw: dict[str, Any] = dict(item.raw)
        if raw.get("metadata", {}).get("labels", {}).get(CLUSTER_LABEL) == cluster_id:
            assert kind not in found, (kind, cluster_id)
            found[kind] = raw
    return found


def _count(emulator: kmock.KubernetesEmulator) -> int:
    kinds = {kmock.resource(resource) for resource in RESOURCES.values()}
    items = emulator.objects.items()
    return sum(1 for (resource, _, _), item in items if resource in kinds and not item.deleted)


async def _cluster(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}{CLUSTER_PATH}/main") as reply:
        assert reply.status == 200, await reply.text()
        body: dict[str, Any] = await reply.json()
        return body


async def _patch_spec(session: aiohttp.ClientSession, url: str, spec: dict[str, Any]) -> None:
    async with session.patch(
        f"{url}{CLUSTER_PATH}/main",
        data=json.dumps({"spec": spec}),
        headers={"Content-Type": "application/merge-patch+json"},
    ) as reply:
        assert reply.status == 200, await reply.text()


async def _status_until(
    session: aiohttp.ClientSession,
    url: str,
    check: Callable[[dict[str, Any]], bool],
    log_path: Path,
) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = (await _cluster(session, url)).get("status", {})
        if check(status):
            return status
        await asyncio.sleep(0.2)
    output = await asyncio.to_thread(log_path.read_text)
    body = await _cluster(session, url)
    raise AssertionError(f"status not reached: {body}\n{output[-6000:]}")


async def _routing(mesh: ShardedMesh) -> RoutingDocument:
    async with EtcdSession(mesh.etcd_endpoints) as session:
        stored = await RoutingStore(session, mesh.mesh_id).read()
    assert stored is not None
    return stored.document


@pytest.mark.slow
async def test_the_operator_scales_pins_and_refuses_through_the_api(
    api: tuple[kmock.KubernetesEmulator, str], shards: ShardedMesh, operator: Path
) -> None:
    emulator, url = api
    template = _objects_of(emulator, "s1")
    assert sorted(template) == sorted(KINDS)
    untouched = {name: _objects_of(emulator, name) for name in ("s1", "s2")}
    objects_at_start = _count(emulator)
    spec: dict[str, Any] = {"shards": 2, "waveSize": 64, "quiesceSeconds": 1}
    async with aiohttp.ClientSession() as session:
        body = {
            "apiVersion": "oms.mesh.io/v1alpha1",
            "kind": "OmsCluster",
            "metadata": {"name": "main", "namespace": NAMESPACE},
            "spec": spec,
        }
        async with session.post(f"{url}{CLUSTER_PATH}", json=body) as reply:
            assert reply.status in (200, 201), await reply.text()

        # Created: the first routing document, two clusters, Ready.
        status = await _status_until(
            session, url, lambda s: s.get("phase") == "Ready" and s.get("shards") == 2, operator
        )
        assert [c["id"] for c in status["clusters"]] == ["s1", "s2"]
        assert status["epoch"] == (await _routing(shards)).epoch == 1
        assert not _objects_of(emulator, "s3")
        # s2's objects were there (the base's): nothing cloned over them, no litter.
        assert {name: _objects_of(emulator, name) for name in ("s1", "s2")} == untouched
        assert _count(emulator) == objects_at_start

        # Scaled out: s3's objects cloned from s1's through the API, then activated.
        await _patch_spec(session, url, {"shards": 3})
        status = await _status_until(
            session, url, lambda s: s.get("phase") == "Ready" and s.get("shards") == 3, operator
        )
        assert [c["id"] for c in status["clusters"]] == ["s1", "s2", "s3"]
        made = _objects_of(emulator, "s3")
        assert sorted(made) == sorted(KINDS), sorted(made)
        for kind, item in made.items():
            name = item["metadata"]["name"]
            assert "-s3" in name and "s1" not in name, (kind, name)
            assert "s1" not in json.dumps(item.get("spec", {})), (kind, item["spec"])
        # Every reference to the cluster's ConfigMap names the clone.
        config_map = made["ConfigMap"]["metadata"]["name"]
        references = set(
            re.findall(r'"name": "(shard-cluster[^"]*)"', json.dumps(made["StatefulSet"]))
        )
        assert references == {config_map}, (references, config_map)
        assert made["ConfigMap"]["data"]["OMS_SHARD_ID"] == "s3"
        assert made["ConfigMap"]["data"]["OMS_SHARD_SERVICE"] == "shard-s3"
        selector = made["StatefulSet"]["spec"]["selector"]["matchLabels"]
        assert selector[CLUSTER_LABEL] == "s3"
        assert made["StatefulSet"]["spec"]["template"]["metadata"]["labels"][CLUSTER_LABEL] == "s3"
        routing = await _routing(shards)
        assert [c.cluster_id for c in routing.clusters] == ["s1", "s2", "s3"]

        # A whale pinned to s2, then unpinned.
        await _patch_spec(session, url, {"pins": {str(WHALE): "s2"}})
        status = await _status_until(
            session, url, lambda s: s.get("pins") == {str(WHALE): "s2"}, operator
        )
        assert (await _routing(shards)).pins == {WHALE: "s2"}
        await _patch_spec(session, url, {"pins": None})
        status = await _status_until(
            session,
            url,
            lambda s: s.get("phase") == "Ready" and s.get("pins") == {},
            operator,
        )
        assert not (await _routing(shards)).pins

        # Scaled in: s3 removed from the routing, then its objects deleted; s1's and
        # s2's never touched.
        await _patch_spec(session, url, {"shards": 2})
        status = await _status_until(
            session, url, lambda s: s.get("phase") == "Ready" and s.get("shards") == 2, operator
        )
        assert [c.cluster_id for c in (await _routing(shards)).clusters] == ["s1", "s2"]
        assert not _objects_of(emulator, "s3")
        assert {name: _objects_of(emulator, name) for name in ("s1", "s2")} == untouched

        # A state-machine version asked for: every replicated group already at it or past
        # it (a new group starts at its newest), so nothing is logged and nothing is
        # lowered; the status lists each group's version.
        await _patch_spec(session, url, {"stateMachineVersion": 1})
        status = await _status_until(
            session,
            url,
            lambda s: s.get("phase") == "Ready" and "stateMachineVersions" in s,
            operator,
        )
        newest = {
            "shard": max(shard_versions.IMPLEMENTED_VERSIONS),
            "matcher": max(matcher_versions.IMPLEMENTED_VERSIONS),
        }
        for group, version in status["stateMachineVersions"].items():
            assert version == newest[group.split("/")[0]], status

        # Refused: a pin to a cluster the mesh does not have. The status says why; the
        # routing and the objects stay as they were.
        epoch = (await _routing(shards)).epoch
        await _patch_spec(session, url, {"pins": {str(WHALE): "s9"}})
        status = await _status_until(session, url, lambda s: s.get("phase") == "Failed", operator)
        assert "s9" in status["message"], status
        assert (await _routing(shards)).epoch == epoch
        assert not _objects_of(emulator, "s3")
        assert {name: _objects_of(emulator, name) for name in ("s1", "s2")} == untouched
