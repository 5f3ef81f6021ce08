"""The user shard: hot user actors on the deterministic replicated runtime.

`core` is the pure state machine (no I/O, clock or randomness). The service
layer around it (gRPC ingress, egress routing, metrics) wires it to the
runtime and converts egress with `core.codec`.
"""
