"""API keys resolved through the persister, remembered in a bounded LRU.

A known key is checked again with the persister every `ttl_s`, in the
background: the request that finds its entry due is served from the cache and
starts the refresh, so no request of a known key waits on the persister or the
database. A refresh that finds the key disabled, rotated or gone ends it (the
next request is refused): a revocation takes effect within `ttl_s` plus one
persister answer. A refresh that cannot reach the persister (it or PostgreSQL is
down) keeps the key working and is tried again after `retry_s`, for at most
`stale_limit_s` past the last answer that vouched for it; then the key waits for
the persister like an unknown one. So trading goes on through a database
outage for the keys the gateway already knew, and a revocation still wins as
soon as the persister can say it.

An unknown key is remembered only for `unknown_ttl_s`, long enough to absorb a
flood of requests with a made-up key, short enough that a key created a moment
ago works almost at once; a key the gateway has never seen waits for the
persister (UNAVAILABLE while it cannot answer). Concurrent lookups of one key
share one persister call. The admin key never reaches the persister: it comes
from the gateway's own settings.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.core.refusals import GatewayError
from protos.oms.v1 import common_pb2, persister_pb2

MAX_API_KEY_LENGTH = 128


READ = common_pb2.API_KEY_SCOPE_READ
TRADE = common_pb2.API_KEY_SCOPE_TRADE
ALL_SCOPES = frozenset({READ, TRADE})


@dataclass(frozen=True, slots=True)
class KeyHolder:
    """Who a key belongs to (a user, or the operator: admin), how its requests are
    checked, what it may do and until when."""

    api_key: str
    secret: str  # HMAC keys: the shared secret; Ed25519 keys: ""
    user_id: int
    admin: bool = False
    kind: int = common_pb2.API_KEY_KIND_HMAC
    public_key: bytes = b""  # Ed25519 keys: the raw 32-byte public key
    scopes: frozenset[int] = ALL_SCOPES
    expires_at_ms: int = 0  # wall time; 0: never


@dataclass(frozen=True, slots=True)
class CredentialStatistics:
    cached: int
    hits: int
    misses: int
    unknown_hits: int
    lookups: int
    stale_hits: int  # known keys served past their TTL while the persister could not answer
    refresh_failures: int  # background checks that could not reach the persister


class _Entry:
    """A key's holder (None: unknown) as the persister last answered at `answered_at`."""

    __slots__ = ("answered_at", "due_at", "holder", "retry_at")

    def __init__(self, holder: KeyHolder | None, answered_at: float, lifetime_s: float) -> None:
        self.holder = holder
        self.answered_at = answered_at
        self.due_at = answered_at + lifetime_s  # asked again from then on
        self.retry_at = self.due_at  # a failed background check waits until then


class CredentialSource(Protocol):
    """Where keys are read: any persister (`PersisterPool`, or one `PersisterClient`)."""

    async def credential(self, api_key: str) -> persister_pb2.Credential | None: ...


