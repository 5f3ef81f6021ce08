"""The shard's state-machine versions: the rule sets this build can decide under.

Version 1 is every decision the shard has made since replicas first compared state
hashes. A change to what the machine decides from the same log (a new refusal, a
changed rounding, a field its state hash covers) is a new version: the new rule is
written behind `state.machine_version >= N`, the old one kept, N added here, and the
group switches at the VERSION entry `oms upgrade activate` logs once every replica
runs a build that implements N (README, "Upgrades"). A change that decides nothing
differently (a faster structure, a log line, a new metric) needs no version.

Version 2: a user's tombstone keeps its last matcher event sequence per group when it
left the shard (evicted, or moved to another shard by routing), and a hydration gives
them back to the actor; a reconcile report for a user who is not resident, whose
snapshot is older than the last of those events, is stale (`reconciles_stale`), no
longer an impossible state raised as a risk alert (`reconcile.py`). Found by
`oms sim` (seeds 195 and 508 of a 1,000-seed run): a report delayed while the user's
order was cancelled and the user moved away alerted a person for nothing. The
tombstones' sequences are in the state hash and in the snapshot (layout 8).

Version 3: `CancelAllOrders` (the `cancel_all` command) cancels every live order of a
user, or of one symbol, in one command (`OrderSaga.cancel_all`); `CancelAllAfter` (the
`cancel_all_after` command) arms a user's dead man's switch, fired by the timer entries
(`OrderSaga.fire_switches`); `KeepSession` and `EndSession` hold a user's
cancel-on-disconnect sessions, whose orders (placed with their `session_id`) are
cancelled when a session expires on the timer or ends uncleanly
(`OrderSaga.expire_sessions`, `end_session`). Before version 3 these commands are
refused MALFORMED and a place's `session_id` is ignored, as a build that does not know
them decides. A switch and sessions are in the actor's plain data (so in the state hash
and the snapshot) only while present, and an order's session only when it has one,
which never happens before version 3: the hashes and snapshots of versions 1 and 2 are
unchanged.
"""

from __future__ import annotations

IMPLEMENTED_VERSIONS: frozenset[int] = frozenset({1, 2, 3})
