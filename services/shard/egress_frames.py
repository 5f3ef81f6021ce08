"""Durable egress encoded once, shared by every subscriber.

The persister, the bridge and each gateway follow the same records with
different kind filters. Each record's items are turned into protobuf messages
once (`EgressPiece`), and a piece's wire frame (`ShardEgressBatch.items`, field 1,
length-delimited) is made the first time a subscriber over gRPC needs it: a
subscriber's message is then the concatenation of the frames it selects, with no
per-subscriber protobuf work. A subscriber in the same process (a co-located
persister or bridge) takes the messages themselves (`EgressBatchView`): no frame is
made for it and nothing is parsed again. A small cache keeps the pieces of recent
records, since subscribers read the same records within a few loop turns of each
other; the messages are shared, so subscribers only read them. The cache is bounded
by pieces as well as records: at a high rate a record holds thousands of items, and
1,024 such records once held gigabytes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from services.runtime.egress_feed import EgressRecord
from services.shard.core.codec import egress_to_protobufs
from services.shard.settlement_traces import SettlementTraces

ITEMS_FIELD_TAG = b"\x0a"  # ShardEgressBatch.items: field 1, wire type 2
THROUGH_POSITION_TAG = b"\x10"  # ShardEgressBatch.through_position: field 2, varint
CACHED_RECORDS = 1_024
CACHED_PIECES = 100_000  # however few records that is (the newest is always kept)
EGRESS_PER_MESSAGE = 2_000  # items; a message this long may be cut between positions


class EgressPiece:
    """One egress item of one log position, as a message; its wire frame on demand."""

    __slots__ = ("_frame", "kind", "message", "position", "user_id")

    def __init__(self, position: int, kind: str, user_id: int, message: Any) -> None:
        self.position = position
        self.kind = kind
        self.user_id = user_id  # of an order update, else 0
        self.message = message  # a shard_pb2.ShardEgress, read-only once made
        self._frame: bytes | None = None

    @property
    def frame(self) -> bytes:
        frame = self._frame
        if frame is None:
            data = self.message.SerializeToString()
            frame = self._frame = ITEMS_FIELD_TAG + _varint(len(data)) + data
        return frame


class EgressBatchView:
    """What an in-process subscriber receives: `ShardEgressBatch`'s two fields, the
    items being the shared messages themselves."""

    __slots__ = ("items", "through_position")

    def __init__(self, items: list[Any], through_position: int) -> None:
        self.items = items
        self.through_position = through_position


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


def frames_of(
    record: EgressRecord[Any], traces: SettlementTraces | None = None
) -> list[EgressPiece]:
    """`record`'s egress as pieces; with `traces` (tracing on), a sampled order's fills
    and updates carry its trace (`settlement_traces`)."""
    pieces: list[EgressPiece] = []
    time_ms = record.consensus_time_ms
    for position, item in record.items:
        for message in egress_to_protobufs(item, position, time_ms):
            kind = message.WhichOneof("egress") or ""
            user_id = message.order_update.user_id if kind == "order_update" else 0
            pieces.append(EgressPiece(position, kind, user_id, message))
    if traces is not None:
        traces.mark([piece.message for piece in pieces], time_ms)
    return pieces


class EgressFrames:
    def __init__(
        self,
        capacity: int = CACHED_RECORDS,
        traces: SettlementTraces | None = None,
        *,
        capacity_pieces: int = CACHED_PIECES,
    ) -> None:
        self.capacity = capacity
        self.capacity_pieces = capacity_pieces
        self.traces = traces
        self._cache: OrderedDict[int, list[EgressPiece]] = OrderedDict()
        self._pieces = 0  # in the cache
        self.encoded = 0
        self.reused = 0

    def of(self, record: EgressRecord[Any]) -> list[EgressPiece]:
        if not record.items:
            return []
        key = record.items[0][0]
        frames = self._cache.get(key)
        if frames is not None:
            self.reused += 1
            return frames
        frames = frames_of(record, self.traces)
        self.encoded += 1
        cache = self._cache
        cache[key] = frames
        self._pieces += len(frames)
        while len(cache) > 1 and (
            len(cache) > self.capacity or self._pieces > self.capacity_pieces
        ):
            self._pieces -= len(cache.popitem(last=False)[1])
        return frames


class EgressSelection:
    """What one subscriber takes of the durable egress, gathered into messages.

    Records are added as they become durable; `message()` takes what was gathered:
    the selected frames and, for a subscriber that asks, the position the log is
    covered through (`view()` the same as messages, for a subscriber in-process). A
    message never splits one position's items (a subscriber treats every position in
    a message as complete); past `EGRESS_PER_MESSAGE` items `add` hands back full
    messages at once.
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
        in_process: bool = False,
    ) -> None:
        self.frames = frames
        self.from_position = from_position
        self.kinds = kinds
        self.users = order_update_users
        self.urgent_kinds = urgent_kinds
        self.with_through = with_through
        self.in_process = in_process
        self.urgent = False  # what is gathered holds an urgent kind
        self._chunk: list[EgressPiece] = []
        self._through = 0  # the log's position the gathered records reach
        self._through_sent = 0

    def has_message(self) -> bool:
        return bool(self._chunk) or (self.with_through and self._through > self._through_sent)

    def add(self, records: list[EgressRecord[Any]]) -> list[bytes | EgressBatchView]:
        """Gather `records`; the full messages they made, to send now."""
        full: list[bytes | EgressBatchView] = []
        previous = 0
        kinds, users, urgent_kinds = self.kinds, self.users, self.urgent_kinds
        for record in records:
            for piece in self.frames.of(record):
                position = piece.position
                if position < self.from_position:
                    continue  # a resume inside a multi-entry record: delivered
                # Split only between positions' items, never inside one position.
                if position != previous and len(self._chunk) >= EGRESS_PER_MESSAGE:
                    full.append(self._take(with_through=False))
                previous = position
                kind = piece.kind
                if (not kinds or kind in kinds) and (
                    not users or kind != "order_update" or piece.user_id in users
                ):
                    self._chunk.append(piece)
                    if kind in urgent_kinds:
                        self.urgent = True
        if records:
            self._through = records[-1].last_position
        return full

    def message(self) -> bytes | EgressBatchView:
        """What is gathered, as one `ShardEgressBatch` (its wire bytes, or a view of it
        in-process); gathering starts again."""
        return self._take(with_through=self.with_through)

    def _take(self, *, with_through: bool) -> bytes | EgressBatchView:
        pieces, self._chunk = self._chunk, []
        self.urgent = False
        through = 0
        if with_through:
            through = self._through_sent = self._through
        if self.in_process:
            return EgressBatchView([piece.message for piece in pieces], through)
        parts = [piece.frame for piece in pieces]
        if with_through:
            parts.append(through_position_frame(through))
        return b"".join(parts)
