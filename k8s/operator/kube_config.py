"""Where the operator finds the Kubernetes API: in a pod, its service account's
(in-cluster); elsewhere, the kubeconfig (`KUBECONFIG`, else `~/.kube/config`), as
kubectl would, and as kopf's own login does for its watches. So `oms operator` runs
in its Deployment, from a laptop against a cluster, or in the suite against an API
mock over HTTP (tests/k8s/test_operator_api.py)."""

from __future__ import annotations

import os

from kubernetes_asyncio import config

IN_CLUSTER = "KUBERNETES_SERVICE_HOST"  # set by the kubelet in every pod


async def load_kubernetes_config() -> None:
    """Configure kubernetes_asyncio's default client for this process."""
    if os.environ.get(IN_CLUSTER):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config()
