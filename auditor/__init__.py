"""The independent money auditor: `oms audit`.

It recomputes every user's balances from what entered and left the exchange
(deposits and withdrawals) and from the fills' prices, quantities and fees, with
its own arithmetic on the market catalog's published units, and compares them with
what the system says: PostgreSQL's double-entry ledger and stored balances, and
the admin API's answers (the shards' own, for resident users). It reads PostgreSQL
(one read-only snapshot) and the public API only, never a service's internals: an
import contract (`.importlinter`) keeps the shard, matcher, bridge, persister and
runtime packages, and the internal gRPC stubs, out of it.
"""
