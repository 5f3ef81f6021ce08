"""Egress encoded once as wire frames reads back exactly as the protobuf encoding of it."""

from __future__ import annotations

from protos.oms.v1 import shard_pb2
from services.runtime.egress_feed import EgressRecord
from services.shard.core.codec import encode_egress_batch
from services.shard.egress_frames import EgressBatchView, EgressFrames, EgressSelection
from tests.shard.support import ShardDriver


def test_concatenated_frames_are_the_batch_and_are_encoded_once() -> None:
    driver = ShardDriver()
    egress = driver.run(driver.hydrate(1), driver.deposit(1, "USDT", 10**12))
    egress += driver.run(driver.place(1, "a", price_ticks=100, quantity_lots=3))
    assert len(egress) > 3
    record: EgressRecord[object] = EgressRecord(7, 7, 7, [(7, item) for item in egress])
    frames = EgressFrames()
    first = frames.of(record)
    assert frames.of(record) is first and (frames.encoded, frames.reused) == (1, 1)
    parsed = shard_pb2.ShardEgressBatch.FromString(b"".join(piece.frame for piece in first))
    assert parsed == encode_egress_batch(egress, 7, 7)
    kinds = [piece.kind for piece in first]
    assert kinds == [item.WhichOneof("egress") for item in parsed.items]
    # An order update names its user (a gateway's subscription filters on it).
    users = [piece.user_id for piece in first if piece.kind == "order_update"]
    assert users and set(users) == {1}
    assert {piece.user_id for piece in first if piece.kind != "order_update"} == {0}
    # In-process, the same items as messages, with no frame made for them.
    selection = EgressSelection(
        EgressFrames(),
        from_position=1,
        kinds=frozenset(),
        order_update_users=frozenset(),
        urgent_kinds=frozenset(),
        with_through=True,
        in_process=True,
    )
    assert selection.add([record]) == []
    view = selection.message()
    assert isinstance(view, EgressBatchView) and view.through_position == 7
    assert list(view.items) == list(parsed.items)


def test_the_cache_is_bounded_by_pieces_as_well_as_records() -> None:
    driver = ShardDriver()
    egress = driver.run(driver.hydrate(1), driver.deposit(1, "USDT", 10**12))
    egress += driver.run(driver.place(1, "a", price_ticks=100, quantity_lots=3))
    frames = EgressFrames(capacity=100, capacity_pieces=2 * len(egress))
    records: list[EgressRecord[object]] = [
        EgressRecord(position, position, 7, [(position, item) for item in egress])
        for position in range(1, 5)
    ]
    for record in records:
        frames.of(record)
    # Two records' pieces fit: the two oldest were dropped, and are encoded again.
    assert frames.of(records[3]) is frames.of(records[3]) and frames.encoded == 4
    frames.of(records[0])
    assert frames.encoded == 5
    # A record larger than the bound alone is still kept (its subscribers read it next).
    alone = EgressFrames(capacity=100, capacity_pieces=1)
    assert alone.of(records[0]) is alone.of(records[0])
