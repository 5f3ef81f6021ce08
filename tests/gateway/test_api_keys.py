"""API keys through the admin API, on a mesh of real processes and PostgreSQL.

A user holds several keys: HMAC (the secret shown once, sealed in the database) or
Ed25519 (the exchange stores the public key only), each with scopes and an optional
expiry. A read-only key reads and cannot trade; an expired key is refused; a revoked
or rotated key is refused by a gateway within its credential TTL plus one persister
answer; every change has its audit row; bad input changes nothing.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gateway.client import AdminClient, GatewayCallError, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2
from tests.full_mesh import FullMesh
from tests.gateway.accounts import BTC, POLL_S, PRICE, WAIT_S, Account, open_account
from tests.gateway.gateway_process import ADMIN_KEY

C = common_pb2
FUNDS = {"USDT": 10_000_000_000}
# A gateway of these tests' own checks known keys every second, so a revocation's
# bound is measured in seconds (the default TTL is a minute).
TTL_MS = 1_000
ANSWER_MARGIN_S = 3.0


def _public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


async def _refused(call: object) -> GatewayCallError:
    with pytest.raises(GatewayCallError) as refused:
        await call  # type: ignore[misc]
    return refused.value


async def _buy(client: OmsClient, client_order_id: str) -> gateway_pb2.OrderAck:
    ack: gateway_pb2.OrderAck = await client.place(
        client_order_id, BTC, C.SIDE_BUY, price_ticks=PRICE - 1_000, quantity_lots=1
    )
    return ack


async def _until_refused(client: OmsClient, reason: str, timeout_s: float) -> float:
    """Seconds until `client`'s reads are refused with `reason` (polled, with a deadline)."""
    started = time.monotonic()
    while True:
        try:
            await client.balances()
        except GatewayCallError as error:
            assert error.reason == reason, error
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"still served after {timeout_s} s"
        await asyncio.sleep(POLL_S)


async def test_an_ed25519_key_trades_and_the_exchange_keeps_only_its_public_half(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS)
    private_key = Ed25519PrivateKey.generate()
    created = await admin.create_api_key(
        account.user_id, kind=C.API_KEY_KIND_ED25519, public_key=_public_bytes(private_key)
    )
    assert created.api_secret == ""
    assert created.key.kind == C.API_KEY_KIND_ED25519
    assert set(created.key.scopes) == {C.API_KEY_SCOPE_READ, C.API_KEY_SCOPE_TRADE}
    address = shared_mesh.gateway.address
    async with OmsClient(
        address, user_id=account.user_id, api_key=created.key.api_key, private_key=private_key
    ) as client:
        ack = await _buy(client, "ed-1")
        assert ack.accepted, ack
        assert "USDT" in await client.balances()
    # Another private key under the same key id: its signatures do not verify.
    async with OmsClient(
        address,
        user_id=account.user_id,
        api_key=created.key.api_key,
        private_key=Ed25519PrivateKey.generate(),
    ) as forger:
        refused = await _refused(forger.balances())
        assert refused.reason == "GATEWAY_ERROR_REASON_BAD_SIGNATURE"
    connection = await asyncpg.connect(shared_mesh.database_url)
    try:
        row = await connection.fetchrow(
            "SELECT kind, secret, sealed_secret, public_key FROM api_keys WHERE api_key = $1",
            created.key.api_key,
        )
    finally:
        await connection.close()
    assert row is not None
    assert (row["kind"], row["secret"], row["sealed_secret"]) == ("ed25519", None, None)
    assert bytes(row["public_key"]) == _public_bytes(private_key)


