"""Kubernetes: the manifests (`base/`, `overlays/`, `examples/`) and the operator
(`operator/`), which runs the wave controller's code for `OmsCluster` resources."""
