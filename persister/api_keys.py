"""API keys in PostgreSQL: several per user, HMAC or Ed25519, scoped, expiring, revocable.

The key id is public (`ak_` and 32 hex digits, sent with every request). An HMAC
key's secret is generated here from `secrets`, returned once (to the admin call
that made it) and stored sealed under the master key (`secret_seal.py`); GetCredential
unseals it for the gateways, over the mesh's mutual TLS. An Ed25519 key stores the
user's public key only. A revocation sets `revoked_at` and clears `enabled` and is
never undone; a rotation makes a key like the old one and revokes the old one in the
same transaction. Every change writes its `admin_audit` row in its own transaction,
so there is no change without its audit row, nor a row for a change that failed.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from persister.secret_seal import MasterKey, SealError, key_id_of
from persister.store import Row, Session, Store
from persister.user_rows import INT64_MAX
from protos.oms.v1 import common_pb2, persister_pb2

API_KEY_PREFIX = "ak_"
MAX_LABEL_CHARACTERS = 64
ED25519_PUBLIC_KEY_BYTES = 32
MAX_EXPIRY_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z: what timestamptz holds for us

HMAC = "hmac"
ED25519 = "ed25519"
_KINDS = {common_pb2.API_KEY_KIND_HMAC: HMAC, common_pb2.API_KEY_KIND_ED25519: ED25519}
_KIND_VALUES = {text: value for value, text in _KINDS.items()}
_SCOPES = {common_pb2.API_KEY_SCOPE_READ: "read", common_pb2.API_KEY_SCOPE_TRADE: "trade"}
_SCOPE_VALUES = {text: value for value, text in _SCOPES.items()}
ALL_SCOPES = ("read", "trade")

_COLUMNS = """api_key, user_id, kind, secret, sealed_secret, public_key, scopes, enabled,
    label, (extract(epoch FROM expires_at) * 1000)::bigint AS expires_at_ms,
    (extract(epoch FROM created_at) * 1000)::bigint AS created_at_ms,
    (extract(epoch FROM revoked_at) * 1000)::bigint AS revoked_at_ms"""


class UnknownKeyError(LookupError):
    """No such API key."""


class UnknownUserError(LookupError):
    """No such user."""


class KeyRevokedError(ValueError):
    """The key was revoked: it cannot be rotated."""


@dataclass(frozen=True, slots=True)
class NewKey:
    user_id: int
    kind: str
    public_key: bytes
    scopes: tuple[str, ...]
    expires_at_ms: int
    label: str
    actor: str


def new_key_problem(
    kind: int, public_key: bytes, scopes: Sequence[int], expires_at_ms: int, label: str
) -> str:
    """Why a key with these fields cannot be made, or ''."""
    if kind not in _KINDS:
        return "kind must be API_KEY_KIND_HMAC or API_KEY_KIND_ED25519"
    if kind == common_pb2.API_KEY_KIND_ED25519 and len(public_key) != ED25519_PUBLIC_KEY_BYTES:
        return f"public_key must be the raw {ED25519_PUBLIC_KEY_BYTES}-byte Ed25519 public key"
    if kind == common_pb2.API_KEY_KIND_HMAC and public_key:
        return "public_key is for Ed25519 keys only"
    if not scopes or any(scope not in _SCOPES for scope in scopes):
        return "scopes must name API_KEY_SCOPE_READ and/or API_KEY_SCOPE_TRADE"
    if expires_at_ms > MAX_EXPIRY_MS:
        return "expires_at_ms is past 9999-12-31"
    if len(label) > MAX_LABEL_CHARACTERS or not label.isprintable():
        return f"label must be at most {MAX_LABEL_CHARACTERS} printable characters"
    return ""


def new_key_of(request: persister_pb2.NewApiKey) -> NewKey:
    """A checked request (`new_key_problem` said '') as the row's values."""
    return NewKey(
        user_id=request.user_id,
        kind=_KINDS[request.kind],
        public_key=bytes(request.public_key),
        scopes=tuple(sorted({_SCOPES[scope] for scope in request.scopes})),
        expires_at_ms=request.expires_at_ms,
        label=request.label,
        actor=request.actor or "unknown",
    )


async def insert_key(
    session: Session, master: MasterKey, key: NewKey, *, audit_action: str = "api_key.create"
) -> tuple[persister_pb2.ApiKeyInfo, str]:
    """Insert a key and its audit row; the key's description and, for HMAC, its secret."""
    api_key = API_KEY_PREFIX + secrets.token_hex(16)
    secret = secrets.token_urlsafe(32) if key.kind == HMAC else ""
    row = await session.fetchrow(
        f"""INSERT INTO api_keys (api_key, user_id, kind, sealed_secret, public_key, scopes,
                expires_at, label, created_by)
            VALUES ($1, $2, $3, $4, $5, $6,
                CASE WHEN $7::bigint > 0 THEN to_timestamp($7::bigint / 1000.0) END, $8, $9)
            RETURNING {_COLUMNS}""",
        api_key,
        key.user_id,
        key.kind,
        master.seal(api_key, secret) if key.kind == HMAC else None,
        key.public_key if key.kind == ED25519 else None,
        list(key.scopes),
        key.expires_at_ms,
        key.label,
        key.actor,
    )
    assert row is not None
    info = key_info(row)
    await audit(
        session,
        actor=key.actor,
        action=audit_action,
        user_id=key.user_id,
        subject=api_key,
        detail={"kind": key.kind, "scopes": list(key.scopes), "expires_at_ms": key.expires_at_ms},
    )
    return info, secret


