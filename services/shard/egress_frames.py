"""Durable egress encoded once, shared by every subscriber.

The persister, the bridge and each gateway follow the same records with
different kind filters. Each record's items are turned into protobuf once, and
kept as ready wire frames of `ShardEgressBatch.items` (field 1, length-delimited):
a subscriber's message is then the concatenation of the frames it selects, with
no per-subscriber protobuf work. A small cache keeps the frames of recent records,
since subscribers read the same records within a few loop turns of each other.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from services.runtime.egress_feed import EgressRecord
from services.shard.core.codec import egress_to_protobufs

ITEMS_FIELD_TAG = b"\x0a"  # ShardEgressBatch.items: field 1, wire type 2
THROUGH_POSITION_TAG = b"\x10"  # ShardEgressBatch.through_position: field 2, varint
CACHED_RECORDS = 1_024

# (log position, egress kind, the user of an order update (else 0), framed bytes)
Frame = tuple[int, str, int, bytes]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def through_position_frame(position: int) -> bytes:
    """`ShardEgressBatch.through_position`, to close a message of item frames."""
    return THROUGH_POSITION_TAG + _varint(position)


def frames_of(record: EgressRecord[Any]) -> list[Frame]:
    frames: list[Frame] = []
    time_ms = record.consensus_time_ms
    for position, item in record.items:
        for message in egress_to_protobufs(item, position, time_ms):
            data = message.SerializeToString()
            kind = message.WhichOneof("egress") or ""
            user_id = message.order_update.user_id if kind == "order_update" else 0
            frames.append((position, kind, user_id, ITEMS_FIELD_TAG + _varint(len(data)) + data))
    return frames


class EgressFrames:
    def __init__(self, capacity: int = CACHED_RECORDS) -> None:
        self.capacity = capacity
        self._cache: OrderedDict[int, list[Frame]] = OrderedDict()
        self.encoded = 0
        self.reused = 0

    def of(self, record: EgressRecord[Any]) -> list[Frame]:
        if not record.items:
            return []
        key = record.items[0][0]
        frames = self._cache.get(key)
        if frames is not None:
            self.reused += 1
            return frames
        frames = frames_of(record)
        self.encoded += 1
        self._cache[key] = frames
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return frames
