"""Accounts: creating users with their first API key, and reading credentials back.

A new user is a version-0 row whose state is an empty `UserState` carrying its
id, tier and risk limits; its first hydration starts from there. The API key id
is public (sent with every request); the secret is the HMAC key, generated from
`secrets` and shown once, in the answer to CreateUser.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from persister.store import Session, Store
from persister.user_rows import INT64_MAX, insert_user, next_user_id, skip_taken_user_ids
from protos.oms.v1 import persister_pb2, shard_pb2

API_KEY_PREFIX = "ak_"
MAX_ID_ATTEMPTS = 3
_TIERS = (shard_pb2.USER_TIER_NORMAL, shard_pb2.USER_TIER_WHALE)


class UserExistsError(LookupError):
    """The requested user id is taken."""


@dataclass(frozen=True, slots=True)
class CredentialRow:
    api_key: str
    user_id: int
    secret: str
    enabled: bool


def new_user_problem(request: persister_pb2.NewUser) -> str:
    """Why CreateUser refuses this request, or ''."""
    if request.user_id > INT64_MAX:
        return f"user_id {request.user_id} does not fit a signed 64-bit integer"
    if request.tier not in (shard_pb2.USER_TIER_UNSPECIFIED, *_TIERS):
        return f"unknown tier {request.tier}"
    limits = request.risk_limits
    for name in (
        "max_order_notional",
        "max_position_lots",
        "max_open_orders",
        "price_band_bps",
        "max_drawdown",
    ):
        if getattr(limits, name) < 0:
            return f"risk_limits.{name} must be >= 0 (0 = no limit)"
    return ""


async def create_user(store: Store, request: persister_pb2.NewUser) -> persister_pb2.CreatedUser:
    """Insert the user and its first key in one transaction (UserExistsError if taken)."""
    api_key = API_KEY_PREFIX + secrets.token_hex(16)
    secret = secrets.token_urlsafe(32)
    async with store.transaction() as session:
        user_id = await _insert(session, request)
        await session.execute(
            "INSERT INTO api_keys (api_key, user_id, secret) VALUES ($1, $2, $3)",
            api_key,
            user_id,
            secret,
        )
    return persister_pb2.CreatedUser(user_id=user_id, api_key=api_key, api_secret=secret)


async def _insert(session: Session, request: persister_pb2.NewUser) -> int:
    for _ in range(MAX_ID_ATTEMPTS):
        user_id = request.user_id or await next_user_id(session)
        state = shard_pb2.UserState(
            user_id=user_id,
            db_version=0,
            tier=request.tier or shard_pb2.USER_TIER_NORMAL,
            risk_limits=request.risk_limits,
        )
        if await insert_user(session, state):
            return user_id
        if request.user_id:
            raise UserExistsError(f"user {user_id} exists")
        # The sequence handed out an id a caller had chosen: move past all of those.
        await skip_taken_user_ids(session)
    raise UserExistsError("no free user id after moving the id sequence")


async def read_credential(session: Session, api_key: str) -> CredentialRow | None:
    row = await session.fetchrow(
        "SELECT api_key, user_id, secret, enabled FROM api_keys WHERE api_key = $1", api_key
    )
    if row is None:
        return None
    return CredentialRow(row["api_key"], row["user_id"], row["secret"], row["enabled"])