async def audit(
    session: Session,
    *,
    actor: str,
    action: str,
    user_id: int | None,
    subject: str = "",
    detail: dict[str, object] | None = None,
) -> None:
    await session.execute(
        """INSERT INTO admin_audit (actor, action, user_id, subject, detail)
           VALUES ($1, $2, $3, $4, $5::jsonb)""",
        actor,
        action,
        user_id,
        subject,
        json.dumps(detail or {}, sort_keys=True),
    )


def key_info(row: Row) -> persister_pb2.ApiKeyInfo:
    return persister_pb2.ApiKeyInfo(
        api_key=row["api_key"],
        user_id=row["user_id"],
        kind=_KIND_VALUES[row["kind"]],
        scopes=[_SCOPE_VALUES[scope] for scope in row["scopes"]],
        expires_at_ms=row["expires_at_ms"] or 0,
        created_at_ms=row["created_at_ms"] or 0,
        revoked_at_ms=row["revoked_at_ms"] or 0,
        label=row["label"],
        public_key=bytes(row["public_key"] or b""),
    )


async def create_api_key(
    store: Store, master: MasterKey, key: NewKey
) -> persister_pb2.CreatedApiKey:
    async with store.transaction() as session:
        known = await session.fetchval("SELECT 1 FROM users WHERE user_id = $1", key.user_id)
        if known is None:
            raise UnknownUserError(f"user {key.user_id} does not exist")
        info, secret = await insert_key(session, master, key)
    return persister_pb2.CreatedApiKey(key=info, api_secret=secret)


async def list_api_keys(store: Store, user_id: int) -> persister_pb2.ApiKeyList:
    if not 0 < user_id <= INT64_MAX:
        return persister_pb2.ApiKeyList()
    async with store.session() as session:
        rows = await session.fetch(
            f"SELECT {_COLUMNS} FROM api_keys WHERE user_id = $1 ORDER BY created_at, api_key",
            user_id,
        )
    return persister_pb2.ApiKeyList(keys=[key_info(row) for row in rows])


async def revoke_api_key(store: Store, api_key: str, actor: str) -> persister_pb2.ApiKeyInfo:
    """Revoke the key (once: a key revoked before is answered as it is)."""
    async with store.transaction() as session:
        row = await session.fetchrow(
            f"""UPDATE api_keys SET revoked_at = now(), enabled = false, revoked_by = $2
                WHERE api_key = $1 AND revoked_at IS NULL RETURNING {_COLUMNS}""",
            api_key,
            actor or "unknown",
        )
        if row is not None:
            await audit(
                session,
                actor=actor or "unknown",
                action="api_key.revoke",
                user_id=row["user_id"],
                subject=api_key,
            )
            return key_info(row)
        row = await session.fetchrow(f"SELECT {_COLUMNS} FROM api_keys WHERE api_key = $1", api_key)
    if row is None:
        raise UnknownKeyError(f"unknown api key {api_key}")
    return key_info(row)


async def rotate_api_key(
    store: Store, master: MasterKey, api_key: str, public_key: bytes, actor: str
) -> persister_pb2.CreatedApiKey:
    """A key like `api_key` (its user, kind, scopes, expiry, label), `api_key` revoked."""
    actor = actor or "unknown"
    async with store.transaction() as session:
        row = await session.fetchrow(
            f"SELECT {_COLUMNS} FROM api_keys WHERE api_key = $1 FOR UPDATE", api_key
        )
        if row is None:
            raise UnknownKeyError(f"unknown api key {api_key}")
        if row["revoked_at_ms"] is not None:
            raise KeyRevokedError(f"{api_key} was revoked: make a new key instead")
        kind = row["kind"]
        if kind == ED25519 and len(public_key) != ED25519_PUBLIC_KEY_BYTES:
            raise ValueError("rotating an Ed25519 key needs the new 32-byte public key")
        if kind == HMAC and public_key:
            raise ValueError("public_key is for Ed25519 keys only")
        successor = NewKey(
            user_id=row["user_id"],
            kind=kind,
            public_key=public_key,
            scopes=tuple(row["scopes"]),
            expires_at_ms=row["expires_at_ms"] or 0,
            label=row["label"],
            actor=actor,
        )
        info, secret = await insert_key(session, master, successor, audit_action="api_key.rotate")
        await session.execute(
            """UPDATE api_keys SET revoked_at = now(), enabled = false, revoked_by = $2
               WHERE api_key = $1""",
            api_key,
            actor,
        )
        await audit(
            session,
            actor=actor,
            action="api_key.revoke",
            user_id=row["user_id"],
            subject=api_key,
            detail={"rotated_to": info.api_key},
        )
    return persister_pb2.CreatedApiKey(key=info, api_secret=secret)


