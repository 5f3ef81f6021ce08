"""The etcd client of our own (stubs generated from etcd's protos) against a real etcd:
watches from a revision, compaction reported as an error and never skipped, leases,
the member list, and the stripped protos kept equal to etcd's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from services.coordination.errors import RevisionCompacted
from services.coordination.etcd_session import EtcdSession, WatchEvent, prefix_end

pytestmark = [pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[2]


def _prefix() -> bytes:
    return f"/test/etcd-client/{uuid.uuid4().hex}/".encode()


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        (b"/oms/v1/m/", b"/oms/v1/m0"),
        (b"a", b"b"),
        (b"a\xff", b"b"),
        (b"a\xff\xff", b"b"),
        (b"\xff", b"\0"),
        (b"", b"\0"),
    ],
)
def test_prefix_end_follows_etcds_rule(prefix: bytes, end: bytes) -> None:
    assert prefix_end(prefix) == end


def test_the_stripped_protos_are_what_etcds_own_give() -> None:
    """`protos/etcd/*/` are generated from `upstream/` by the script: never edited."""
    script = ROOT / "protos" / "etcd" / "strip_options.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def _next_events(
    events: AsyncGenerator[WatchEvent, None], count: int, *, timeout_s: float = 10.0
) -> list[WatchEvent]:
    found: list[WatchEvent] = []
    async with asyncio.timeout(timeout_s):
        while len(found) < count:
            found.append(await events.__anext__())
    return found


async def test_a_watch_from_a_revision_sees_every_change_after_it_in_order(
    etcd_endpoint: str,
) -> None:
    prefix = _prefix()
    async with EtcdSession((etcd_endpoint,)) as session:
        await session.put(prefix + b"a", b"1")
        start = session.revision + 1
        await session.put(prefix + b"b", b"2")
        await session.transaction((), puts=((prefix + b"c", b"3"), (prefix + b"a", b"4")))
        await session.delete(prefix + b"b")
        events = session.watch(prefix, prefix_end(prefix), from_revision=start)
        try:
            seen = await _next_events(events, 4)
        finally:
            await events.aclose()
    assert [(event.kind, event.entry.key, event.entry.value) for event in seen] == [
        ("put", prefix + b"b", b"2"),
        ("put", prefix + b"c", b"3"),
        ("put", prefix + b"a", b"4"),
        ("delete", prefix + b"b", b""),
    ]
    # One transaction, one revision; each change later than the one before.
    assert seen[1].entry.mod_revision == seen[2].entry.mod_revision
    assert seen[0].entry.mod_revision < seen[1].entry.mod_revision < seen[3].entry.mod_revision


async def test_a_watch_from_a_compacted_revision_is_an_error_never_a_skip(
    etcd_endpoint: str,
) -> None:
    prefix = _prefix()
    async with EtcdSession((etcd_endpoint,)) as session:
        await session.put(prefix + b"a", b"1")
        old = session.revision
        await session.put(prefix + b"a", b"2")
        await session.put(prefix + b"a", b"3")
        compacted_to = session.revision
        await session.compact(compacted_to)
        with pytest.raises(RevisionCompacted) as raised:
            async for _ in session.watch(prefix, prefix_end(prefix), from_revision=old):
                pytest.fail("a watch from compacted history yielded an event")
        assert raised.value.compacted_revision == compacted_to
        # From the compaction's revision on, the history is there again.
        events = session.watch(prefix, prefix_end(prefix), from_revision=compacted_to)
        try:
            (latest,) = await _next_events(events, 1)
        finally:
            await events.aclose()
        assert latest.entry.value == b"3"


async def test_a_watch_cancelled_at_any_moment_ends(etcd_endpoint: str) -> None:
    """A follower that wins an election cancels its watch; the watch must end.

    Python 3.11's `asyncio.wait_for` returns the answer and drops the cancellation
    when both land in one turn of the loop (fixed in 3.12), so a watch cancelled as
    etcd confirmed it went on waiting for events and a stopping replica waited for
    it forever. Here the cancel lands at each turn of the loop in turn, across the
    moment etcd's confirmation arrives. (`asyncio.wait_for` is banned by ruff.)
    """
    prefix = _prefix()

    async def watch_forever(session: EtcdSession, from_revision: int) -> None:
        async for _ in session.watch(prefix, prefix_end(prefix), from_revision=from_revision):
            pass

    async with EtcdSession((etcd_endpoint,)) as session:
        await session.put(prefix + b"a", b"1")
        written = session.revision  # other tests compact: never watch from older history
        for turns in range(CANCEL_TURNS):
            watching = asyncio.create_task(watch_forever(session, written))
            for _ in range(turns):
                await asyncio.sleep(0)
            watching.cancel()
            done, _ = await asyncio.wait({watching}, timeout=2.0)
            assert done, f"a watch cancelled after {turns} turns of the loop still runs"
            assert watching.cancelled()


CANCEL_TURNS = 400


async def test_a_lease_is_kept_alive_then_revoked_with_its_keys_and_revoking_again_is_quiet(
    etcd_endpoint: str,
) -> None:
    prefix = _prefix()
    async with EtcdSession((etcd_endpoint,)) as session:
        lease = await session.grant_lease(30)
        created, entry = await session.create(prefix + b"leader", b"me", lease=lease)
        assert created and entry is not None and entry.lease == lease
        assert 0 < await session.keep_alive(lease) <= 30
        await session.revoke_lease(lease)
        assert await session.get(prefix + b"leader") is None
        assert await session.keep_alive(lease) <= 0
        await session.revoke_lease(lease)  # already gone: nothing to do, no error


async def test_the_member_list_and_status_describe_the_cluster(etcd_endpoint: str) -> None:
    async with EtcdSession((etcd_endpoint,)) as session:
        members = await session.members()
        storage = await session.storage()
    assert members, "etcd listed no member"
    assert any(url.endswith(etcd_endpoint) for member in members for url in member.client_urls)
    assert all(member.name and member.member_id for member in members)
    assert storage.revision >= 1 and storage.db_size_bytes >= storage.db_size_in_use_bytes > 0
