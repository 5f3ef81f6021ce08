"""What an operator reads from PostgreSQL: users page by page, and the admin audit.

Both page on a key (user id ascending; audit id descending, newest first) and fetch
one row past the page to say whether there is `more`, so a page is one index scan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from persister.store import Row, Session
from persister.user_rows import INT64_MAX, UserRow, stored_state
from protos.oms.v1 import persister_pb2

DEFAULT_PAGE = 100
MAX_PAGE = 1_000

_USERS = """
SELECT user_id, version, state, flush_epoch FROM users
WHERE user_id > $1 ORDER BY user_id LIMIT $2
"""
_AUDIT = """
SELECT audit_id, (extract(epoch FROM at) * 1000)::bigint AS at_ms, actor, action,
    coalesce(user_id, 0) AS user_id, subject, detail::text AS detail,
    coalesce(shard_id, '') AS shard_id, coalesce(position, 0) AS position, accepted,
    reject_reason, note
FROM admin_audit
WHERE ($1::bigint = 0 OR user_id = $1::bigint) AND ($2::bigint = 0 OR audit_id < $2::bigint)
ORDER BY audit_id DESC LIMIT $3
"""


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[Row]
    more: bool


def page_size(limit: int) -> int | None:
    """The rows a page holds, or None when `limit` is out of range."""
    if limit == 0:
        return DEFAULT_PAGE
    return limit if limit <= MAX_PAGE else None


def key_problem(value: int, name: str) -> str:
    return f"{name} does not fit a signed 64-bit integer" if value > INT64_MAX else ""


async def read_user_page(session: Session, after_user_id: int, size: int) -> Page:
    rows = await session.fetch(_USERS, after_user_id, size + 1)
    return Page(list(rows[:size]), len(rows) > size)


def stored_user(row: Row) -> persister_pb2.StoredUser:
    user = UserRow(row["user_id"], row["version"], row["state"], row["flush_epoch"])
    return persister_pb2.StoredUser(known=True, state=stored_state(user))


async def read_audit_page(session: Session, user_id: int, before_audit_id: int, size: int) -> Page:
    rows = await session.fetch(_AUDIT, user_id, before_audit_id, size + 1)
    return Page(list(rows[:size]), len(rows) > size)


def audit_row(row: Row) -> persister_pb2.AdminAuditRow:
    # jsonb text is not canonical (spaces after separators): give it canonical again.
    detail = json.dumps(json.loads(row["detail"]), sort_keys=True, separators=(",", ":"))
    return persister_pb2.AdminAuditRow(
        audit_id=row["audit_id"],
        at_ms=row["at_ms"],
        actor=row["actor"],
        action=row["action"],
        user_id=row["user_id"],
        subject=row["subject"],
        detail=detail,
        shard_id=row["shard_id"],
        position=row["position"],
        accepted=row["accepted"],
        reject_reason=row["reject_reason"],
        note=row["note"],
    )
