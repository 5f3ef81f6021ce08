"""The gateway's decisions, free of I/O: the refusal reasons and the statuses they
leave with, the checks of a client's request, requests as shard commands and shard
results as acks, and what to do when a shard answers NOT_OWNER.

Pure (an import contract and `tests/test_pure_cores.py` keep clocks, randomness,
gRPC and event loops out), so the seeded simulation runs the same code as the
gateway's handlers.
"""
