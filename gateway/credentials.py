"""API keys resolved through the persister, remembered in a bounded LRU with a TTL.

A known key is trusted for `ttl_s` (a disabled or rotated key stops working
within that time); an unknown key is remembered only for `unknown_ttl_s`, long
enough to absorb a flood of requests with a made-up key, short enough that a key
created a moment ago works almost at once. Concurrent lookups of one key share
one persister call. The admin key never reaches the persister: it comes from the
gateway's own settings.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gateway.clusters import PersisterPool

MAX_API_KEY_LENGTH = 128


@dataclass(frozen=True, slots=True)
class KeyHolder:
    """Who a key belongs to: a user, or the operator (admin)."""

    api_key: str
    secret: str
    user_id: int
    admin: bool = False


@dataclass(frozen=True, slots=True)
class CredentialStatistics:
    cached: int
    hits: int
    misses: int
    unknown_hits: int
    lookups: int


class CredentialDirectory:
    def __init__(
        self,
        persister: PersisterPool,
        *,
        admin: KeyHolder | None,
        capacity: int,
        ttl_s: float,
        unknown_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError("the credential cache needs room for at least one key")
        self.persister = persister
        self.admin = admin
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.unknown_ttl_s = unknown_ttl_s
        self.clock = clock
        # api key -> (holder or None for unknown, expiry on `clock`)
        self._entries: OrderedDict[str, tuple[KeyHolder | None, float]] = OrderedDict()
        self._lookups: dict[str, asyncio.Task[KeyHolder | None]] = {}
        self.hits = 0
        self.misses = 0
        self.unknown_hits = 0
        self.persister_lookups = 0

    async def holder(self, api_key: str) -> KeyHolder | None:
        """The key's holder, or None if no such (enabled) key exists.

        Raises GatewayError(UNAVAILABLE) when the persister cannot answer.
        """
        admin = self.admin
        if admin is not None and api_key == admin.api_key:
            return admin
        if not api_key or len(api_key) > MAX_API_KEY_LENGTH or not api_key.isascii():
            return None
        entry = self._entries.get(api_key)
        if entry is not None:
            holder, expires_at = entry
            if self.clock() < expires_at:
                self._entries.move_to_end(api_key)
                if holder is None:
                    self.unknown_hits += 1
                else:
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
        )

    async def _lookup(self, api_key: str) -> KeyHolder | None:
        self.persister_lookups += 1
        try:
            credential = await self.persister.credential(api_key)
        finally:
            self._lookups.pop(api_key, None)
        if credential is None or not credential.enabled or credential.user_id == 0:
            holder = None
        else:
            holder = KeyHolder(credential.api_key, credential.api_secret, credential.user_id)
        self._remember(api_key, holder)
        return holder

    def _remember(self, api_key: str, holder: KeyHolder | None) -> None:
        lifetime = self.ttl_s if holder is not None else self.unknown_ttl_s
        if lifetime <= 0:
            return
        self._entries[api_key] = (holder, self.clock() + lifetime)
        self._entries.move_to_end(api_key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


def _retrieve_outcome(task: asyncio.Task[KeyHolder | None]) -> None:
    """The waiters re-raise a failure; this only keeps asyncio from reporting it as lost."""
    if not task.cancelled():
        task.exception()
