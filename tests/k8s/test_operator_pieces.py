"""The operator's pure parts, offline: a new cluster's objects cloned from s1's in the
rendered base (valid, strictly, against the Kubernetes schemas, and naming s3
everywhere s1's named s1), and an OmsCluster spec read or refused with why."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from k8s.operator.cluster_objects import (
    CLUSTER_LABEL,
    ClusterTemplateError,
    cloned_cluster_objects,
    cluster_objects,
)
from k8s.operator.mesh_spec import MeshSpec, OmsClusterSpecError
from tests.k8s.test_manifests import PROBES, rendered


def test_a_clone_of_s1_is_a_valid_cluster_s3_that_names_s1_nowhere() -> None:
    base = rendered("base")
    clones = cloned_cluster_objects(base, "s1", "s3")
    version = kubernetes_validate.utils.latest_version()
    for item in clones:
        kubernetes_validate.validate(item, version, strict=True)
        assert item["metadata"]["labels"][CLUSTER_LABEL] == "s3"
    assert [item["kind"] for item in clones] == [
        "ConfigMap",
        "Service",
        "PodDisruptionBudget",
        "StatefulSet",
    ]
    text = json.dumps(clones)
    assert "shard-s1" not in text and '"s1"' not in text
    config, service, budget, workload = clones
    assert config["metadata"]["name"] == "shard-cluster-s3"
    assert config["data"] == {"OMS_SHARD_ID": "s3", "OMS_SHARD_SERVICE": "shard-s3"}
    assert service["metadata"]["name"] == workload["spec"]["serviceName"] == "shard-s3"
    assert workload["metadata"]["name"] == budget["metadata"]["name"] == "shard-s3"
    labels = workload["spec"]["template"]["metadata"]["labels"]
    for selector in (
        workload["spec"]["selector"]["matchLabels"],
        budget["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"],
    ):
        assert selector[CLUSTER_LABEL] == "s3" and selector.items() <= labels.items()
    for container in workload["spec"]["template"]["spec"]["containers"]:
        for variable in container.get("env", []):
            reference = variable.get("valueFrom", {}).get("configMapKeyRef")
            if reference:
                assert reference["name"] == "shard-cluster-s3"
    # s1's objects are untouched, and the clone's pods are not s1's or s2's.
    (original,) = [i for i in cluster_objects(base, "s1") if i["kind"] == "StatefulSet"]
    assert original["spec"]["selector"]["matchLabels"][CLUSTER_LABEL] == "s1"
    # Everything else of the pod is s1's as it is: its ports (the services' and their
    # health-only ones), probes, certificates' Secrets and where they are mounted.
    pod, source_pod = workload["spec"]["template"]["spec"], original["spec"]["template"]["spec"]
    assert pod["volumes"] == source_pod["volumes"]
    for container, source in zip(pod["containers"], source_pod["containers"], strict=True):
        for field in ("args", "ports", "volumeMounts", *PROBES):
            assert container.get(field) == source.get(field), (container["name"], field)
        plain = {e["name"]: e.get("value") for e in container["env"] if "value" in e}
        assert plain == {e["name"]: e.get("value") for e in source["env"] if "value" in e}


def test_a_source_that_is_not_a_whole_cluster_is_refused() -> None:
    partial = [item for item in rendered("base") if item["kind"] != "PodDisruptionBudget"]
    with pytest.raises(ClusterTemplateError, match="PodDisruptionBudget"):
        cloned_cluster_objects(partial, "s1", "s3")
    with pytest.raises(ClusterTemplateError, match="nothing"):
        cloned_cluster_objects(rendered("base"), "s7", "s8")


def test_a_spec_is_read_with_its_defaults() -> None:
    spec = MeshSpec.of({"shards": 3, "pins": {"42": "s3", "7": "s1"}})
    assert spec.clusters == ("s1", "s2", "s3")
    assert list(spec.pins.items()) == [(7, "s1"), (42, "s3")]
    assert (spec.wave_size, spec.quiesce_s) == (64, 10.0)
    assert spec.state_machine_version is None  # the groups' versions left as they are
    assert MeshSpec.of({"shards": 1, "stateMachineVersion": 2}).state_machine_version == 2


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.shards"),
        ({"shards": 0}, "spec.shards"),
        ({"shards": True}, "spec.shards"),
        ({"shards": 2, "pins": {"x": "s1"}}, "spec.pins"),
        ({"shards": 2, "pins": {"0": "s1"}}, "spec.pins"),
        ({"shards": 2, "pins": {"5": "s3"}}, "spec.pins"),
        ({"shards": 2, "pins": ["5"]}, "spec.pins"),
        ({"shards": 2, "waveSize": 0}, "spec.waveSize"),
        ({"shards": 2, "quiesceSeconds": 10_000}, "spec.quiesceSeconds"),
        ({"shards": 2, "stateMachineVersion": 0}, "spec.stateMachineVersion"),
        ({"shards": 2, "stateMachineVersion": "2"}, "spec.stateMachineVersion"),
    ],
)
def test_a_spec_that_cannot_be_done_is_refused_naming_its_field(
    spec: dict[str, object], field: str
) -> None:
    with pytest.raises(OmsClusterSpecError, match=field.replace(".", r"\.")):
        MeshSpec.of(spec)
