"""A leader key's holder over an etcd of its own that goes away and comes back.

etcd is SIGKILLed and restarted on its folder and ports (a crash, as when a member
dies and etcd elects another leader): the lease survives on etcd's side, since a new
etcd leader extends every lease, and the next answered keep-alive proves it.

- A holder allowed to wait (`give_up_after_s`) is uncertain while etcd is away
  (`certain()` false, so its host stops serving), certain again once etcd answers,
  with the same term; the key never changed hands.
- A holder with the default (the TTL) gives up once a TTL passes unanswered.
- Whatever it may wait, a holder whose lease etcd says is gone gives up at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.coordination.errors import LeaseLost
from services.coordination.etcd_session import EtcdSession
from services.coordination.leadership import Leadership, current_leader
from services.infra.embedded_etcd import EmbeddedEtcd

pytestmark = [pytest.mark.timeout(60)]
TTL_S = 1
KEY = b"/test/leadership/leader"
POLL_S = 0.02


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    # With fsync, as in production: these tests SIGKILL etcd and expect what it
    # acknowledged (the leader key) to be there after its restart. Without it, a kill
    # lost the key while its lease (an earlier entry) survived (a fresh-clone run, 2026-12-02).
    with EmbeddedEtcd(tmp_path / "etcd") as server:
        yield server


async def _until(condition: object, timeout_s: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(POLL_S)


async def test_a_holder_allowed_to_wait_rides_out_an_etcd_restart_with_its_term(
    etcd: EmbeddedEtcd,
) -> None:
    async with EtcdSession((etcd.endpoint,)) as session:
        leadership = Leadership(session, KEY, "holder-a", ttl_s=TTL_S)
        term = await leadership.campaign()
        holding = asyncio.create_task(leadership.hold(give_up_after_s=30 * TTL_S))
        try:
            assert leadership.certain()
            await asyncio.to_thread(etcd.kill)
            await _until(lambda: not leadership.certain(), 3 * TTL_S, "still certain")
            # Uncertain: no renewal answered for a TTL, so etcd was away that long; the
            # keeper counts the spell on its next unanswered renewal.
            await _until(lambda: leadership.uncertain_spells == 1, 2 * TTL_S, "not counted")
            await asyncio.to_thread(etcd.start)
            await _until(leadership.certain, 10 * TTL_S, "never certain again")
            assert not holding.done()
            record = await current_leader(session, KEY)
            assert record is not None and (record.holder, record.term) == ("holder-a", term)
            assert leadership.term == term
        finally:
            holding.cancel()
            await leadership.resign()


async def test_a_holder_gives_up_after_a_ttl_unanswered_by_default(etcd: EmbeddedEtcd) -> None:
    async with EtcdSession((etcd.endpoint,)) as session:
        leadership = Leadership(session, KEY, "holder-b", ttl_s=TTL_S)
        await leadership.campaign()
        holding = asyncio.create_task(leadership.hold())
        try:
            await asyncio.to_thread(etcd.kill)
            with pytest.raises(LeaseLost, match="no keep-alive answered"):
                async with asyncio.timeout(5 * TTL_S):
                    await holding
            assert not leadership.certain()
        finally:
            holding.cancel()
            await asyncio.to_thread(etcd.start)
            await leadership.resign()


async def test_a_lease_etcd_says_is_gone_ends_the_hold_whatever_it_may_wait(
    etcd: EmbeddedEtcd,
) -> None:
    async with EtcdSession((etcd.endpoint,)) as session:
        leadership = Leadership(session, KEY, "holder-c", ttl_s=TTL_S)
        await leadership.campaign()
        holding = asyncio.create_task(leadership.hold(give_up_after_s=30 * TTL_S))
        try:
            await session.revoke_lease(leadership.lease)  # as if it had expired
            with pytest.raises(LeaseLost, match="lease is gone"):
                async with asyncio.timeout(5 * TTL_S):
                    await holding
            assert not leadership.certain()
            assert await current_leader(session, KEY) is None
        finally:
            holding.cancel()