class CredentialDirectory:
    def __init__(
        self,
        persister: CredentialSource,
        *,
        admin: KeyHolder | None,
        capacity: int,
        ttl_s: float,
        unknown_ttl_s: float,
        stale_limit_s: float = 3_600.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError("the credential cache needs room for at least one key")
        self.persister = persister
        self.admin = admin
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.unknown_ttl_s = unknown_ttl_s
        self.stale_limit_s = max(stale_limit_s, ttl_s)
        self.retry_s = retry_s
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lookups: dict[str, asyncio.Task[KeyHolder | None]] = {}
        self._refreshes: dict[str, asyncio.Task[None]] = {}
        self.hits = 0
        self.misses = 0
        self.unknown_hits = 0
        self.stale_hits = 0
        self.refresh_failures = 0
        self.persister_lookups = 0

    async def holder(self, api_key: str) -> KeyHolder | None:
        """The key's holder, or None if no such (enabled) key exists.

        Raises GatewayError(UNAVAILABLE) when the persister cannot answer for a key
        the gateway does not know (or no longer vouches for: past `stale_limit_s`).
        """
        admin = self.admin
        if admin is not None and api_key == admin.api_key:
            return admin
        if not api_key or len(api_key) > MAX_API_KEY_LENGTH or not api_key.isascii():
            return None
        entry = self._entries.get(api_key)
        if entry is not None:
            now = self.clock()
            holder = entry.holder
            if holder is None:
                if now < entry.due_at:
                    self._entries.move_to_end(api_key)
                    self.unknown_hits += 1
                    return None
            elif now < entry.answered_at + self.stale_limit_s:
                if now >= entry.due_at:
                    if entry.retry_at > entry.due_at:
                        self.stale_hits += 1  # a check failed: served on the last answer
                    if now >= entry.retry_at and api_key not in self._refreshes:
                        self._refresh_in_background(api_key, entry)
                self._entries.move_to_end(api_key)
                self.hits += 1
                return holder
            del self._entries[api_key]
        self.misses += 1
        lookup = self._lookups.get(api_key)
        if lookup is None:
            # Its own task: one caller's cancelled RPC must not fail the others waiting.
            lookup = asyncio.create_task(self._lookup(api_key))
            lookup.add_done_callback(_retrieve_outcome)
            self._lookups[api_key] = lookup
        return await asyncio.shield(lookup)

    def statistics(self) -> CredentialStatistics:
        return CredentialStatistics(
            cached=len(self._entries),
            hits=self.hits,
            misses=self.misses,
            unknown_hits=self.unknown_hits,
            lookups=self.persister_lookups,
            stale_hits=self.stale_hits,
            refresh_failures=self.refresh_failures,
        )

    async def _lookup(self, api_key: str) -> KeyHolder | None:
        try:
            holder = await self._ask(api_key)
        finally:
            self._lookups.pop(api_key, None)
        self._remember(api_key, holder)
        return holder

    def _refresh_in_background(self, api_key: str, entry: _Entry) -> None:
        async def refresh() -> None:
            try:
                holder = await self._ask(api_key)
            except GatewayError:
                # The persister or its database is away: the key keeps working (until
                # `stale_limit_s`); ask again in `retry_s`, not on every request.
                self.refresh_failures += 1
                entry.retry_at = self.clock() + self.retry_s
                return
            finally:
                self._refreshes.pop(api_key, None)
            self._remember(api_key, holder)

        task = asyncio.create_task(refresh())
        task.add_done_callback(_retrieve_outcome)
        self._refreshes[api_key] = task

    async def _ask(self, api_key: str) -> KeyHolder | None:
        self.persister_lookups += 1
        credential = await self.persister.credential(api_key)
        if credential is None or not credential.enabled or credential.user_id == 0:
            return None
        # An older persister's answer names neither kind nor scopes: an HMAC key with all.
        return KeyHolder(
            credential.api_key,
            credential.api_secret,
            credential.user_id,
            kind=credential.kind or common_pb2.API_KEY_KIND_HMAC,
            public_key=bytes(credential.public_key),
            scopes=frozenset(credential.scopes) or ALL_SCOPES,
            expires_at_ms=credential.expires_at_ms,
        )

    def remember(self, holder: KeyHolder) -> None:
        """Know a key as if the persister had just vouched for it (`oms bench unary-floor`
        serves the gateway with no persister)."""
        self._remember(holder.api_key, holder)

    def _remember(self, api_key: str, holder: KeyHolder | None) -> None:
        lifetime = self.ttl_s if holder is not None else self.unknown_ttl_s
        if lifetime <= 0:
            self._entries.pop(api_key, None)
            return
        self._entries[api_key] = _Entry(holder, self.clock(), lifetime)
        self._entries.move_to_end(api_key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


def _retrieve_outcome(task: asyncio.Task[Any]) -> None:
    """The waiters re-raise a failure; this only keeps asyncio from reporting it as lost."""
    if not task.cancelled():
        task.exception()
