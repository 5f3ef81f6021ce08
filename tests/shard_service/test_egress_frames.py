"""Egress encoded once as wire frames reads back exactly as the protobuf encoding of it."""

from __future__ import annotations

from protos.oms.v1 import shard_pb2
from services.runtime.egress_feed import EgressRecord
from services.shard.core.codec import encode_egress_batch
from services.shard.egress_frames import EgressFrames
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
    parsed = shard_pb2.ShardEgressBatch.FromString(b"".join(frame for _, _, _, frame in first))
    assert parsed == encode_egress_batch(egress, 7, 7)
    kinds = [kind for _, kind, _, _ in first]
    assert kinds == [item.WhichOneof("egress") for item in parsed.items]
    # An order update names its user (a gateway's subscription filters on it).
    users = [user for _, kind, user, _ in first if kind == "order_update"]
    assert users and set(users) == {1}
    assert {user for _, kind, user, _ in first if kind != "order_update"} == {0}
