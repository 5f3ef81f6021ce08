"""The matcher: symbol-sharded matching engine, a replicated state machine.

`core` is the pure part (books, matching, dedup, events, snapshots); the service
that serves `oms.v1.Matcher` over gRPC wraps it with the shared runtime.
"""
