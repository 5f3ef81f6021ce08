"""The state hash, kept incremental so it can run every K entries with a million users.

Each actor contributes a 64-bit digest of its plain data; the shard keeps the
sum of those digests mod 2^64 (a set-hash: order-independent, updatable by
subtracting the old term and adding the new one). Actors changed since the
last hash sit on a dirty list and only they are re-digested; an evicted actor
subtracts its term when it leaves. The recency order is covered without
walking it: every move in that order stamps the actor with a fresh sequence
number, which is part of its digest.

The shard-level part (accounts, matcher sequences, marks, Bloom filter
digests, pending hydrations, deferred reconciles, counts) is small or bounded.
Statistics counters are left out on purpose (see `statistics`).
"""

from __future__ import annotations

import hashlib
import marshal
from typing import Any

from services.shard.core.actor import UserActor
from services.shard.core.shard_state import ShardState
from services.shard.core.snapshot import actor_plain, item_plain, reconcile_plain

_MASK64 = (1 << 64) - 1
_ACTOR_PERSON = b"oms-shard-actor"
_SHARD_PERSON = b"oms-shard-state"


def actor_digest(actor: UserActor) -> int:
    # marshal format version 2 writes values only: no back-references (they arrive
    # with version 3) and no "interned" string flag, so equal plain data gives
    # equal bytes on every replica. It is five times faster than repr here.
    encoded = marshal.dumps(actor_plain(actor), 2)
    digest = hashlib.blake2b(encoded, digest_size=8, person=_ACTOR_PERSON).digest()
    return int.from_bytes(digest, "little")


def refresh(state: ShardState) -> None:
    """Re-digest the dirty actors that are still resident."""
    total = state.digest_sum
    actors = state.actors
    for actor in state.dirty:
        actor.dirty = False
        if actors.get(actor.user_id) is not actor:
            continue  # evicted since: its term already left the sum
        new = actor_digest(actor)
        total += new - actor.digest
        actor.digest = new
    state.dirty = []
    state.digest_sum = total & _MASK64


def state_hash(state: ShardState) -> bytes:
    refresh(state)
    shard_part: tuple[Any, ...] = (
        len(state.actors),
        state.digest_sum,
        state.dehydrating,
        state.quarantined,
        state.halted,
        state.epoch_counter,
        state.recency_counter,
        state.now_ms,
        state.parked_client_commands,
        state.accounts.plain(),
        tuple(state.sequences.items()),
        tuple(state.marks.items()),
        state.dedup.digest_terms(),
        len(state.tombstones),
        state.tombstone_sum,
        len(state.pending_submits),
        len(state.pending_cancels),
        len(state.dedup_waits),
        tuple(
            (
                user_id,
                pending.epoch,
                pending.requested_at_ms,
                pending.client_commands,
                tuple(item_plain(item) for item in pending.parked),
            )
            for user_id, pending in state.hydrations.items()
        ),
        tuple(reconcile_plain(report) for report in state.deferred_reconciles),
        state.routing_raw,
        state.persisted_through,
    )
    if state.machine_version > 1:
        # Only past version 1, so a build from before versions hashes version 1 alike
        # and the release that brought them could be rolled in replica by replica.
        shard_part = (
            *shard_part,
            state.machine_version,
            len(state.tombstone_events),
            state.tombstone_event_sum,
        )
    return hashlib.blake2b(
        state.settings.fingerprint() + repr(shard_part).encode(),
        digest_size=32,
        person=_SHARD_PERSON,
    ).digest()