async def read_credential(
    session: Session, master: MasterKey, api_key: str
) -> persister_pb2.Credential | None:
    """What a gateway checks a request by: the HMAC secret unsealed, or the public key."""
    row = await session.fetchrow(f"SELECT {_COLUMNS} FROM api_keys WHERE api_key = $1", api_key)
    if row is None:
        return None
    sealed = row["sealed_secret"]
    # A row the startup's sealing has not reached yet (`seal_plaintext_secrets`).
    secret = master.open(api_key, bytes(sealed)) if sealed is not None else row["secret"] or ""
    return persister_pb2.Credential(
        api_key=row["api_key"],
        user_id=row["user_id"],
        api_secret=secret,
        enabled=row["enabled"] and row["revoked_at_ms"] is None,
        kind=_KIND_VALUES[row["kind"]],
        public_key=bytes(row["public_key"] or b""),
        scopes=[_SCOPE_VALUES[scope] for scope in row["scopes"]],
        expires_at_ms=row["expires_at_ms"] or 0,
    )


async def seal_plaintext_secrets(store: Store, master: MasterKey) -> int:
    """Seal the secrets of rows written before sealing existed; how many."""
    async with store.transaction() as session:
        rows = await session.fetch(
            "SELECT api_key, secret FROM api_keys WHERE secret IS NOT NULL FOR UPDATE"
        )
        for row in rows:
            await session.execute(
                "UPDATE api_keys SET sealed_secret = $2, secret = NULL WHERE api_key = $1",
                row["api_key"],
                master.seal(row["api_key"], row["secret"]),
            )
        if rows:
            await audit(
                session,
                actor="persister",
                action="api_key.seal_plaintext",
                user_id=None,
                detail={"rows": len(rows)},
            )
    return len(rows)


class UnknownMasterKeyError(RuntimeError):
    """Rows are sealed under a master key the persister was not given."""


RESEAL_BATCH = 500


@dataclass(frozen=True, slots=True)
class Reseal:
    resealed: int
    left: int  # rows still under a retired key: locked elsewhere, damaged, or sealed since
    damaged: tuple[str, ...]  # API keys whose sealed secret does not open (left as they are)


async def reseal_retired_secrets(store: Store, master: MasterKey) -> Reseal:
    """Reseal under the current master key every secret a retired one sealed.

    In batches, each its own transaction with its audit row. Rows locked by another
    transaction (another persister resealing them, a key being rotated) are skipped
    (SKIP LOCKED) and counted in `left`, as are rows a persister not yet given the new
    key seals meanwhile: a later start reseals them. A row whose secret does not open
    is logged and left. Raises `UnknownMasterKeyError`, before changing anything, if a
    row is sealed under a key that is neither the current one nor a retired one.
    """
    current = master.key_id
    async with store.session() as session:
        ids = await session.fetch(
            "SELECT DISTINCT substring(sealed_secret FROM 2 FOR 8) AS key_id FROM api_keys "
            "WHERE sealed_secret IS NOT NULL"
        )
    unknown = sorted(bytes(row["key_id"]).hex() for row in ids if not master.opens(row["key_id"]))
    if unknown:
        raise UnknownMasterKeyError(
            f"API key secrets are sealed under master key id(s) {', '.join(unknown)}, which "
            "this persister was not given: add the old key to OMS_PERSISTER_RETIRED_MASTER_KEYS"
        )
    resealed = 0
    damaged: list[str] = []
    while True:
        async with store.transaction() as session:
            rows = await session.fetch(
                "SELECT api_key, sealed_secret FROM api_keys WHERE sealed_secret IS NOT NULL "
                "AND substring(sealed_secret FROM 2 FOR 8) <> $1 "
                "AND NOT api_key = ANY($3::text[]) "
                "ORDER BY api_key LIMIT $2 FOR UPDATE SKIP LOCKED",
                current,
                RESEAL_BATCH,
                damaged,
            )
            if not rows:
                break
            retired = sorted({key_id_of(bytes(row["sealed_secret"])).hex() for row in rows})
            done = 0
            for row in rows:
                try:
                    secret = master.open(row["api_key"], bytes(row["sealed_secret"]))
                except SealError:
                    damaged.append(row["api_key"])
                    continue
                await session.execute(
                    "UPDATE api_keys SET sealed_secret = $2 WHERE api_key = $1",
                    row["api_key"],
                    master.seal(row["api_key"], secret),
                )
                done += 1
            if done:
                await audit(
                    session,
                    actor="persister",
                    action="api_key.reseal",
                    user_id=None,
                    detail={"rows": done, "from_key_ids": retired, "to_key_id": current.hex()},
                )
            resealed += done
    async with store.session() as session:
        left = await session.fetchval(
            "SELECT count(*) FROM api_keys WHERE sealed_secret IS NOT NULL "
            "AND substring(sealed_secret FROM 2 FOR 8) <> $1",
            current,
        )
    return Reseal(resealed, int(left), tuple(damaged))
