"""The audit of an operator's commands, written behind the shard (`admin_audit`).

The shard decides an operator's command (risk limits, trading halt, restart) at a
log position and leaves an `OperatorAudit` egress item; this writes it with the
batch's other rows and the cursor, in one transaction. Its key is its place in the
egress (shard, position, index among the audit items of that position), as a
ledger row's is, so a replayed position finds its rows already there. `at` is the
command's consensus time: when the shard decided, not when the row was written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from persister.store import Session
from protos.oms.v1 import shard_pb2

# The column's CHECK wants a name; a command sent straight to the shard has none.
UNNAMED_OPERATOR = "(unnamed)"

_INSERT = """
INSERT INTO admin_audit (at, actor, action, user_id, subject, detail, shard_id, position,
    item_index, accepted, reject_reason, note)
SELECT to_timestamp(a.time_ms / 1000.0), a.actor, a.action, a.user_id, '', a.detail::jsonb,
    $1::text, a.position, a.item_index, a.accepted, a.reject_reason, a.note
FROM unnest($2::bigint[], $3::integer[], $4::bigint[], $5::text[], $6::text[], $7::bigint[],
            $8::text[], $9::boolean[], $10::text[], $11::text[])
     AS a(position, item_index, time_ms, actor, action, user_id, detail, accepted,
          reject_reason, note)
ON CONFLICT (shard_id, position, item_index) WHERE shard_id IS NOT NULL DO NOTHING
RETURNING position
"""


@dataclass(frozen=True, slots=True)
class AuditRow:
    position: int
    item_index: int
    consensus_time_ms: int
    operator: str
    action: str
    user_id: int
    detail: str  # JSON text, canonical as the shard wrote it
    accepted: bool
    reject_reason: str  # a ShardRejectReason name, '' when accepted
    note: str

    @classmethod
    def from_egress(cls, item: shard_pb2.ShardEgress, item_index: int) -> AuditRow:
        audit = item.operator_audit
        reason = ""
        if audit.reject_reason:
            reason = shard_pb2.ShardRejectReason.Name(audit.reject_reason)
        return cls(
            item.stamp.position,
            item_index,
            item.stamp.consensus_time_ms,
            audit.operator or UNNAMED_OPERATOR,
            audit.action,
            audit.user_id,
            audit.detail or "{}",
            audit.accepted,
            reason,
            audit.note,
        )


async def insert_audit_rows(session: Session, rows: Sequence[AuditRow], shard_id: str) -> int:
    """Insert the rows; how many were already there (a replay of their positions)."""
    inserted = await session.fetch(
        _INSERT,
        shard_id,
        [r.position for r in rows],
        [r.item_index for r in rows],
        [r.consensus_time_ms for r in rows],
        [r.operator for r in rows],
        [r.action for r in rows],
        [r.user_id for r in rows],
        [r.detail for r in rows],
        [r.accepted for r in rows],
        [r.reject_reason for r in rows],
        [r.note for r in rows],
    )
    return len(rows) - len(inserted)
