"""The persister: one per user shard, the only writer of PostgreSQL.

Reading order: `running.py` (start-up), `service.py` (the parts and their loops),
`egress_follower.py` (the shard's egress in), `write_behind.py` with
`order_rows.py`, `trade_rows.py`, `flushes.py`, `cursor.py` (what gets written,
in which transaction), `hydration_reads.py` and `dedup_reads.py` (what gets read),
`grpc_api.py` (oms.v1.Persister), `store.py` (the only asyncpg importer) and
`migrations/` (the schema).
"""
