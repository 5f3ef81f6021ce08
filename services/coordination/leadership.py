"""Who leads a group: one key in etcd, held under a lease that the holder keeps alive.

`campaign()` waits until this process creates the key (it must not exist: the
previous holder resigned or its lease expired) and returns the term: the key's
create revision, which every write of the term carries as its fencing token
(etcd refuses a transaction that compares it once the key was re-created).
`hold()` keeps the lease alive and returns only when it is lost: etcd said the
lease is gone, or no keep-alive succeeded for longer than `give_up_after_s` (the
TTL by default).

`certain()` says whether the holder may act as the leader right now: a keep-alive
etcd answered was sent less than one TTL ago, so etcd cannot have expired the lease
yet. Past that the holder cannot know that it still leads and must act as if it did
not; but when etcd was only electing a leader of its own, or briefly unreachable,
the lease is still there (a new etcd leader extends every lease), and the next
answered keep-alive proves it: the key was never deleted, so nobody else led
meanwhile. A holder that fences its writes by the term (`EtcdLogStore`) and stops
serving reads while uncertain may therefore wait longer than the TTL before it
gives up (`give_up_after_s`), and ride out an etcd election without a failover.

The value names the holder, so others find the leader's address (`current`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from services.coordination.errors import CoordinationError, CoordinationUnavailable, LeaseLost
from services.coordination.etcd_session import BlockingLeaseRenewer, EtcdSession

log = structlog.get_logger(__name__)
RETRY_S = 0.1


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    holder: str  # what the holder put in the key: its address
    term: int  # the key's create revision


async def current_leader(session: EtcdSession, key: bytes) -> LeaderRecord | None:
    entry = await session.get(key)
    if entry is None:
        return None
    return LeaderRecord(entry.value.decode(), entry.create_revision)


class Leadership:
    def __init__(self, session: EtcdSession, key: bytes, holder: str, *, ttl_s: int) -> None:
        if ttl_s < 1:
            raise ValueError("a lease lives at least one second")
        self.session = session
        self.key = key
        self.holder = holder
        self.ttl_s = ttl_s
        self.lease = 0
        self.term = 0
        self.lost = asyncio.Event()
        self.campaigns = 0
        self.uncertain_spells = 0  # times the lease went a TTL without an answered renewal
        # When the last renewal that etcd answered was sent (or the grant, at first):
        # etcd's expiry is at least one TTL after it. Written by the keeper thread.
        self._renewed_at = 0.0

    def certain(self) -> bool:
        """Whether etcd cannot have expired the lease yet (see the module's note)."""
        if not self.lease or self.lost.is_set():
            return False
        return time.monotonic() - self._renewed_at < self.ttl_s

    async def campaign(self) -> int:
        """Wait until this process holds the key; the term."""
        while True:
            self.campaigns += 1
            granting_at = time.monotonic()
            try:
                lease = await self.session.grant_lease(self.ttl_s)
                created, entry = await self.session.create(
                    self.key, self.holder.encode(), lease=lease
                )
            except CoordinationUnavailable as error:
                log.info("leadership.etcd_unavailable", key=self.key.decode(), error=str(error))
                await asyncio.sleep(RETRY_S)
                continue
            if created and entry is not None:
                self.lease, self.term = lease, entry.create_revision
                self._renewed_at = granting_at
                log.info("leadership.won", key=self.key.decode(), term=self.term)
                return self.term
            with contextlib.suppress(CoordinationUnavailable):
                await self.session.revoke_lease(lease)
            await self._wait_vacant(entry.mod_revision + 1 if entry is not None else 0)

    async def _wait_vacant(self, from_revision: int) -> None:
        """Until the key is deleted (its holder resigned or its lease expired)."""
        try:
            async with asyncio.timeout(self.ttl_s * 2):
                async for event in self.session.watch(
                    self.key, b"", from_revision=max(from_revision, 1)
                ):
                    if event.kind == "delete":
                        return
        except (TimeoutError, CoordinationError):
            return  # unavailable, or the history compacted: look again

    async def hold(self, *, give_up_after_s: float | None = None) -> None:
        """Keep the lease alive; raise `LeaseLost` once etcd says it is gone, or once no
        renewal was answered for `give_up_after_s` (default and minimum: the TTL).

        The renewals run in a thread of their own (`BlockingLeaseRenewer`): a leader
        whose event loop is saturated keeps its lease as long as the process lives."""
        if not self.lease:
            raise LeaseLost("no lease held: campaign first")
        give_up_s = max(float(self.ttl_s), give_up_after_s or 0.0)
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[str] = loop.create_future()
        stopping = threading.Event()

        def report(why: str) -> None:
            def settle() -> None:
                if not lost.done():
                    lost.set_result(why)

            loop.call_soon_threadsafe(settle)

        keeper = threading.Thread(
            target=self._renew,
            args=(self.lease, give_up_s, stopping, report),
            name="lease-keeper",
            daemon=True,
        )
        keeper.start()
        try:
            why = await lost
        finally:
            stopping.set()
        self._lose(why)

    def _renew(
        self,
        lease: int,
        give_up_s: float,
        stopping: threading.Event,
        report: Callable[[str], None],
    ) -> None:
        """The keeper thread: renew every third of the TTL until stopped or lost."""
        interval_s = self.ttl_s / 3
        renewer = BlockingLeaseRenewer(
            self.session.endpoints, timeout_s=interval_s, credentials=self.session.credentials
        )
        uncertain = False
        try:
            while not stopping.wait(interval_s):
                sent_at = time.monotonic()
                try:
                    remaining = renewer.keep_alive(lease)
                except CoordinationUnavailable as error:
                    unanswered_s = time.monotonic() - self._renewed_at
                    if unanswered_s >= give_up_s:
                        report(f"no keep-alive answered for {unanswered_s:.1f} s: {error}")
                        return
                    if unanswered_s >= self.ttl_s and not uncertain:
                        uncertain = True
                        self.uncertain_spells += 1
                        log.warning(
                            "leadership.uncertain",
                            key=self.key.decode(),
                            term=self.term,
                            unanswered_s=round(unanswered_s, 2),
                            give_up_s=give_up_s,
                            error=str(error),
                        )
                    continue
                if remaining <= 0:
                    report("etcd says the lease is gone")
                    return
                # Counted from when the keep-alive was sent: etcd renewed it no earlier.
                self._renewed_at = sent_at
                if uncertain:
                    uncertain = False
                    log.info("leadership.certain_again", key=self.key.decode(), term=self.term)
        finally:
            renewer.close()

    def _lose(self, why: str) -> None:
        self.lost.set()
        log.warning("leadership.lost", key=self.key.decode(), term=self.term, why=why)
        raise LeaseLost(f"{self.key.decode()} term {self.term}: {why}")

    async def resign(self) -> None:
        """Give the key up at once (a graceful stop): the next campaign wins without
        waiting for the lease to expire."""
        if self.lease:
            with contextlib.suppress(CoordinationUnavailable):
                await self.session.revoke_lease(self.lease)
            self.lease = 0
