"""API keys at rest: sealed HMAC secrets (`secret_seal.py`) and their rows (`api_keys.py`).

The sealing itself without a database: a secret opens under its master key and its
own key id only. Then on PostgreSQL: a row written before sealing existed (the
plaintext column) is sealed at the persister's start, reads back the same secret,
and leaves no plaintext behind; a row sealed under another master key is refused,
not served; a rotated master key reseals every row at start, and a key it was not
given stops the reseal before anything changes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from persister.accounts import create_user
from persister.api_keys import (
    UnknownMasterKeyError,
    read_credential,
    reseal_retired_secrets,
    seal_plaintext_secrets,
)
from persister.migrations import apply_migrations
from persister.secret_seal import MasterKey, SealError, key_id_of
from persister.store import Store
from protos.oms.v1 import common_pb2, persister_pb2
from tests.persister.persister_client import sql

MASTER = MasterKey(b"m" * 32)
OTHER = MasterKey(b"o" * 32)


def test_a_sealed_secret_opens_under_its_master_key_and_its_own_key_id_only() -> None:
    sealed = MASTER.seal("ak_1", "the-secret")
    assert b"the-secret" not in sealed
    assert MASTER.open("ak_1", sealed) == "the-secret"
    assert MASTER.seal("ak_1", "the-secret") != sealed  # a fresh nonce every time
    with pytest.raises(SealError, match="another master key"):
        OTHER.open("ak_1", sealed)
    with pytest.raises(SealError, match="does not open"):
        MASTER.open("ak_2", sealed)  # copied onto another key's row
    damaged = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SealError, match="does not open"):
        MASTER.open("ak_1", damaged)
    with pytest.raises(SealError, match="version"):
        MASTER.open("ak_1", b"\x02" + sealed[1:])


def test_a_master_key_is_32_bytes_of_base64() -> None:
    text = MasterKey.new_text()
    assert MasterKey.from_text(text).key_id == MasterKey.from_text(text).key_id
    with pytest.raises(ValueError, match="32 bytes"):
        MasterKey.from_text("c2hvcnQ=")


@pytest.fixture
def url(new_database: Callable[[], str]) -> str:
    return new_database()


@pytest.fixture
async def store(url: str) -> AsyncIterator[Store]:
    opened = await Store.open(url, pool_size=2)
    try:
        await apply_migrations(opened)
        yield opened
    finally:
        await opened.close()


async def test_a_plaintext_secret_from_before_sealing_is_sealed_at_start(
    store: Store, url: str
) -> None:
    created = await create_user(store, MASTER, persister_pb2.NewUser())
    async with sql(url) as connection:
        # As a row written before migration 0005 looks: the secret in clear.
        await connection.execute(
            "UPDATE api_keys SET secret = 'old-secret', sealed_secret = NULL WHERE api_key = $1",
            created.api_key,
        )
    assert await seal_plaintext_secrets(store, MASTER) == 1
    assert await seal_plaintext_secrets(store, MASTER) == 0
    async with store.session() as session:
        credential = await read_credential(session, MASTER, created.api_key)
    assert credential is not None and credential.api_secret == "old-secret"
    assert credential.kind == common_pb2.API_KEY_KIND_HMAC and credential.enabled
    async with sql(url) as connection:
        row = await connection.fetchrow(
            "SELECT secret, sealed_secret FROM api_keys WHERE api_key = $1", created.api_key
        )
        audit = await connection.fetchval(
            "SELECT count(*) FROM admin_audit WHERE action = 'api_key.seal_plaintext'"
        )
    assert row["secret"] is None and b"old-secret" not in bytes(row["sealed_secret"])
    assert audit == 1


async def test_a_secret_sealed_under_another_master_key_is_refused(store: Store) -> None:
    created = await create_user(store, OTHER, persister_pb2.NewUser())
    async with store.session() as session:
        with pytest.raises(SealError, match="another master key"):
            await read_credential(session, MASTER, created.api_key)
        credential = await read_credential(session, OTHER, created.api_key)
    assert credential is not None and credential.api_secret == created.api_secret


def test_a_rotated_master_key_seals_with_the_new_key_and_opens_what_the_old_sealed() -> None:
    old_sealed = OTHER.seal("ak_1", "the-secret")
    rotated = MasterKey(b"m" * 32, retired=[b"o" * 32])
    assert rotated.key_id == MASTER.key_id and rotated.retired_key_ids == (OTHER.key_id,)
    assert rotated.open("ak_1", old_sealed) == "the-secret"
    new_sealed = rotated.seal("ak_1", "the-secret")
    assert key_id_of(new_sealed) == MASTER.key_id  # a retired key never seals again
    assert MASTER.open("ak_1", new_sealed) == "the-secret"
    with pytest.raises(ValueError, match="32 bytes"):
        MasterKey(b"m" * 32, retired=[b"short"])


async def test_a_rotation_reseals_every_secret_under_the_new_key_at_start(
    store: Store, url: str
) -> None:
    created = [await create_user(store, OTHER, persister_pb2.NewUser()) for _ in range(3)]
    rotated = MasterKey(b"m" * 32, retired=[b"o" * 32])
    first = await reseal_retired_secrets(store, rotated)
    assert (first.resealed, first.left, first.damaged) == (3, 0, ())
    assert (await reseal_retired_secrets(store, rotated)).resealed == 0
    async with store.session() as session:
        for user in created:
            # Once resealed, the old key is no longer needed at all.
            credential = await read_credential(session, MASTER, user.api_key)
            assert credential is not None and credential.api_secret == user.api_secret
    async with sql(url) as connection:
        detail = await connection.fetchval(
            "SELECT detail::text FROM admin_audit WHERE action = 'api_key.reseal'"
        )
    assert json.loads(detail) == {
        "rows": 3,
        "from_key_ids": [OTHER.key_id.hex()],
        "to_key_id": MASTER.key_id.hex(),
    }


async def test_secrets_under_a_master_key_not_given_stop_the_reseal_and_change_nothing(
    store: Store, url: str
) -> None:
    created = await create_user(store, OTHER, persister_pb2.NewUser())
    async with sql(url) as connection:
        before = await connection.fetchval("SELECT sealed_secret FROM api_keys")
    with pytest.raises(UnknownMasterKeyError, match=OTHER.key_id.hex()):
        await reseal_retired_secrets(store, MASTER)
    async with sql(url) as connection:
        assert await connection.fetchval("SELECT sealed_secret FROM api_keys") == before
    async with store.session() as session:
        credential = await read_credential(session, OTHER, created.api_key)
    assert credential is not None


async def test_a_damaged_sealed_secret_is_left_and_reported_and_the_rest_resealed(
    store: Store, url: str
) -> None:
    created = [await create_user(store, OTHER, persister_pb2.NewUser()) for _ in range(3)]
    async with sql(url) as connection:
        # Flip the tag's last byte: the row is OTHER's, but no longer opens.
        await connection.execute(
            "UPDATE api_keys SET sealed_secret = overlay(sealed_secret PLACING "
            "decode(lpad(to_hex(get_byte(sealed_secret, length(sealed_secret) - 1) # 1), 2, "
            "'0'), 'hex') FROM length(sealed_secret)) WHERE api_key = $1",
            created[0].api_key,
        )
    reseal = await reseal_retired_secrets(store, MasterKey(b"m" * 32, retired=[b"o" * 32]))
    assert (reseal.resealed, reseal.left, reseal.damaged) == (2, 1, (created[0].api_key,))