async def test_a_read_only_key_reads_and_is_refused_every_trading_call(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS)
    created = await admin.create_api_key(
        account.user_id, scopes=[C.API_KEY_SCOPE_READ], label="dashboard"
    )
    reader = Account(account.user_id, created.key.api_key, created.api_secret)
    async with reader.client(shared_mesh.gateway.address) as client:
        assert "USDT" in await client.balances()
        assert await client.open_orders() == []
        refused = await _refused(_buy(client, "ro-1"))
        assert refused.reason == "GATEWAY_ERROR_REASON_SCOPE_REQUIRED"
        refused = await _refused(client.cancel(client_order_id="ro-1"))
        assert refused.reason == "GATEWAY_ERROR_REASON_SCOPE_REQUIRED"
        with pytest.raises(GatewayCallError) as stream_refused:
            async with client.trade() as stream:
                request = client.place_request(
                    "ro-2", BTC, C.SIDE_BUY, price_ticks=PRICE, quantity_lots=1
                )
                await stream.submit([request])
        refused_stream = stream_refused.value
        assert refused_stream.reason == "GATEWAY_ERROR_REASON_SCOPE_REQUIRED", refused_stream
    # The account's first key still trades: scopes belong to keys, not accounts.
    async with account.client(shared_mesh.gateway.address) as client:
        assert (await _buy(client, "ro-first")).accepted


async def test_an_expired_key_is_refused(shared_mesh: FullMesh, admin: AdminClient) -> None:
    account = await open_account(admin, FUNDS)
    expires_at_ms = time.time_ns() // 1_000_000 + 1_500
    created = await admin.create_api_key(account.user_id, expires_at_ms=expires_at_ms)
    assert created.key.expires_at_ms == expires_at_ms
    expiring = Account(account.user_id, created.key.api_key, created.api_secret)
    async with expiring.client(shared_mesh.gateway.address) as client:
        assert "USDT" in await client.balances()
        await _until_refused(client, "GATEWAY_ERROR_REASON_KEY_EXPIRED", WAIT_S)
        assert time.time_ns() // 1_000_000 >= expires_at_ms


async def test_revoked_and_rotated_keys_are_refused_within_the_credential_ttl(
    shared_mesh: FullMesh,
) -> None:
    gateway = shared_mesh.new_gateway(
        "keys-gateway", environment={"OMS_GATEWAY_CREDENTIAL_TTL_MS": str(TTL_MS)}
    )
    shared_mesh.start(gateway)
    try:
        async with shared_mesh.admin(gateway.address) as admin:
            account = await open_account(admin, FUNDS)
            spare = await admin.create_api_key(account.user_id, label="spare")
            holder = Account(account.user_id, spare.key.api_key, spare.api_secret)
            async with holder.client(gateway.address) as client:
                assert "USDT" in await client.balances()  # known to the gateway now
                revoked = await admin.revoke_api_key(spare.key.api_key)
                assert revoked.revoked_at_ms > 0
                took_s = await _until_refused(
                    client, "GATEWAY_ERROR_REASON_UNKNOWN_KEY", TTL_MS / 1000 + ANSWER_MARGIN_S
                )
            print(f"revoked key refused after {took_s:.2f} s (credential TTL {TTL_MS} ms)")
            again = await admin.revoke_api_key(spare.key.api_key)  # idempotent
            assert again.revoked_at_ms == revoked.revoked_at_ms
            refused = await _refused(admin.rotate_api_key(spare.key.api_key))
            assert refused.reason == "GATEWAY_ERROR_REASON_KEY_REVOKED"

            first = Account(account.user_id, account.api_key, account.api_secret)
            rotated = await admin.rotate_api_key(account.api_key)
            assert rotated.key.api_key != account.api_key and rotated.api_secret
            successor = Account(account.user_id, rotated.key.api_key, rotated.api_secret)
            async with successor.client(gateway.address) as client:
                assert (await _buy(client, "after-rotation")).accepted
            async with first.client(gateway.address) as client:
                await _until_refused(
                    client, "GATEWAY_ERROR_REASON_UNKNOWN_KEY", TTL_MS / 1000 + ANSWER_MARGIN_S
                )
            keys = {key.api_key: key for key in await admin.list_api_keys(account.user_id)}
            assert set(keys) == {account.api_key, spare.key.api_key, rotated.key.api_key}
            assert keys[account.api_key].revoked_at_ms > 0
            assert keys[rotated.key.api_key].revoked_at_ms == 0
            assert keys[spare.key.api_key].label == "spare"
    finally:
        gateway.stop()
    connection = await asyncpg.connect(shared_mesh.database_url)
    try:
        audit = await connection.fetch(
            "SELECT actor, action, subject FROM admin_audit WHERE user_id = $1 ORDER BY audit_id",
            account.user_id,
        )
        rows = await connection.fetch(
            "SELECT api_key, secret, sealed_secret FROM api_keys WHERE user_id = $1",
            account.user_id,
        )
    finally:
        await connection.close()
    assert [(row["action"], row["subject"]) for row in audit] == [
        ("api_key.create", account.api_key),  # the account's first key
        ("api_key.create", spare.key.api_key),
        ("api_key.revoke", spare.key.api_key),
        ("api_key.rotate", rotated.key.api_key),
        ("api_key.revoke", account.api_key),
    ]
    assert {row["actor"] for row in audit} == {ADMIN_KEY}
    # At rest: no secret in clear, and not one of them inside its sealed bytes.
    secrets_shown = {spare.api_secret, rotated.api_secret, account.api_secret}
    for row in rows:
        assert row["secret"] is None
        sealed = bytes(row["sealed_secret"])
        assert not any(secret.encode() in sealed for secret in secrets_shown)


