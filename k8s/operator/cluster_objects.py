"""A new user-shard cluster's Kubernetes objects, cloned from an existing cluster's.

The base (`k8s/base/shard-cluster/`) deploys s1 and s2; a cluster the OmsCluster asks
for beyond them is a copy of the lowest one's StatefulSet, headless Service, budget
and ConfigMap, with the cluster's id in every place that names it: the objects'
names (`shard-s1` -> `shard-s3`), the `oms.mesh.io/cluster` label (metadata,
selectors, the pod template, affinity), the ConfigMap's `OMS_SHARD_ID` and
`OMS_SHARD_SERVICE` and every reference to the ConfigMap. What the API server added
(uid, resourceVersion, status, ...) is dropped. Pure: dicts in, dicts out.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

CLUSTER_LABEL = "oms.mesh.io/cluster"
KINDS = ("ConfigMap", "Service", "PodDisruptionBudget", "StatefulSet")
SERVER_FIELDS = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "ownerReferences",
)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
Manifest = dict[str, Any]


class ClusterTemplateError(ValueError):
    """The source cluster's objects are not what a cluster is made of."""


def cluster_objects(objects: Iterable[Mapping[str, Any]], cluster_id: str) -> list[Manifest]:
    """The objects labelled as `cluster_id`'s, in `KINDS` order."""
    chosen = [
        copy.deepcopy(dict(item))
        for item in objects
        if item.get("metadata", {}).get("labels", {}).get(CLUSTER_LABEL) == cluster_id
        and item.get("kind") in KINDS
    ]
    return sorted(chosen, key=lambda item: KINDS.index(item["kind"]))


def cloned_cluster_objects(
    objects: Iterable[Mapping[str, Any]], source: str, target: str
) -> list[Manifest]:
    """`target`'s objects, made from `source`'s (see the module's docstring)."""
    chosen = cluster_objects(objects, source)
    found = sorted({item["kind"] for item in chosen})
    if found != sorted(KINDS):
        raise ClusterTemplateError(
            f"cluster {source}: found {', '.join(found) or 'nothing'}, "
            f"expected one each of {', '.join(KINDS)}"
        )
    names = {item["metadata"]["name"]: _renamed(item, source, target) for item in chosen}
    clones = []
    for item in chosen:
        clone = _replaced(item, names)
        metadata = clone["metadata"]
        for server_field in SERVER_FIELDS:
            metadata.pop(server_field, None)
        metadata.get("annotations", {}).pop(LAST_APPLIED, None)
        if not metadata.get("annotations"):
            metadata.pop("annotations", None)
        clone.pop("status", None)
        _relabel(clone, source, target)
        if clone["kind"] == "ConfigMap":
            # OMS_SHARD_SERVICE named the source's Service: renamed with the names.
            clone.setdefault("data", {})["OMS_SHARD_ID"] = target
        if clone["kind"] == "Service":
            clone["spec"].pop("clusterIPs", None)
        clones.append(clone)
    return clones


def _renamed(item: Mapping[str, Any], source: str, target: str) -> str:
    name: str = item["metadata"]["name"]
    if item["kind"] == "ConfigMap":
        # A generated ConfigMap's name carries a hash of its content: the clone's
        # content differs, and the operator owns it, so it goes without one.
        return f"shard-cluster-{target}"
    marker = f"-{source}"
    if not name.endswith(marker):
        raise ClusterTemplateError(f"{item['kind']} {name}: not named after cluster {source}")
    return name[: -len(marker)] + f"-{target}"


def _replaced(value: Any, names: Mapping[str, str]) -> Any:
    """`value` with every string that is one of the source objects' names renamed."""
    if isinstance(value, dict):
        return {key: _replaced(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [_replaced(item, names) for item in value]
    if isinstance(value, str):
        return names.get(value, value)
    return value


def _relabel(value: Any, source: str, target: str) -> None:
    """Every `oms.mesh.io/cluster: source` label or selector term becomes `target`."""
    if isinstance(value, dict):
        if value.get(CLUSTER_LABEL) == source:
            value[CLUSTER_LABEL] = target
        for item in value.values():
            _relabel(item, source, target)
    elif isinstance(value, list):
        for item in value:
            _relabel(item, source, target)
