"""The market feed as replicated state: replicas fed the same entries publish the same and
hash alike; a snapshot restored goes on publishing exactly as the original; activating
version 2 at a VERSION entry starts the feed there on every replica; and a version-1
engine's state hash and snapshot bytes are what they were before the feed existed."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.matcher.core import MatcherEgress, MatcherMachine, SnapshotFormatError
from services.matcher.core import versions as matcher_versions
from services.matcher.core.snapshot_codec import MAGIC
from services.runtime.core.log_batch import LogBatch, encode_checkpoint, encode_version
from services.runtime.core.replica import Replica
from services.runtime.core.state_machine import EntryKind
from tests.matcher import support
from tests.matcher.feed_support import SYMBOLS, Entry, FeedDriver, FeedStream, Subscriber
from tests.matcher.support import Driver
from tests.matcher.test_contract import feed, random_commands
from tests.matcher.test_differential import DataChooser, RandomChooser

# A version-1 engine after `random_commands(seed, 500)`: its state hash and the SHA-256 of
# its snapshot, as the code before the market feed (commit 9cd937b) computed them.
V1_GOLDEN = {
    (11, 300): (
        "a0a533f46169495bffd9708088e87f78",
        "e7a51989d0e3f5414f2937f959d47de9234dd96c1ff9d6e0b6a773797199cf0d",
    ),
    (12, 5_000): (
        "03a968c69a0463b0da294ff5366e6f4b",
        "08ef1e17b66df28e081d1342d3129d7bb79563b48f127b0b89e98edb3aa2690a",
    ),
}


def test_version_2_is_implemented() -> None:
    assert {1, 2} <= matcher_versions.IMPLEMENTED_VERSIONS


@pytest.mark.parametrize(("seed", "horizon_ms"), sorted(V1_GOLDEN))
def test_a_version_1_engine_hashes_and_snapshots_as_before_the_feed(
    seed: int, horizon_ms: int
) -> None:
    driver = Driver.create(dedup_horizon_ms=horizon_ms)
    feed(driver, random_commands(seed=seed, batches=500))
    data = driver.machine.snapshot()
    assert (driver.machine.state_hash().hex(), hashlib.sha256(data).hexdigest()) == V1_GOLDEN[
        (seed, horizon_ms)
    ]
    assert struct.unpack_from("<I", data, len(MAGIC))[0] == 2  # the layout before the feed
    restored = MatcherMachine(support.settings(dedup_horizon_ms=horizon_ms))
    restored.restore(data)
    assert restored.engine.feed is None and restored.version == 1
    assert restored.snapshot() == data


def drive_twins(entries: list[Entry], restore_at: set[int], retained: int) -> None:
    """A machine, its twin fed the same entries, and a third restored from the first's
    snapshot at each of `restore_at`: the same egress, hashes and snapshots throughout."""
    overrides = {"dedup_horizon_ms": 60, "retained_market_data_per_symbol": retained}
    first = FeedDriver.create(**overrides)
    twin = FeedDriver.create(**overrides)
    restored: FeedDriver | None = None
    subscriber = Subscriber(first.machine)
    for index, entry in enumerate(entries):
        if index in restore_at:
            restored = FeedDriver(MatcherMachine(support.settings(**overrides)), first.position)
            restored.machine.restore(first.machine.snapshot())
            assert restored.machine.state_hash() == first.machine.state_hash()
            assert restored.machine.snapshot() == first.machine.snapshot()
            assert restored.machine.version == 2
        egress = first.entry(entry)
        subscriber.take(egress)
        for other in (twin, restored):
            if other is None:
                continue
            assert market(other.entry(entry)) == market(egress)
            assert other.machine.state_hash() == first.machine.state_hash()
    for other in (twin, restored):
        if other is not None:
            assert other.machine.snapshot() == first.machine.snapshot()
            for symbol in SYMBOLS:
                engine, mine = other.machine.engine, first.machine.engine
                assert engine.book_snapshot(symbol) == mine.book_snapshot(symbol)
                window = mine.market_feed().symbols[symbol]
                oldest = window.book_sequence + 1 - len(window.updates)
                assert engine.book_updates_from(symbol, oldest) == (
                    mine.book_updates_from(symbol, oldest)
                )
                oldest = window.trade_sequence + 1 - len(window.trades)
                assert engine.trades_from(symbol, oldest) == mine.trades_from(symbol, oldest)


def market(egress: MatcherEgress | None) -> tuple[object, ...]:
    return () if egress is None else egress.market


@settings(max_examples=60, deadline=None)
@given(data=st.data(), retained=st.sampled_from((3, 10_000)))
def test_twins_and_restored_replicas_publish_and_hash_alike(
    data: st.DataObject, retained: int
) -> None:
    stream = FeedStream(DataChooser(data))
    entries = stream.entries(data.draw(st.integers(1, 40)))
    restore_at = set(data.draw(st.lists(st.integers(0, len(entries) - 1), max_size=3)))
    drive_twins(entries, restore_at, retained)


@pytest.mark.parametrize("seed", range(3))
def test_long_flows_restored_mid_way_publish_and_hash_alike(seed: int) -> None:
    entries = FeedStream(RandomChooser(random.Random(100 + seed))).entries(500)
    drive_twins(entries, {50, 200, 420}, (5, 10_000, 40)[seed])


def test_the_state_hash_covers_the_feed() -> None:
    entries = random_commands(seed=3, batches=60)
    early, late = FeedDriver.create(), FeedDriver.create(version=1)
    for item in entries[:30]:
        early.entry(item)
        late.entry(item)
    late.machine.activate_version(2)
    assert early.machine.state_hash() != late.machine.state_hash()  # other sequences
    twin = FeedDriver.create()
    for item in entries[:30]:
        twin.entry(item)
    assert twin.machine.state_hash() == early.machine.state_hash()
    symbol_feed = twin.machine.engine.market_feed().symbols[SYMBOLS[0]]
    assert symbol_feed.book_sequence > 0
    symbol_feed.digest = bytes(len(symbol_feed.digest))  # same counts, other content
    assert twin.machine.state_hash() != early.machine.state_hash()


def test_a_feed_snapshot_that_breaks_its_rules_is_refused_and_changes_nothing() -> None:
    source = FeedDriver.create()
    for item in random_commands(seed=4, batches=120):
        source.entry(item)
    data = source.machine.snapshot()
    assert struct.unpack_from("<I", data, len(MAGIC))[0] == 3
    target = FeedDriver.create()
    target.entry((1_000, [support.limit("s1:1:1", 1, support.SELL, 101, 3)]))
    hash_before = target.machine.state_hash()
    version_1 = Driver.create().machine.snapshot()
    for blob in (
        data[:-1],
        data + b"\x00",
        data[: len(data) // 2],
        # a version-1 machine's bytes labelled as layout 3: no feed where one must be
        version_1[: len(MAGIC)] + struct.pack("<I", 3) + version_1[len(MAGIC) + 4 :],
    ):
        with pytest.raises(SnapshotFormatError):
            target.machine.restore(blob)
        assert target.machine.state_hash() == hash_before
    target.machine.restore(data)
    assert target.machine.state_hash() == source.machine.state_hash()


INTERVAL = 5  # a checkpoint every 5 entries


def test_a_version_entry_starts_the_feed_at_the_same_position_on_every_replica() -> None:
    """Leader and follower apply one log whose VERSION entry switches to 2 mid-way; their
    checkpoints agree, the feed begins at sequence 1 right after the switch, and a replica
    restored from a snapshot taken after it agrees to the end."""
    machines = [MatcherMachine(support.settings(dedup_horizon_ms=150)) for _ in range(2)]
    leader, follower = (Replica(machine, INTERVAL) for machine in machines)
    late: Replica[MatcherEgress] | None = None
    entries = random_commands(seed=21, batches=300)
    position = 1
    switched_at: int | None = None
    firsts: dict[str, int] = {}
    for index, (now, commands) in enumerate(entries):
        record: list[tuple[int, bytes]] = []
        if index == 120:
            record.append((int(EntryKind.VERSION), encode_version(2)))
            switched_at = position
        if commands is None:
            record.append((int(EntryKind.TIMER), b""))
        else:
            record.append((int(EntryKind.COMMAND), support.batch_bytes(commands)))
        latest = leader.latest_hash
        if latest is not None and index % 3 == 0:
            record.append((int(EntryKind.CHECKPOINT), encode_checkpoint(*latest)))
        batch = LogBatch(position, now, record)
        position += len(record)
        outputs = leader.apply_batch(batch)
        assert [list(entry) for entry in follower.apply_batch(batch)] == [
            list(entry) for entry in outputs
        ]
        if late is not None:
            late.apply_batch(batch)
        for egress in (item for entry in outputs for item in entry):
            assert switched_at is not None or egress.market == ()
            for update in egress.book_updates():
                firsts.setdefault(update.symbol, update.book_sequence)
        if index == 200:
            late = Replica(MatcherMachine(support.settings(dedup_horizon_ms=150)), INTERVAL)
            late.restore(leader.machine.snapshot(), leader.applied_position, now)
    assert switched_at is not None and late is not None
    assert firsts == dict.fromkeys(SYMBOLS, 1)
    assert follower.checkpoints_verified > 20 and late.checkpoints_verified > 5
    for replica in (follower, late):
        assert replica.machine.version == 2
        assert replica.machine.state_hash() == leader.machine.state_hash()
        assert replica.machine.snapshot() == leader.machine.snapshot()
