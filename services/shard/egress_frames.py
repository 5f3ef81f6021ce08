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
EGRESS_PER_MESSAGE = 2_000  # items; a message this long may be cut between positions

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


class EgressSelection:
    """What one subscriber takes of the durable egress, gathered into messages.

    Records are added as they become durable; `message()` takes what was gathered:
    the selected frames and, for a subscriber that asks, the position the log is
    covered through. A message never splits one position's items (a subscriber
    treats every position in a message as complete); past `EGRESS_PER_MESSAGE`
    items `add` hands back full messages at once.
    """

    def __init__(
        self,
        frames: EgressFrames,
        *,
        from_position: int,
        kinds: frozenset[str],
        order_update_users: frozenset[int],
        urgent_kinds: frozenset[str],
        with_through: bool,
    ) -> None:
        self.frames = frames
        self.from_position = from_position
        self.kinds = kinds
        self.users = order_update_users
        self.urgent_kinds = urgent_kinds
        self.with_through = with_through
        self.urgent = False  # what is gathered holds an urgent kind
        self._chunk: list[bytes] = []
        self._through = 0  # the log's position the gathered records reach
        self._through_sent = 0

    def has_message(self) -> bool:
        return bool(self._chunk) or (self.with_through and self._through > self._through_sent)

    def add(self, records: list[EgressRecord[Any]]) -> list[bytes]:
        """Gather `records`; the full messages they made, to send now."""
        full: list[bytes] = []
        previous = 0
        kinds, users, urgent_kinds = self.kinds, self.users, self.urgent_kinds
        chunk = self._chunk
        for record in records:
            for position, kind, user_id, frame in self.frames.of(record):
                if position < self.from_position:
                    continue  # a resume inside a multi-entry record: delivered
                # Split only between positions' items, never inside one position.
                if position != previous and len(chunk) >= EGRESS_PER_MESSAGE:
                    full.append(b"".join(chunk))
                    chunk.clear()
                previous = position
                if (not kinds or kind in kinds) and (
                    not users or kind != "order_update" or user_id in users
                ):
                    chunk.append(frame)
                    if kind in urgent_kinds:
                        self.urgent = True
        if records:
            self._through = records[-1].last_position
        return full

    def message(self) -> bytes:
        """What is gathered, as one `ShardEgressBatch`; gathering starts again."""
        parts = self._chunk
        if self.with_through:
            parts.append(through_position_frame(self._through))
            self._through_sent = self._through
        message = b"".join(parts)
        self._chunk = []
        self.urgent = False
        return message
