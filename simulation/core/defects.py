"""Defects a run can plant on purpose, to show that the simulation catches them.

Each is a one-line departure from a rule the real services keep; a simulation that
passes with one planted is too weak to trust. `tests/simulation/` requires each to
be found (and shrunk) within a fixed set of seeds.
"""

from __future__ import annotations

# The persister takes a commit of unknown outcome as committed, without reading the
# cursor back: a batch that was not written is skipped (rows lost).
PERSISTER_TRUSTS_UNKNOWN = "persister-trusts-unknown"
# A replica restores the newest snapshot file without checking its checksum.
UNCHECKED_SNAPSHOTS = "unchecked-snapshots"
# The leader applies a record and releases its egress before its fenced append: a
# zombie leader acknowledges orders the log never gets.
ACK_BEFORE_APPEND = "ack-before-append"
# The bridge does not re-drive the sagas in flight when it reconnects (GetInFlight
# ignored): orders sent to a leader that died are never matched nor released.
BRIDGE_FORGETS_IN_FLIGHT = "bridge-forgets-in-flight"

# Shard replicas ignore the persister's cursor (the egress floor): they keep only the
# newest snapshots and restart from the newest, as before `snapshot_policy.py`. With
# PostgreSQL down, a replica restarted into leadership cannot give the persister the
# rows after its cursor (the egress gap that `oms sim --seed 80` found).
IGNORES_EGRESS_FLOOR = "ignores-egress-floor"

# The wave controller lands users (a move, a wave, a cut-over) as soon as their old
# owner has logged the transit epoch, without waiting for it to let them go: the new
# owner hydrates a user the old one still holds (two writers of its money).
LANDS_BEFORE_LETTING_GO = "lands-before-letting-go"

# A shard or matcher leader takes an append etcd did not answer (quorum lost) as
# appended: it applies the record and acknowledges its commands. When the append did
# not commit, what it acknowledged is not in the log.
TRUSTS_UNANSWERED_APPEND = "trusts-unanswered-append"

# The admin API sends an operator's controls without a request id or a control version
# (as before `operator_controls.py` checked them): a late copy of a halt is decided
# after the resume that followed it (the late halt seed 852 found, as the simulation
# ran before its watches were modelled).
OPERATOR_UNPINNED = "operator-unpinned"

# A follower whose watch broke or was compacted watches again from the revision after
# the last change it saw, without reading the range first (as `LogFollower` does):
# once a compaction has passed that revision, etcd refuses the watch every time and
# the follower never catches up.
FOLLOWER_RESUMES_WATCH = "follower-resumes-watch"

# The matcher's book updates leave out the levels that went away (`total_lots == 0`):
# a consumer's book keeps levels the engine no longer has, and soon looks crossed.
FEED_OMITS_REMOVED_LEVELS = "feed-omits-removed-levels"

# The gateway sends a cancel-all without the symbol the client named: a cancel of one
# symbol's orders cancels every symbol's (orders the trader meant to keep).
CANCEL_ALL_IGNORES_SYMBOL = "cancel-all-ignores-symbol"

DEFECTS: tuple[str, ...] = (
    ACK_BEFORE_APPEND,
    BRIDGE_FORGETS_IN_FLIGHT,
    CANCEL_ALL_IGNORES_SYMBOL,
    FEED_OMITS_REMOVED_LEVELS,
    FOLLOWER_RESUMES_WATCH,
    IGNORES_EGRESS_FLOOR,
    LANDS_BEFORE_LETTING_GO,
    OPERATOR_UNPINNED,
    PERSISTER_TRUSTS_UNKNOWN,
    TRUSTS_UNANSWERED_APPEND,
    UNCHECKED_SNAPSHOTS,
)