async def test_bad_key_requests_are_refused_and_change_nothing(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, FUNDS)
    before = await admin.list_api_keys(account.user_id)
    now_ms = time.time_ns() // 1_000_000
    cases = [
        (
            admin.create_api_key(
                account.user_id, kind=C.API_KEY_KIND_ED25519, public_key=b"\x01" * 31
            ),
            "GATEWAY_ERROR_REASON_INVALID_FIELD",
        ),
        (
            admin.create_api_key(account.user_id, public_key=b"\x01" * 32),
            "GATEWAY_ERROR_REASON_INVALID_FIELD",
        ),
        (admin.create_api_key(account.user_id, kind=7), "GATEWAY_ERROR_REASON_INVALID_FIELD"),
        (admin.create_api_key(account.user_id, scopes=[9]), "GATEWAY_ERROR_REASON_INVALID_FIELD"),
        (
            admin.create_api_key(account.user_id, expires_at_ms=now_ms - 1),
            "GATEWAY_ERROR_REASON_INVALID_FIELD",
        ),
        (
            admin.create_api_key(account.user_id, label="x" * 65),
            "GATEWAY_ERROR_REASON_INVALID_FIELD",
        ),
        (admin.create_api_key(2**62), "GATEWAY_ERROR_REASON_UNKNOWN_USER"),
        (admin.revoke_api_key("ak_unknown"), "GATEWAY_ERROR_REASON_KEY_NOT_FOUND"),
        (admin.rotate_api_key("ak_unknown"), "GATEWAY_ERROR_REASON_KEY_NOT_FOUND"),
        (
            admin.rotate_api_key(account.api_key, public_key=b"\x02" * 32),
            "GATEWAY_ERROR_REASON_INVALID_FIELD",
        ),
    ]
    for call, reason in cases:
        refused = await _refused(call)
        assert refused.reason == reason, refused
    assert await admin.list_api_keys(account.user_id) == before
    # A user key cannot manage keys, not even its own.
    user_as_admin = AdminClient(
        shared_mesh.gateway.address, api_key=account.api_key, api_secret=account.api_secret
    )
    async with user_as_admin:
        refused = await _refused(user_as_admin.list_api_keys(account.user_id))
        assert refused.reason == "GATEWAY_ERROR_REASON_ADMIN_REQUIRED"
