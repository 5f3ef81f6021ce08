"""Accounts: creating users with their first API key.

A new user is a version-0 row whose state is an empty `UserState` carrying its
id, tier and risk limits; its first hydration starts from there. Its first key is
an HMAC key with every scope (`api_keys.py`): the id is public (sent with every
request); the secret is shown once, in the answer to CreateUser, and stored sealed.
"""

from __future__ import annotations

from persister.api_keys import ALL_SCOPES, HMAC, NewKey, insert_key
from persister.secret_seal import MasterKey
from persister.store import Session, Store
from persister.user_rows import INT64_MAX, insert_user, next_user_id, skip_taken_user_ids
from protos.oms.v1 import persister_pb2, shard_pb2

MAX_ID_ATTEMPTS = 3
_TIERS = (shard_pb2.USER_TIER_NORMAL, shard_pb2.USER_TIER_WHALE)


class UserExistsError(LookupError):
    """The requested user id is taken."""


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


async def create_user(
    store: Store, master: MasterKey, request: persister_pb2.NewUser, *, actor: str = "unknown"
) -> persister_pb2.CreatedUser:
    """Insert the user and its first key in one transaction (UserExistsError if taken)."""
    async with store.transaction() as session:
        user_id = await _insert(session, request)
        first = NewKey(user_id, HMAC, b"", ALL_SCOPES, 0, "first key", actor)
        info, secret = await insert_key(session, master, first)
    return persister_pb2.CreatedUser(user_id=user_id, api_key=info.api_key, api_secret=secret)


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
