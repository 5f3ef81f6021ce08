"""The negative cache: user ids PostgreSQL did not know, remembered for a short TTL.

A burst of orders for a user who does not exist (a typo, a scanner) costs one
read, not one per order. Bounded: the oldest entry goes first when full.
`forget` (on CreateUser) removes a user at once; a read that started before any
`forget` does not cache its miss, so a user created during that read is not
hidden behind a stale entry. Other persisters learn of new users only when the
TTL runs out, which is what bounds the TTL.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class UnknownUsers:
    def __init__(
        self, ttl_ms: int, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_ms / 1000
        self.max_entries = max_entries
        self._clock = clock
        self._expiry: OrderedDict[int, float] = OrderedDict()
        self._forgets = 0

    def __len__(self) -> int:
        return len(self._expiry)

    def generation(self) -> int:
        """Take before a read; pass to `remember` after it."""
        return self._forgets

    def known_unknown(self, user_id: int) -> bool:
        expiry = self._expiry.get(user_id)
        if expiry is None:
            return False
        if expiry <= self._clock():
            del self._expiry[user_id]
            return False
        return True

    def remember(self, user_id: int, generation: int) -> bool:
        if generation != self._forgets:
            return False
        self._expiry.pop(user_id, None)
        while len(self._expiry) >= self.max_entries:
            self._expiry.popitem(last=False)
        self._expiry[user_id] = self._clock() + self.ttl_s
        return True

    def forget(self, user_id: int) -> None:
        self._forgets += 1
        self._expiry.pop(user_id, None)
