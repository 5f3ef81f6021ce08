"""The simulated mesh: deterministic for a seed (no wall clock, no threads, no I/O).

The real state machines (`ShardMachine`, `MatcherMachine`) run inside the real replica
runtime (`Replica`, `LogBatch` records with their checksums, checkpoint hashes); the
real codecs and the bridge's conversions carry their messages. etcd, PostgreSQL, the
links, the persister, the bridge's loops and the clients are models (`etcd_model`,
`store_model`, `links`, `persister_model`, `bridge_model`, `clients`), each driven by
one `Scheduler` and one `random.Random(seed)`.
"""
