"""The admin API's API keys: create, list, revoke and rotate a user's keys.

A user may hold several keys, each HMAC (the exchange keeps the secret, sealed in the
database under the persister's master key, and shows it once, at creation) or
Ed25519 (the user sends the public key; the exchange keeps nothing that signs), each
with scopes (READ, TRADE) and an optional expiry. The persister writes every change
with its audit row (who: the admin key that asked; when; what). A revoked or rotated
key is refused by a gateway once its cached credential is checked again: within the
credential TTL (`OMS_GATEWAY_CREDENTIAL_TTL_MS`) plus one persister answer, the
bound README gives. Bad input is INVALID_FIELD and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.authentication import caller
from gateway.clusters import PersisterPool
from gateway.core.refusals import invalid_field
from gateway.core.validation import check_user_id
from gateway.credentials import MAX_API_KEY_LENGTH
from protos.oms.v1 import common_pb2, gateway_pb2, persister_pb2

Context = Any  # grpc.aio.ServicerContext
ED25519_PUBLIC_KEY_BYTES = 32
MAX_LABEL_CHARACTERS = 64
_KINDS = (common_pb2.API_KEY_KIND_HMAC, common_pb2.API_KEY_KIND_ED25519)
_SCOPES = (common_pb2.API_KEY_SCOPE_READ, common_pb2.API_KEY_SCOPE_TRADE)


def _check_public_key(kind: int, public_key: bytes) -> None:
    if kind == common_pb2.API_KEY_KIND_ED25519 and len(public_key) != ED25519_PUBLIC_KEY_BYTES:
        raise invalid_field("public_key", "the raw 32-byte Ed25519 public key")
    if kind == common_pb2.API_KEY_KIND_HMAC and public_key:
        raise invalid_field("public_key", "only Ed25519 keys have one")


def _check_api_key(api_key: str) -> None:
    if not api_key or len(api_key) > MAX_API_KEY_LENGTH or not api_key.isascii():
        raise invalid_field("api_key", "an API key id")


def _public(info: persister_pb2.ApiKeyInfo) -> gateway_pb2.ApiKey:
    return gateway_pb2.ApiKey(
        api_key=info.api_key,
        user_id=info.user_id,
        kind=info.kind,
        scopes=list(info.scopes),
        expires_at_ms=info.expires_at_ms,
        created_at_ms=info.created_at_ms,
        revoked_at_ms=info.revoked_at_ms,
        label=info.label,
        public_key=info.public_key,
    )


class KeyAdmin:
    def __init__(
        self,
        persister: PersisterPool,
        *,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.persister = persister
        self.wall_clock_ms = wall_clock_ms

    @staticmethod
    def _actor() -> str:
        return caller.get().api_key

    def _scopes(self, scopes: Sequence[int]) -> list[common_pb2.ApiKeyScope.ValueType]:
        if any(scope not in _SCOPES for scope in scopes):
            raise invalid_field("scopes", "API_KEY_SCOPE_READ and/or API_KEY_SCOPE_TRADE")
        chosen = sorted(set(scopes)) or list(_SCOPES)
        return [common_pb2.ApiKeyScope.ValueType(scope) for scope in chosen]

    async def create(
        self, request: gateway_pb2.CreateApiKeyRequest, context: Context
    ) -> gateway_pb2.ApiKeyCreated:
        check_user_id(request.user_id)
        if request.kind not in _KINDS:
            raise invalid_field("kind", "API_KEY_KIND_HMAC or API_KEY_KIND_ED25519")
        _check_public_key(request.kind, request.public_key)
        scopes = self._scopes(request.scopes)
        if request.expires_at_ms and request.expires_at_ms <= self.wall_clock_ms():
            raise invalid_field("expires_at_ms", "in the future (wall time, ms), or 0: never")
        if len(request.label) > MAX_LABEL_CHARACTERS or not request.label.isprintable():
            raise invalid_field("label", f"at most {MAX_LABEL_CHARACTERS} printable characters")
        created = await self.persister.admin_call(
            "CreateApiKey",
            persister_pb2.NewApiKey(
                user_id=request.user_id,
                kind=request.kind,
                public_key=request.public_key,
                scopes=scopes,
                expires_at_ms=request.expires_at_ms,
                label=request.label,
                actor=self._actor(),
            ),
            persister_pb2.CreatedApiKey,
        )
        return gateway_pb2.ApiKeyCreated(key=_public(created.key), api_secret=created.api_secret)

    async def list(
        self, request: gateway_pb2.ListApiKeysRequest, context: Context
    ) -> gateway_pb2.ApiKeys:
        check_user_id(request.user_id)
        listed = await self.persister.admin_call(
            "ListApiKeys",
            persister_pb2.ApiKeyListQuery(user_id=request.user_id),
            persister_pb2.ApiKeyList,
        )
        return gateway_pb2.ApiKeys(keys=[_public(info) for info in listed.keys])

    async def revoke(
        self, request: gateway_pb2.RevokeApiKeyRequest, context: Context
    ) -> gateway_pb2.ApiKey:
        _check_api_key(request.api_key)
        revoked = await self.persister.admin_call(
            "RevokeApiKey",
            persister_pb2.ApiKeyRevocation(api_key=request.api_key, actor=self._actor()),
            persister_pb2.ApiKeyInfo,
        )
        return _public(revoked)

    async def rotate(
        self, request: gateway_pb2.RotateApiKeyRequest, context: Context
    ) -> gateway_pb2.ApiKeyCreated:
        _check_api_key(request.api_key)
        if request.public_key and len(request.public_key) != ED25519_PUBLIC_KEY_BYTES:
            raise invalid_field("public_key", "the raw 32-byte Ed25519 public key")
        rotated = await self.persister.admin_call(
            "RotateApiKey",
            persister_pb2.ApiKeyRotation(
                api_key=request.api_key, public_key=request.public_key, actor=self._actor()
            ),
            persister_pb2.CreatedApiKey,
        )
        return gateway_pb2.ApiKeyCreated(key=_public(rotated.key), api_secret=rotated.api_secret)
