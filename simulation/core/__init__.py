"""The simulated mesh: deterministic for a seed (no wall clock, no threads, no I/O).

The real state machines (`ShardMachine`, `MatcherMachine`) run inside the real replica
runtime (`Replica`, `LogBatch` records with their checksums, checkpoint hashes); the
real codecs, the bridge's conversions, the reconciler's rules, the routing changes and
the wave controller's choice of movers carry and decide what they do in the services.
etcd, PostgreSQL, the snapshot disks, the links, the loops of the replicated host,
bridge, persister, reconciler and wave controller, the operator and the clients are
models (`etcd_model`, `store_model`, `replica_disk`, `links`, `replica_node`,
`bridge_model`, `persister_model`, `reconciler_model`, `routing_model`,
`operator_model`, `clients`), each driven by one `Scheduler` and one
`random.Random(seed)`.
"""
